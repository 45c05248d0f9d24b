package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// EvalResult is what eval reports: the filter's verdict and the transformation's output on a
// sample event.
type EvalResult struct {
	// Endpoint whose expressions were evaluated, with --endpoint.
	Endpoint string `json:"endpoint,omitempty"`
	// PayloadIsJSON is false when the event's body is not JSON (payload is null).
	PayloadIsJSON bool             `json:"payloadIsJSON"`
	Filter        *FilterResult    `json:"filter,omitempty"`
	Transform     *TransformResult `json:"transform,omitempty"`
}

// FilterResult is a filter's verdict on the event.
type FilterResult struct {
	Expression string `json:"expression"`
	// Deliver is the verdict: true when the endpoint gets the event.
	Deliver bool `json:"deliver"`
	// Error says why the filter could not decide; the dispatcher dead-letters such an event.
	Error string `json:"error,omitempty"`
}

// TransformResult is what a transformation makes of the event.
type TransformResult struct {
	Body    string            `json:"body,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	// BodyUnchanged is true without a body expression: the event's body is sent.
	BodyUnchanged bool   `json:"bodyUnchanged,omitempty"`
	ContentType   string `json:"contentType,omitempty"`
	// Error says why the transformation failed; the dispatcher dead-letters such a delivery.
	Error string `json:"error,omitempty"`
}

type evalOptions struct {
	filter, transform string
	transformHeaders  []string
	endpoint          string
	event             string
	eventType         string
	id                string
	time              string
	headers           []string
}

func newEvalCommand(o *Options) *cobra.Command {
	e := &evalOptions{}
	cmd := &cobra.Command{
		Use:   "eval (--filter EXPR | --transform EXPR | --transform-header NAME=EXPR | --endpoint NAME) --event @file|file|-|'<body>'",
		Short: "Evaluate a filter and a transformation on a sample event, locally",
		Long: `Evaluate CEL expressions as the dispatcher does, on a sample event, without sending
anything: the filter's verdict (is the event delivered?) and the transformation's body and
headers. The expressions come from the flags, or from an endpoint in the cluster with
--endpoint (the only case that needs a cluster).

The expressions see payload (the body parsed as JSON, null if it is not JSON), raw (the body
as a string), type, id, ns (the namespace), time and headers (lower-case names).

Exit codes: 0 evaluated (whatever the verdict), 1 an expression failed on this event (the
dispatcher dead-letters such a delivery) or the endpoint's expression does not compile,
2 usage or an expression of the flags that does not compile, 4 endpoint not found.`,
		Example: `  kubectl webhooks eval --filter 'payload.total > 100 && payload.currency == "EUR"' --event order.json
  kubectl webhooks eval --transform '{"text": "Order " + payload.order_id + " paid"}' --event @order.json --type order.paid
  kubectl webhooks eval --endpoint slack --event - -H X-Region=eu < order.json`,
		Args: cobra.NoArgs,
		RunE: o.run(func(ctx context.Context, _ []string) error { return e.run(ctx, o) }),
	}
	f := cmd.Flags()
	f.StringVar(&e.filter, "filter", "", "a filter (spec.filter): must give a bool")
	f.StringVar(&e.transform, "transform", "", "a transformation's body (spec.transform.body)")
	f.StringArrayVar(&e.transformHeaders, "transform-header", nil, "a transformation's header NAME=EXPR (spec.transform.headers; repeatable)")
	f.StringVar(&e.endpoint, "endpoint", "", "evaluate this endpoint's spec.filter and spec.transform (read from the cluster)")
	f.StringVar(&e.event, "event", "", "the event's body: @file or a file name, - for standard input, or the body itself (required)")
	f.StringVar(&e.eventType, "type", "webhook.test", "the event's type")
	f.StringVar(&e.id, "id", "evt_test", "the event's id")
	f.StringVar(&e.time, "time", "", "the event's time, RFC 3339 (default: now)")
	f.StringArrayVarP(&e.headers, "header", "H", nil, "a producer header K=V of the event (repeatable)")
	return cmd
}

func (e *evalOptions) run(ctx context.Context, o *Options) error {
	fromFlags := e.filter != "" || e.transform != "" || len(e.transformHeaders) > 0
	switch {
	case e.endpoint != "" && fromFlags:
		return usagef("--endpoint evaluates the endpoint's own expressions: leave out --filter, --transform and --transform-header")
	case e.endpoint == "" && !fromFlags:
		return usagef("nothing to evaluate: give --filter, --transform, --transform-header or --endpoint")
	case e.event == "":
		return usagef("--event is required: @file.json or a file name, - for standard input, or the body itself")
	}
	ev, err := e.sampleEvent(o)
	if err != nil {
		return err
	}

	var spec v1alpha1.WebhookEndpointSpec
	if e.endpoint != "" {
		ns, err := o.Namespace()
		if err != nil {
			return err
		}
		ep, err := o.GetEndpoint(ctx, ns, e.endpoint)
		if err != nil {
			return err
		}
		spec = ep.Spec
	} else {
		spec.Filter = e.filter
		if e.transform != "" || len(e.transformHeaders) > 0 {
			spec.Transform = &v1alpha1.TransformSpec{Body: e.transform}
			for _, kv := range e.transformHeaders {
				name, src, ok := strings.Cut(kv, "=")
				if !ok || strings.TrimSpace(name) == "" {
					return usagef("--transform-header %q: want NAME=EXPR", kv)
				}
				spec.Transform.Headers = append(spec.Transform.Headers, v1alpha1.TransformHeader{Name: strings.TrimSpace(name), Expression: src})
			}
		}
	}
	filter, err := expr.FilterOf(&spec)
	if err != nil {
		return e.compileError(err)
	}
	transform, err := expr.TransformOf(&spec)
	if err != nil {
		return e.compileError(err)
	}

	in := expr.NewInput(ev)
	res := EvalResult{Endpoint: e.endpoint, PayloadIsJSON: in.IsJSON()}
	failed := false
	if filter != nil {
		res.Filter = &FilterResult{Expression: spec.Filter}
		res.Filter.Deliver, err = filter.Match(ctx, in)
		if err != nil {
			res.Filter.Error, failed = err.Error(), true
		}
	}
	if transform != nil {
		res.Transform = &TransformResult{}
		out, err := transform.Apply(ctx, in)
		if err != nil {
			res.Transform.Error, failed = err.Error(), true
		} else {
			res.Transform.Body, res.Transform.ContentType = string(out.Body), out.ContentType
			res.Transform.BodyUnchanged = out.Body == nil
			for k, v := range out.Headers {
				if res.Transform.Headers == nil {
					res.Transform.Headers = map[string]string{}
				}
				res.Transform.Headers[k] = v[0]
			}
		}
	}
	if err := o.print(res, func(w io.Writer) { res.table(w) }); err != nil {
		return err
	}
	if failed {
		return &Error{Code: ExitError, Err: errors.New("an expression failed on this event: the dispatcher dead-letters such a delivery")}
	}
	return nil
}

// sampleEvent is the event of the flags, as the dispatcher would read it.
func (e *evalOptions) sampleEvent(o *Options) (*expr.Event, error) {
	value := e.event
	if !strings.HasPrefix(value, "@") && value != "-" {
		if st, err := os.Stat(value); err == nil && st.Mode().IsRegular() {
			value = "@" + value // a file name, as kubectl's -f takes it
		}
	}
	body, err := readBody("--event", value, o.IO.In)
	if err != nil {
		return nil, err
	}
	if err := ValidateEventType(e.eventType); err != nil {
		return nil, &Error{Code: ExitUsage, Err: fmt.Errorf("--type: %w", err)}
	}
	headers, err := producerHeaders(e.headers)
	if err != nil {
		return nil, err
	}
	if _, ok := headers[records.HeaderContentType]; !ok && len(body) > 0 {
		headers.Set(records.HeaderContentType, "application/json")
	}
	when := o.Now().UTC()
	if e.time != "" {
		if when, err = time.Parse(time.RFC3339Nano, e.time); err != nil {
			return nil, usagef("--time %q: want an RFC 3339 time such as 2026-01-02T15:04:05Z", e.time)
		}
	}
	// The namespace of -n or the kubeconfig; without a kubeconfig, default: no cluster is needed.
	ns := "default"
	if o.Kube.Namespace != nil && *o.Kube.Namespace != "" {
		ns = *o.Kube.Namespace
	} else if n, err := o.Namespace(); err == nil && n != "" {
		ns = n
	}
	return &expr.Event{ID: e.id, Type: e.eventType, Namespace: ns, Time: when, Headers: headers, Data: body}, nil
}

// compileError is an expression that does not compile, with CEL's report: a usage error for
// the flags' expressions, an error for an endpoint's (the controller reports it too).
func (e *evalOptions) compileError(err error) error {
	var ee *expr.Error
	if errors.As(err, &ee) && ee.Report != "" {
		err = fmt.Errorf("%w\n%s", err, ee.Report)
	}
	if e.endpoint != "" {
		return &Error{Code: ExitError, Err: fmt.Errorf("endpoint %s: %w", e.endpoint, err)}
	}
	return &Error{Code: ExitUsage, Err: err}
}

// maxShownBody bounds the body eval prints in a table.
const maxShownBody = 64 << 10

func (r *EvalResult) table(w io.Writer) {
	if !r.PayloadIsJSON {
		writeLine(w, "note:\tthe event's body is not JSON: payload is null, raw has the body")
	}
	if f := r.Filter; f != nil {
		writeLine(w, "filter:\t%s", oneLine(f.Expression))
		switch {
		case f.Error != "":
			writeLine(w, "verdict:\terror: %s", f.Error)
		case f.Deliver:
			writeLine(w, "verdict:\ttrue: the event is delivered")
		default:
			writeLine(w, "verdict:\tfalse: the event is not delivered (and not in the delivery log)")
		}
	}
	if t := r.Transform; t != nil {
		if t.Error != "" {
			writeLine(w, "transform:\terror: %s", t.Error)
			return
		}
		names := make([]string, 0, len(t.Headers))
		for k := range t.Headers {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			writeLine(w, "header:\t%s: %s", k, t.Headers[k])
		}
		if t.BodyUnchanged {
			writeLine(w, "body:\tthe event's body, unchanged")
			return
		}
		writeLine(w, "content-type:\t%s", t.ContentType)
		body := t.Body
		if len(body) > maxShownBody || !utf8.ValidString(body) {
			writeLine(w, "body:\t%d bytes (-o json shows it)", len(body))
			return
		}
		writeLine(w, "body:")
		writeBlock(w, "", untab(body))
	}
}

// oneLine is an expression on one line, for a table.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
