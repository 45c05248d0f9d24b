package tracing_test

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

func TestReadSettings(t *testing.T) {
	for name, tc := range map[string]struct {
		env     map[string]string
		want    tracing.Settings
		wantErr string
	}{
		"nothing set":                {},
		"endpoint":                   {env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, want: tracing.Settings{Enabled: true, Protocol: "http/protobuf"}},
		"traces endpoint, grpc":      {env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: tracing.Settings{Enabled: true, Protocol: "grpc"}},
		"traces protocol wins":       {env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, want: tracing.Settings{Enabled: true, Protocol: "http/protobuf"}},
		"exporter none":              {env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}},
		"sdk disabled":               {env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}},
		"service name alone":         {env: map[string]string{"OTEL_SERVICE_NAME": "x"}},
		"unsupported exporter":       {env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "only otlp and none"},
		"unsupported protocol":       {env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErr: "only grpc and http/protobuf"},
		"exporter otlp, no endpoint": {env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: tracing.Settings{Enabled: true, Protocol: "http/protobuf"}},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := tracing.ReadSettings(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// With tracing off (a nil Tracer) the attempt path makes no span and allocates nothing, and
// the request carries the producer's trace context unchanged.
func TestOffAllocatesNothing(t *testing.T) {
	var off *tracing.Tracer
	ctx := context.Background()
	rec := &records.LogRecord{State: records.StateFailed, Reason: records.FailStatusCode, Response: records.Response{StatusCode: 503}}
	s := tracing.Start{Namespace: "ns", Endpoint: "ep", DeliveryID: "whdl_x", EventID: "evt_1", EventType: "order.created", Attempt: 2,
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TraceState: "vendor=x"}
	var tp, ts string
	allocs := testing.AllocsPerRun(1000, func() {
		actx, span := off.StartAttempt(ctx, s)
		tp, ts = span.Context(s.TraceParent, s.TraceState)
		tracing.Outcome(actx, rec)
		span.End()
	})
	if allocs != 0 {
		t.Fatalf("tracing off allocates %.1f times per attempt, want 0", allocs)
	}
	if tp != s.TraceParent || ts != s.TraceState {
		t.Fatalf("the request carries %q %q, want the producer's %q %q", tp, ts, s.TraceParent, s.TraceState)
	}
}

// An attempt of an event with a producer trace is its child; without one, a new root. The
// request carries the attempt span's context; the outcome is recorded on the span.
func TestAttemptSpanParentAndOutcome(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tr := tracing.New(tp)
	const producer = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	ctx, span := tr.StartAttempt(context.Background(), tracing.Start{Endpoint: "ep", DeliveryID: "whdl_1", Attempt: 1, TraceParent: producer, TraceState: "vendor=x"})
	tp1, ts1 := span.Context(producer, "vendor=x")
	tracing.Outcome(ctx, &records.LogRecord{State: records.StateDeadLetter, DeadLetterReason: records.ReasonExhausted, Reason: records.FailStatusCode,
		LatencyUS: 1500, Response: records.Response{StatusCode: 503}})
	span.End()

	ctx, span = tr.StartAttempt(context.Background(), tracing.Start{Endpoint: "ep", DeliveryID: "whdl_2", Attempt: 1, TraceParent: "garbage"})
	tp2, _ := span.Context("garbage", "")
	tracing.Outcome(ctx, &records.LogRecord{State: records.StateSucceeded, Response: records.Response{StatusCode: 200}})
	span.End()

	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	child, root := spans[0], spans[1]
	if got := child.Parent.TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" || child.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("parent %s/%s, want the producer's span", got, child.Parent.SpanID())
	}
	if child.SpanContext.TraceID() != child.Parent.TraceID() || child.SpanKind != trace.SpanKindClient {
		t.Errorf("the attempt is not in the producer's trace (or not a client span): %+v", child.SpanContext)
	}
	if want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + child.SpanContext.SpanID().String() + "-01"; tp1 != want || ts1 != "vendor=x" {
		t.Errorf("request traceparent %q tracestate %q, want %q vendor=x", tp1, ts1, want)
	}
	attrs := map[string]string{}
	for _, kv := range child.Attributes {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	for k, v := range map[string]string{"webhook.outcome": "dead_letter", "webhook.dead_letter_reason": "exhausted", "webhook.failure_reason": "status_code",
		"http.response.status_code": "503", "webhook.latency_ms": "1.5", "webhook.delivery_id": "whdl_1", "webhook.attempt": "1"} {
		if attrs[k] != v {
			t.Errorf("attribute %s = %q, want %q (all: %v)", k, attrs[k], v, attrs)
		}
	}
	if child.Status.Code.String() != "Error" {
		t.Errorf("status %v, want Error", child.Status)
	}
	if root.Parent.IsValid() {
		t.Errorf("an attempt without a valid producer trace has parent %v, want a new root", root.Parent)
	}
	if !strings.Contains(tp2, root.SpanContext.TraceID().String()+"-"+root.SpanContext.SpanID().String()) {
		t.Errorf("request traceparent %q is not the root span's", tp2)
	}
}

// FromEnv exports with OTLP over HTTP to the endpoint the standard environment names: a real
// OTLP/HTTP receiver on loopback decodes the protobuf export and finds the span and the
// service name.
func TestFromEnvExportsToOTLPHTTPReceiver(t *testing.T) {
	var mu sync.Mutex
	var got []*collectortrace.ExportTraceServiceRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "unexpected "+r.URL.Path+" "+r.Header.Get("Content-Type"), http.StatusBadRequest)
			return
		}
		body := io.Reader(r.Body)
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, _ := io.ReadAll(body)
		req := &collectortrace.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(b, req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "dispatcher-under-test")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_SDK_DISABLED", "")

	tr, shutdown, err := tracing.FromEnv(context.Background(), "webhook-dispatcher")
	if err != nil || tr == nil {
		t.Fatalf("FromEnv: %v, %v", tr, err)
	}
	ctx, span := tr.StartAttempt(context.Background(), tracing.Start{Namespace: "ns", Endpoint: "orders", DeliveryID: "whdl_otlp", Attempt: 1})
	tracing.Outcome(ctx, &records.LogRecord{State: records.StateSucceeded, Response: records.Response{StatusCode: 204}})
	span.End()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(sctx); err != nil { // flushes the batch
		t.Fatalf("shutdown: %v", err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) > 0 }, "the OTLP receiver got no export")
	mu.Lock()
	defer mu.Unlock()
	var service, name, delivery string
	for _, req := range got {
		for _, rs := range req.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					service = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					name = s.Name
					for _, a := range s.Attributes {
						if a.Key == "webhook.delivery_id" {
							delivery = a.GetValue().GetStringValue()
						}
					}
				}
			}
		}
	}
	if service != "dispatcher-under-test" || name != tracing.SpanName || delivery != "whdl_otlp" {
		t.Fatalf("exported service %q span %q delivery %q; want dispatcher-under-test, %s, whdl_otlp", service, name, delivery, tracing.SpanName)
	}
}

// Without the environment, FromEnv returns no tracer: nothing is exported.
func TestFromEnvOffWithoutEnvironment(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"} {
		t.Setenv(k, "")
	}
	tr, shutdown, err := tracing.FromEnv(context.Background(), "webhook-dispatcher")
	if err != nil || tr != nil {
		t.Fatalf("FromEnv without OTEL_* = %v, %v; want no tracer", tr, err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}
