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
	f.StringArrayVarP(&p.headers, "header", "H", nil, "extra header K=V forwarded to receivers (repeatable)")
	return cmd
}

func (p *publishOptions) run(ctx context.Context, o *Options, eventType string) error {
	if err := ValidateEventType(eventType); err != nil {
		return &Error{Code: ExitUsage, Err: err}
	}
	body, err := p.readData(o.IO.In)
	if err != nil {
		return err
	}
	msg := nats.NewMsg("")
	for _, kv := range p.headers {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return usagef("--header %q: want NAME=VALUE", kv)
		}
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "nats-") || strings.HasPrefix(lk, "whk-") || (strings.HasPrefix(lk, "webhook-") && lk != strings.ToLower(records.HeaderEventTime)) {
			return usagef("--header %s: Nats-*, Whk-* and webhook-* headers belong to JetStream and the operator (use --id for the event id)", k)
		}
		msg.Header.Add(k, v)
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
		return fmt.Errorf("publishing to %s: %w", msg.Subject, err)
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

// readData reads --data: @file, - (standard input) or the literal body.
func (p *publishOptions) readData(stdin io.Reader) ([]byte, error) {
	switch {
	case p.data == "":
		return nil, usagef("--data is required: @file.json, - for standard input, or the JSON itself")
	case p.data == "-" || p.data == "@-":
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("reading standard input: %w", err)
		}
		return b, nil
	case strings.HasPrefix(p.data, "@"):
		b, err := os.ReadFile(p.data[1:])
		if err != nil {
			return nil, usagef("--data %s: %v", p.data, err)
		}
		return b, nil
	default:
		return []byte(p.data), nil
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
