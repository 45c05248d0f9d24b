package dispatcher_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// Each attempt of a real delivery (a real receiver on loopback, a real nats-server) is a span:
// the child of the producer's trace, with the delivery's attributes and outcome, and the
// receiver gets the attempt span's own traceparent. An attempt that fails and one that
// dead-letters say so; an event without a trace gets a new root whose context the receiver
// gets too.
func TestDeliveryAttemptsAreSpans(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		if strings.HasPrefix(h.ID, "evt_fail") {
			return testenv.Response{Status: http.StatusServiceUnavailable, Body: "down"}
		}
		return testenv.Response{Status: http.StatusOK, Body: "ok"}
	})
	twice := e.policy("twice", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 10 * time.Millisecond}}, CircuitBreaker: noCircuit()})
	rcv.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"}, RetryPolicyRef: twice}))
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	e.dispatcher("d1", func(o *dispatcher.Options) { o.Tracer = tracing.New(tp) })

	const producerTrace, producerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	e.publish("order.created", "evt_traced", []byte(`{}`), "traceparent", "00-"+producerTrace+"-"+producerSpan+"-01", "tracestate", "vendor=x")
	e.publish("order.created", "evt_untraced", []byte(`{}`))
	e.publish("order.created", "evt_fail", []byte(`{}`), "traceparent", "00-"+producerTrace+"-"+producerSpan+"-01")
	// 1 + 1 + 2 attempts.
	testenv.Eventually(t, 20*time.Second, func() bool { return len(exp.GetSpans()) == 4 && rcv.Stats().Requests == 4 }, "want 4 spans and 4 requests, got %v and %v",
		lazyN(func() int { return len(exp.GetSpans()) }), lazyN(func() int { return rcv.Stats().Requests }))

	spans := map[string]tracetest.SpanStub{} // by event id and attempt
	for _, s := range exp.GetSpans() {
		a := attrs(s)
		spans[a["webhook.event_id"]+"/"+a["webhook.attempt"]] = s
	}
	sent := map[string]string{} // traceparent the receiver got, by event id and attempt
	for _, h := range rcv.Requests() {
		sent[fmt.Sprintf("%s/%d", h.ID, h.Attempt)] = h.Header.Get("traceparent")
		if h.ID == "evt_traced" && h.Header.Get("tracestate") != "vendor=x" {
			t.Errorf("the receiver got tracestate %q, want the producer's vendor=x", h.Header.Get("tracestate"))
		}
	}
	for key, want := range map[string]map[string]string{
		"evt_traced/1":   {"webhook.outcome": "succeeded", "http.response.status_code": "200", "webhook.endpoint": "orders", "webhook.namespace": e.ns, "webhook.event_type": "order.created"},
		"evt_untraced/1": {"webhook.outcome": "succeeded", "http.response.status_code": "200"},
		"evt_fail/1":     {"webhook.outcome": "failed", "webhook.failure_reason": "status_code", "http.response.status_code": "503"},
		"evt_fail/2":     {"webhook.outcome": "dead_letter", "webhook.dead_letter_reason": "exhausted", "http.response.status_code": "503"},
	} {
		s, ok := spans[key]
		if !ok {
			t.Fatalf("no span for attempt %s; %d spans", key, len(spans))
		}
		a := attrs(s)
		for k, v := range want {
			if a[k] != v {
				t.Errorf("%s: attribute %s = %q, want %q", key, k, a[k], v)
			}
		}
		for _, k := range []string{"webhook.delivery_id", "webhook.latency_ms"} {
			if a[k] == "" {
				t.Errorf("%s: no attribute %s", key, k)
			}
		}
		traced := key != "evt_untraced/1"
		if traced && (s.Parent.TraceID().String() != producerTrace || s.Parent.SpanID().String() != producerSpan) {
			t.Errorf("%s: parent %s/%s, want the producer's %s/%s", key, s.Parent.TraceID(), s.Parent.SpanID(), producerTrace, producerSpan)
		}
		if !traced && s.Parent.IsValid() {
			t.Errorf("%s: an event without a trace has parent %v, want a new root", key, s.Parent)
		}
		want := "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"
		if sent[key] != want {
			t.Errorf("%s: the receiver got traceparent %q, want the attempt span's %q", key, sent[key], want)
		}
	}
}

func attrs(s tracetest.SpanStub) map[string]string {
	out := map[string]string{}
	for _, kv := range s.Attributes {
		out[string(kv.Key)] = kv.Value.Emit()
	}
	return out
}
