package records

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"golang.org/x/net/http/httpguts"
)

// MaxEventIDLength bounds an event id (it is sent as the webhook-id header).
const MaxEventIDLength = 256

// InvalidEvent says why an event cannot be delivered as published, or "". What a producer
// supplies that is sent as it is, is checked here, at routing time, so a request the
// dispatcher could not build never counts against the receiver: the event id (the webhook-id
// header), the event type (a header), and the Content-Type and trace context headers. Other
// producer headers are forwarded only when valid (ForwardedHeaders), never failing a delivery.
func InvalidEvent(eventID, eventType string, h nats.Header) string {
	if len(eventID) > MaxEventIDLength {
		return fmt.Sprintf("the event id is %d characters; at most %d are allowed", len(eventID), MaxEventIDLength)
	}
	for i := 0; i < len(eventID); i++ {
		if c := eventID[i]; c <= ' ' || c > '~' {
			return "the event id must be printable ASCII without spaces"
		}
	}
	if !httpguts.ValidHeaderFieldValue(eventType) {
		return fmt.Sprintf("the event type %s holds a control character", strconv.Quote(Bound(eventType, 64)))
	}
	for _, k := range []string{HeaderContentType, HeaderTraceParent, HeaderTraceState} {
		if v := h.Get(k); !httpguts.ValidHeaderFieldValue(v) {
			return fmt.Sprintf("the %s header %s holds a control character", k, strconv.Quote(Bound(v, 64)))
		}
	}
	return ""
}

// eventTypeRE is an event type: what an endpoint's eventTypes patterns match, without
// wildcards (the API's EventTypePattern without `*` and `>`).
var eventTypeRE = regexp.MustCompile(`^[A-Za-z0-9_:-]+(\.[A-Za-z0-9_:-]+)*$`)

// MaxEventTypeLength bounds an event type.
const MaxEventTypeLength = 256

// ValidateEventType checks that eventType can be published: dot-separated tokens of letters,
// digits, '-', '_' or ':' (each a NATS subject token), no wildcards, at most 256 characters.
func ValidateEventType(eventType string) error {
	switch {
	case eventType == "":
		return errors.New("the event type is empty")
	case len(eventType) > MaxEventTypeLength:
		return fmt.Errorf("the event type is %d characters long; at most %d are allowed", len(eventType), MaxEventTypeLength)
	case strings.ContainsAny(eventType, "*>"):
		return fmt.Errorf("invalid event type %q: wildcards (* and >) belong in an endpoint's eventTypes, an event has one concrete type such as order.created", eventType)
	case !eventTypeRE.MatchString(eventType):
		return fmt.Errorf("invalid event type %q: an event type is dot-separated tokens of letters, digits, '-', '_' or ':' (e.g. order.created), with no empty tokens or spaces", Bound(eventType, 300))
	}
	return nil
}

// CheckProducerHeader says why a producer header k: v would not reach receivers as given (see
// ForwardedHeaders), or nil. The event time and trace context, which the operator reads
// itself, are accepted; Content-Type, JetStream's and the operator's headers are not.
func CheckProducerHeader(k, v string) error {
	lk := strings.ToLower(k)
	switch {
	case !httpguts.ValidHeaderFieldValue(v):
		return errors.New("the value has a control character (CR, LF, NUL, ...), which no HTTP request can carry")
	case lk == strings.ToLower(HeaderEventTime) || lk == HeaderTraceParent || lk == HeaderTraceState:
		return nil
	case lk == "content-type":
		return errors.New("the content type is the event's own (its datacontenttype), not a header")
	case IsOperatorHeader(k) || strings.HasPrefix(lk, "webhook-") || strings.HasPrefix(lk, "x-webhook-"):
		return errors.New("Nats-*, Whk-*, webhook-* and X-Webhook-* headers belong to JetStream and the operator (the event id is the id, not a header)")
	case strings.HasPrefix(lk, "ce-"):
		return errors.New("ce-* headers are the event's CloudEvents attributes: publish a CloudEvent to set them")
	case !Forwardable(k):
		return errors.New("it is not forwarded to receivers: the dispatcher owns the request's framing (Host, Content-Length, Connection, ...) and User-Agent, and credentials (Authorization, Cookie) belong in the endpoint's headersFrom")
	}
	return nil
}
