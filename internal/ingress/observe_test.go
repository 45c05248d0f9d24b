package ingress_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// The ingress's metrics count what it did: events stored and de-duplicated per namespace,
// refusals by reason, requests by route and code, cached authorizations.
func TestMetricsCountWhatHappened(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := ingress.NewMetrics(reg)
	w := newWorld(t, func(o *ingress.Options) {
		o.Metrics = m
		o.Auth.Observe = m.AuthLookup
	})
	tok := producer(t, "a", "metered", true)
	path := "/v1/namespaces/a/events"
	for _, body := range [][]byte{event("evt_m1", "order.created", `{}`), event("evt_m1", "order.created", `{}`), event("evt_m2", "order.created", `{}`)} {
		if status, _, resp := w.post(path, tok, "application/json", body); status != http.StatusAccepted {
			t.Fatalf("status %d: %s", status, resp)
		}
	}
	if status, _, _ := w.post(path, "", "application/json", event("evt_m3", "order.created", `{}`)); status != http.StatusUnauthorized {
		t.Fatalf("no token: %d", status)
	}
	if status, _, _ := w.post(path, tok, "application/json", []byte(`{"id":`)); status != http.StatusBadRequest {
		t.Fatalf("malformed: %d", status)
	}
	if status, _, _ := w.post(path, tok, "application/json", event("evt_m4", "order.created", `{}`), "Whk-Attempts", "3"); status != http.StatusBadRequest {
		t.Fatalf("forged header: %d", status)
	}

	count := func(name string, labels ...string) float64 {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
		metric:
			for _, mt := range f.GetMetric() {
				for i := 0; i+1 < len(labels); i += 2 {
					found := false
					for _, l := range mt.GetLabel() {
						if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
							found = true
						}
					}
					if !found {
						continue metric
					}
				}
				if c := mt.GetCounter(); c != nil {
					return c.GetValue()
				}
				if h := mt.GetHistogram(); h != nil {
					return float64(h.GetSampleCount())
				}
			}
		}
		return 0
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"webhook_ingress_events_total", []string{"namespace", "a", "outcome", "stored"}, 2},
		{"webhook_ingress_events_total", []string{"namespace", "a", "outcome", "duplicate"}, 1},
		{"webhook_ingress_publish_duration_seconds", nil, 3},
		{"webhook_ingress_requests_total", []string{"route", "events", "code", "202"}, 3},
		{"webhook_ingress_requests_total", []string{"route", "events", "code", "401"}, 1},
		{"webhook_ingress_requests_total", []string{"route", "events", "code", "400"}, 2},
		{"webhook_ingress_request_duration_seconds", []string{"route", "events"}, 6},
		{"webhook_ingress_rejected_total", []string{"reason", ingress.RejectUnauthenticated}, 1},
		{"webhook_ingress_rejected_total", []string{"reason", ingress.RejectInvalid}, 2},
		// Looked up: the three publishes and the malformed body (no token and forged headers are
		// refused before any lookup); one review, then the cache.
		{"webhook_ingress_auth_cache_total", []string{"result", "miss"}, 1},
		{"webhook_ingress_auth_cache_total", []string{"result", "hit"}, 3},
	} {
		if got := count(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := gauge(t, reg, "webhook_ingress_requests_in_flight"); got != 0 {
		t.Errorf("requests in flight after every answer: %v", got)
	}
}

// gauge is the value of the unlabelled gauge name.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// Each published event is a span, the child of the producer's trace context, and the event
// carries the span's own context, so deliveries continue the producer's trace through it.
func TestPublishSpanContinuesTheProducersTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	w := newWorld(t, func(o *ingress.Options) { o.Tracer = tracing.New(tp) })
	tok := producer(t, "a", "traced", true)
	const traceID, parentSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	if status, _, resp := w.post("/v1/namespaces/a/events", tok, "application/json", event("evt_t1", "order.created", `{}`),
		"traceparent", "00-"+traceID+"-"+parentSpan+"-01"); status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, resp)
	}
	if status, _, resp := w.post("/v1/namespaces/a/events", tok, "application/json", event("evt_t2", "order.created", `{}`)); status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, resp)
	}
	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want one per event", len(spans))
	}
	byEvent := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		for _, a := range s.Attributes {
			if string(a.Key) == "webhook.event_id" {
				byEvent[a.Value.AsString()] = s
			}
		}
		if s.Name != tracing.PublishSpanName {
			t.Errorf("span %q, want %q", s.Name, tracing.PublishSpanName)
		}
	}
	traced, untraced := byEvent["evt_t1"], byEvent["evt_t2"]
	if traced.SpanContext.TraceID().String() != traceID || traced.Parent.SpanID().String() != parentSpan {
		t.Errorf("evt_t1's span is in trace %s under %s, want %s under %s", traced.SpanContext.TraceID(), traced.Parent.SpanID(), traceID, parentSpan)
	}
	if untraced.SpanContext.TraceID().String() == traceID || untraced.Parent.IsValid() {
		t.Errorf("evt_t2 (no traceparent) is not a new root: trace %s parent %s", untraced.SpanContext.TraceID(), untraced.Parent.SpanID())
	}
	for _, m := range w.stored("a") {
		id := m.Header.Get(records.HeaderMsgID)
		s := byEvent[id]
		want := fmt.Sprintf("00-%s-%s-01", s.SpanContext.TraceID(), s.SpanContext.SpanID())
		if got := m.Header.Get(records.HeaderTraceParent); got != want {
			t.Errorf("%s stored traceparent %q, want its publish span's %q", id, got, want)
		}
	}
}

// The server's own bounds: a request beyond the concurrency bound is answered 503 with
// Retry-After at once, a header block over its bound 431, and a client that never finishes
// its headers is disconnected.
func TestServerBounds(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := ingress.NewMetrics(reg)
	w := newServingWorld(t, func(o *ingress.Options) { o.MaxConcurrent, o.Metrics = 1, m },
		ingress.ServerOptions{Addr: "127.0.0.1:0", ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 20 * time.Second, MaxHeaderBytes: 8 << 10})
	tok := producer(t, "a", "bounded", true)
	host := strings.TrimPrefix(w.url, "http://")

	// The producer's token is verified first (the decision is cached), so that the held
	// request takes the slot at once rather than after a TokenReview.
	// Its event is the held request's own: de-duplicated, it stores nothing more.
	if status, _, _ := w.post("/v1/namespaces/a/events", tok, "application/json", event("evt_slow", "order.created", `{}`)); status != http.StatusAccepted {
		t.Fatalf("the first request: %d", status)
	}
	// One request holds the only slot: its headers are in, its body is not. It holds it once
	// the server counts one request in flight; one that is gone before (hung up on by the
	// server's read-header timeout on a machine too busy to read its headers in time) is sent
	// again.
	body := event("evt_slow", "order.created", `{}`)
	var slow net.Conn
	var slowResp *bufio.Reader
	hold := func() {
		if slow != nil {
			_ = slow.Close()
		}
		var err error
		if slow, err = net.Dial("tcp", host); err != nil {
			t.Fatal(err)
		}
		slowResp = bufio.NewReader(slow)
		fmt.Fprintf(slow, "POST /v1/namespaces/a/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			host, tok, len(body), body[:5])
	}
	hold()
	defer func() { _ = slow.Close() }()
	testenv.Eventually(t, 20*time.Second, func() bool {
		if gauge(t, reg, "webhook_ingress_requests_in_flight") == 1 {
			return true
		}
		_ = slow.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		var ne net.Error
		if _, err := slowResp.Peek(1); err == nil || !errors.As(err, &ne) || !ne.Timeout() {
			hold()
		}
		_ = slow.SetReadDeadline(time.Time{})
		return false
	}, "the held request did not take the slot")
	status, hdr, _ := w.post("/v1/namespaces/a/events", tok, "application/json", event("evt_fast", "order.created", `{}`))
	if status != http.StatusServiceUnavailable {
		t.Errorf("a second request while the slot is held: %d, want 503", status)
	}
	if hdr.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	// The held request completes once its body arrives.
	if _, err := slow.Write(body[5:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(slowResp, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		t.Errorf("the held request: %d", resp.StatusCode)
	}

	// Headers over the bound.
	if status, _, _ := w.post("/v1/namespaces/a/events", tok, "application/json", event("evt_big", "order.created", `{}`), "X-Padding", strings.Repeat("p", 16<<10)); status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("16 KiB of headers: %d, want 431", status)
	}

	// Headers never finished: the server hangs up after its read-header timeout.
	stalled, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	fmt.Fprintf(stalled, "POST /v1/namespaces/a/events HTTP/1.1\r\nHost: %s\r\n", host)
	_ = stalled.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := stalled.Read(make([]byte, 1)); err == nil || n != 0 {
		// Go answers nothing on a header timeout: the read ends with EOF, not a response.
		t.Errorf("a client stalled in its headers read %d bytes, %v; want the connection closed", n, err)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Errorf("a client stalled in its headers was not disconnected: %v", err)
	}
	if n := len(w.stored("a")); n != 1 {
		t.Errorf("%d events stored, want only the held request's", n)
	}
}

type statusText struct{ p *int }

func (s statusText) String() string { return fmt.Sprint(*s.p) }

func lazyStatus(p *int) fmt.Stringer { return statusText{p} }
