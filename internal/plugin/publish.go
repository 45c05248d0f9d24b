package plugin

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/net/http/httpguts"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// eventTypeRE is an event type: what an endpoint's eventTypes patterns match, without
// wildcards (the API's EventTypePattern without `*` and `>`).
var eventTypeRE = regexp.MustCompile(`^[A-Za-z0-9_:-]+(\.[A-Za-z0-9_:-]+)*$`)

// ValidateEventType checks that eventType can be published: dot-separated tokens of letters,
// digits, '-', '_' or ':', no wildcards, at most 256 characters.
func ValidateEventType(eventType string) error {
	switch {
	case eventType == "":
		return errors.New("the event type is empty")
	case len(eventType) > 256:
		return fmt.Errorf("the event type is %d characters long; at most 256 are allowed", len(eventType))
	case strings.ContainsAny(eventType, "*>"):
		return fmt.Errorf("invalid event type %q: wildcards (* and >) belong in an endpoint's eventTypes, an event has one concrete type such as order.created", eventType)
	case !eventTypeRE.MatchString(eventType):
		return fmt.Errorf("invalid event type %q: an event type is dot-separated tokens of letters, digits, '-', '_' or ':' (e.g. order.created), with no empty tokens or spaces", eventType)
	}
	return nil
}

// PublishResult is what publish reports.
type PublishResult struct {
	EventID   string `json:"eventId"`
	EventType string `json:"eventType"`
	Namespace string `json:"namespace"`
	Subject   string `json:"subject"`
	Stream    string `json:"stream"`
	Sequence  uint64 `json:"sequence"`
	// Duplicate is true when JetStream already held an event with this id (within its
	// de-duplication window) and stored nothing new.
	Duplicate bool `json:"duplicate"`
}

type publishOptions struct {
	data        string
	id          string
	contentType string
	headers     []string
}

func newPublishCommand(o *Options) *cobra.Command {
	p := &publishOptions{}
	cmd := &cobra.Command{
		Use:   "publish <event-type> --data @file.json|-|'<json>'",
		Short: "Publish an event into the namespace's events subject, as a producer would",
		Long: `Publish an event on webhooks.<namespace>.<event-type>. Every endpoint of the namespace whose
eventTypes match receives it. The event id (--id, else a generated evt_...) is the
Nats-Msg-Id, so publishing the same id twice within the de-duplication window stores one
event; receivers see it as webhook-id.`,
		Example: `  kubectl webhooks publish order.created --data '{"id":"ord_1","total":42}'
  kubectl webhooks publish order.created --data @order.json --id evt_123
  cat order.json | kubectl webhooks publish order.created --data - --header traceparent=00-...`,
		Args: cobra.ExactArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error { return p.run(ctx, o, args[0]) }),
	}
	f := cmd.Flags()
	f.StringVarP(&p.data, "data", "d", "", "the event's body: @file, - for standard input, or the JSON itself (required)")
	f.StringVar(&p.id, "id", "", "event id (Nats-Msg-Id); default: a generated evt_... id")
	f.StringVar(&p.contentType, "content-type", "application/json", "Content-Type of the body, forwarded to receivers")
	f.StringArrayVarP(&p.headers, "header", "H", nil, "extra header K=V forwarded to receivers (repeatable; reserved names are refused, the endpoint's own headers win)")
	return cmd
}

func (p *publishOptions) run(ctx context.Context, o *Options, eventType string) error {
	if err := ValidateEventType(eventType); err != nil {
		return &Error{Code: ExitUsage, Err: err}
	}
	if p.data == "" {
		return usagef("--data is required: @file.json, - for standard input, or the JSON itself")
	}
	body, err := readBody("--data", p.data, o.IO.In)
	if err != nil {
		return err
	}
	msg := nats.NewMsg("")
	if msg.Header, err = producerHeaders(p.headers); err != nil {
		return err
	}
	if p.contentType != "" {
		msg.Header.Set(records.HeaderContentType, p.contentType)
	}
	if strings.Contains(strings.ToLower(p.contentType), "json") && !json.Valid(body) {
		return usagef("--data is not valid JSON (Content-Type %s); fix it or pass --content-type", p.contentType)
	}
	id := p.id
	if id == "" {
		id = newEventID()
	}
	if strings.TrimSpace(id) != id || id == "" {
		return usagef("--id %q: an event id may not be empty or have surrounding spaces", p.id)
	}
	msg.Header.Set(records.HeaderMsgID, id)
	msg.Data = body

	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	_, js, err := o.JetStream(ctx)
	if err != nil {
		return err
	}
	set := o.Set(ns)
	msg.Subject = set.EventSubject(eventType)
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			return notFoundf("no stream stores %s: namespace %q has no events stream %s (capturing %s); "+
				"webhook-operator creates it with the namespace's first WebhookEndpoint: create one there first (%v)",
				msg.Subject, ns, set.EventsStream(), set.EventsFilter(), err)
		}
		return o.rateRestricted(ctx, ns, fmt.Errorf("publishing to %s: %w", msg.Subject, err))
	}
	res := PublishResult{EventID: id, EventType: eventType, Namespace: ns, Subject: msg.Subject, Stream: ack.Stream, Sequence: ack.Sequence, Duplicate: ack.Duplicate}
	return o.print(res, func(w io.Writer) {
		if res.Duplicate {
			writeLine(w, "event %s was already published (stream %s sequence %d): duplicate, nothing new stored", res.EventID, res.Stream, res.Sequence)
			return
		}
		writeLine(w, "published event %s (%s) to %s: stream %s sequence %d", res.EventID, res.EventType, res.Subject, res.Stream, res.Sequence)
	})
}

// checkHeader refuses a --header that would not reach receivers as given (see
// records.ForwardedHeaders), except the ones the operator reads itself: the event time and
// trace context.
func checkHeader(k, v string) error {
	lk := strings.ToLower(k)
	switch {
	case !httpguts.ValidHeaderFieldValue(v):
		return usagef("--header %s: the value has a control character (CR, LF, NUL, ...), which no HTTP request can carry", k)
	case lk == strings.ToLower(records.HeaderEventTime) || lk == records.HeaderTraceParent || lk == records.HeaderTraceState:
		return nil
	case lk == "content-type":
		return usagef("--header %s: use --content-type", k)
	case strings.HasPrefix(lk, "nats-") || strings.HasPrefix(lk, "whk-") || strings.HasPrefix(lk, "webhook-") || strings.HasPrefix(lk, "x-webhook-"):
		return usagef("--header %s: Nats-*, Whk-*, webhook-* and X-Webhook-* headers belong to JetStream and the operator (use --id for the event id)", k)
	case !records.Forwardable(k):
		return usagef("--header %s is not forwarded to receivers: the dispatcher owns the request's framing (Host, Content-Length, Connection, ...) and User-Agent, and credentials (Authorization, Cookie) belong in the endpoint's headersFrom", k)
	}
	return nil
}

// producerHeaders parses --header NAME=VALUE flags into the headers a producer may set: those
// that reach receivers as given (checkHeader), at most records.MaxForwardedHeaders of them.
func producerHeaders(kvs []string) (nats.Header, error) {
	if len(kvs) > records.MaxForwardedHeaders {
		return nil, usagef("--header: at most %d headers are forwarded to receivers, %d given", records.MaxForwardedHeaders, len(kvs))
	}
	h := nats.Header{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, usagef("--header %q: want NAME=VALUE", kv)
		}
		if err := checkHeader(k, v); err != nil {
			return nil, err
		}
		h.Add(k, v)
	}
	return h, nil
}

// readBody reads a body flag's value: @file, - (standard input) or the literal body.
func readBody(flag, value string, stdin io.Reader) ([]byte, error) {
	switch {
	case value == "-" || value == "@-":
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("reading standard input: %w", err)
		}
		return b, nil
	case strings.HasPrefix(value, "@"):
		b, err := os.ReadFile(value[1:])
		if err != nil {
			return nil, usagef("%s %s: %v", flag, value, err)
		}
		return b, nil
	default:
		return []byte(value), nil
	}
}

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// newEventID is a random evt_ id.
func newEventID() string { return "evt_" + randomToken() }

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return idEncoding.EncodeToString(b)
}
