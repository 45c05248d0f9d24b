package deliver

import (
	"context"
	"net/http"
	"net/netip"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/webhook-operator/webhook-operator/dispatcher/attempt"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// BenchmarkAttempt measures one attempt's path to a receiver on loopback (the request, its
// headers, the response) as it was before tracing ("untraced"), with tracing off (the hooks
// of Worker.attempt and Worker.log with a nil Tracer) and on (spans exported in batches to a
// no-op exporter). Off must allocate exactly as untraced:
//
//	go test ./dispatcher/deliver -run '^$' -bench BenchmarkAttempt -benchmem
func BenchmarkAttempt(b *testing.B) {
	srv := testenv.StartReceiver(b, testenv.ReceiverOptions{KeepRequests: -1, MaxIDs: -1,
		Respond: func(testenv.Request) testenv.Response { return testenv.Response{Status: http.StatusNoContent} }})
	ep := &endpoint.Config{Namespace: "bench", Name: "ep", URL: srv.URL(), Timeout: 5 * time.Second, MaxInFlight: 1,
		SuccessCode: func(c int) bool { return c/100 == 2 }}
	client := attempt.NewClient(attempt.NewTransport(netguard.Policy{AllowHTTP: true, Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, nil, 1, nil))
	meta := records.DeliveryMeta{DeliveryID: "whdl_0123456789abcdefghjkmnpqrs", EventID: "evt_1", EventType: "order.created", Namespace: "bench", Endpoint: "ep"}
	body := []byte(`{"order_id":"ord_1","total":42}`)
	const producer = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := context.Background()

	b.Run("untraced", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req := &attempt.Request{Meta: meta, Attempt: 1, Body: body, TraceParent: producer}
			if o := attempt.Send(ctx, client, ep, req, time.Now()); !o.Success {
				b.Fatal(o.Reason, o.Err)
			}
		}
	})
	exp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = exp.Shutdown(ctx) }()
	for _, tc := range []struct {
		name   string
		tracer *tracing.Tracer
	}{{"tracing-off", nil}, {"tracing-on", tracing.New(exp)}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req := &attempt.Request{Meta: meta, Attempt: 1, Body: body, TraceParent: producer}
				actx, span := tc.tracer.StartAttempt(ctx, tracing.Start{Namespace: meta.Namespace, Endpoint: ep.Name, DeliveryID: meta.DeliveryID,
					EventID: meta.EventID, EventType: meta.EventType, Attempt: req.Attempt, TraceParent: req.TraceParent})
				req.TraceParent, req.TraceState = span.Context(req.TraceParent, req.TraceState)
				o := attempt.Send(ctx, client, ep, req, time.Now())
				if !o.Success {
					b.Fatal(o.Reason, o.Err)
				}
				tracing.Outcome(actx, &records.LogRecord{State: records.StateSucceeded, LatencyUS: o.Latency.Microseconds(), Response: records.Response{StatusCode: o.StatusCode}})
				span.End()
			}
		})
	}
}
