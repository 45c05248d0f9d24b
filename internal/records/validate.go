package records

import (
	"fmt"
	"strconv"

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
