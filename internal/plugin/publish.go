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
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// ValidateEventType checks that eventType can be published (records.ValidateEventType).
func ValidateEventType(eventType string) error { return records.ValidateEventType(eventType) }

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
	// via is nats (a JetStream publish) or http (a POST to the operator's ingress).
	via          string
	ingressURL   string
	ingressToken string
	ingressCA    string
	// ingressAudience is the audience of the token requested for the ingress.
	ingressAudience string
	// ingressAPIToken sends the kubeconfig's own token when no token of the ingress's
	// audience can be had; ingressPlaintext sends a token over http://.
	ingressAPIToken  bool
	ingressPlaintext bool
	// ingressProxy is a proxy to reach the ingress through (none by default).
	ingressProxy string
}

// Ways publish reaches the events stream.
const (
	ViaNATS = "nats"
	ViaHTTP = "http"
)

func newPublishCommand(o *Options) *cobra.Command {
	p := &publishOptions{}
	cmd := &cobra.Command{
		Use:   "publish <event-type> --data @file.json|-|'<json>'",
		Short: "Publish an event into the namespace's events subject, as a producer would",
		Long: `Publish an event on webhooks.<namespace>.<event-type>. Every endpoint of the namespace whose
eventTypes match receives it. The event id (--id, else a generated evt_...) is the
Nats-Msg-Id, so publishing the same id twice within the de-duplication window stores one
event; receivers see it as webhook-id.

--via http publishes through the operator's ingress (webhook-operator ingress) instead of
NATS: POST <ingress>/v1/namespaces/<namespace>/events with a bearer token, which the
ingress checks with a TokenReview (of its audience, ingress.webhook-operator.io by default)
and a SubjectAccessReview (create on webhookevents). The ingress URL is --ingress-url, else
$WEBHOOK_INGRESS_URL, else the key ingress-url of the operator's Secret. The token is
--ingress-token-file, else one of the ingress's audience (--ingress-token-audience, else the
Secret's ingress-token-audience, else ingress.webhook-operator.io) requested for your
kubeconfig's ServiceAccount (TokenRequest), never the token your kubeconfig uses for the API
server unless --ingress-allow-api-audience-tokens says so. A token goes only over https://
unless --ingress-allow-plaintext-tokens says otherwise; no proxy is used unless
--ingress-proxy-url names one, and a redirect is never followed.`,
		Example: `  kubectl webhooks publish order.created --data '{"id":"ord_1","total":42}'
  kubectl webhooks publish order.created --data @order.json --id evt_123
  cat order.json | kubectl webhooks publish order.created --data - --header traceparent=00-...
  kubectl create token my-producer --audience ingress.webhook-operator.io > token
  kubectl webhooks publish order.created --data '{"id":"ord_1"}' --via http --ingress-token-file token --ingress-ca-file ca.crt`,
		Args: cobra.ExactArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error { return p.run(ctx, o, args[0]) }),
	}
	f := cmd.Flags()
	f.StringVarP(&p.data, "data", "d", "", "the event's body: @file, - for standard input, or the JSON itself (required)")
	f.StringVar(&p.id, "id", "", "event id (Nats-Msg-Id); default: a generated evt_... id")
	f.StringVar(&p.contentType, "content-type", "application/json", "Content-Type of the body, forwarded to receivers")
	f.StringArrayVarP(&p.headers, "header", "H", nil, "extra header K=V forwarded to receivers (repeatable; reserved names are refused, the endpoint's own headers win)")
	f.StringVar(&p.via, "via", ViaNATS, "nats: publish on JetStream; http: POST to the operator's ingress")
	f.StringVar(&p.ingressURL, "ingress-url", "", "the ingress's base URL with --via http (default: $"+EnvIngressURL+", else the operator's Secret's ingress-url)")
	f.StringVar(&p.ingressToken, "ingress-token-file", "", "a bearer token for the ingress with --via http (default: one of the ingress's audience requested for your kubeconfig's ServiceAccount)")
	f.StringVar(&p.ingressCA, "ingress-ca-file", "", "PEM CA bundle to trust for an https ingress")
	f.StringVar(&p.ingressAudience, "ingress-token-audience", "", "audience of the token requested for the ingress (default: the operator's Secret's ingress-token-audience, else "+ingress.DefaultAudience+")")
	f.BoolVar(&p.ingressAPIToken, "ingress-allow-api-audience-tokens", false, "send the ingress your kubeconfig's own API-server token when no token of its audience can be requested (it is good against the API server too, for whoever sees it)")
	f.BoolVar(&p.ingressPlaintext, "ingress-allow-plaintext-tokens", false, "send a token to an http:// ingress (anyone on the path can replay it): for a loopback demo only")
	f.StringVar(&p.ingressProxy, "ingress-proxy-url", "", "reach the ingress through this HTTP proxy (default: none, whatever HTTPS_PROXY says)")
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
	switch p.via {
	case ViaNATS:
	case ViaHTTP:
		return p.publishHTTP(ctx, o, ns, eventType, id, msg.Header, body)
	default:
		return usagef("--via %q: want nats or http", p.via)
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
	if err := checkAck(ack, set.EventsStream()); err != nil {
		return err
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

// checkHeader refuses a --header that would not reach receivers as given
// (records.CheckProducerHeader).
func checkHeader(k, v string) error {
	if strings.EqualFold(k, "content-type") {
		return usagef("--header %s: use --content-type", k)
	}
	if err := records.CheckProducerHeader(k, v); err != nil {
		return usagef("--header %s: %v", k, err)
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

// checkAck refuses an acknowledgement that is not of stream: another connection can make
// JetStream answer its own publishes into this connection's inbox (NATS checks no permission
// on a reply subject), and such an answer names its own stream.
func checkAck(ack *jetstream.PubAck, stream string) error {
	if ack == nil || ack.Stream != stream {
		got := ""
		if ack != nil {
			got = ack.Stream
		}
		return fmt.Errorf("the acknowledgement of the publish names stream %q, not %s: it answers another connection's request; whether the message was stored is unknown", got, stream)
	}
	return nil
}
