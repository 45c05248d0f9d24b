package harness

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpSink is an OTLP/HTTP trace receiver on loopback that decodes every export and counts
// its spans: where the traced dispatcher exports.
type otlpSink struct {
	srv   *http.Server
	url   string
	spans atomic.Int64
}

func newOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{url: "http://" + ln.Addr().String()}
	ok, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		req := &collectortrace.ExportTraceServiceRequest{}
		if err != nil || proto.Unmarshal(b, req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				s.spans.Add(int64(len(ss.Spans)))
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(ok)
	})}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *otlpSink) close() { _ = s.srv.Close() }

// tracing measures what traces cost: the throughput scenario's dispatcher run with tracing off
// (no OTEL_* environment, as by default) and on (every attempt a span, the child of the
// producer's traceparent, exported with OTLP/HTTP in batches to a receiver on loopback that
// decodes them), alternating in the same run over the same backlog size.
func (b *bench) tracing(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Tracing cost"}
	rcv, err := newReceiver("tracing", nil)
	if err != nil {
		return nil, err
	}
	defer rcv.Close()
	sink, err := newOTLPSink()
	if err != nil {
		return nil, err
	}
	defer sink.close()
	b.traceparent = true
	defer func() { b.traceparent, b.dispatcherEnv = false, nil }()
	on := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + sink.url, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_SERVICE_NAME=bench-dispatcher"}
	n, c := o.Events, o.InFlight
	names := []string{"tracing off (no OTEL_* environment)", "tracing on (OTLP/HTTP to a receiver on loopback)"}
	runs := make([][]tpRun, 2)
	for r := range o.Repeat {
		progress("tracing run %d/%d: %d events, concurrency %d", r+1, o.Repeat, n, c)
		for k := range 2 {
			i := (k + r) % 2
			b.dispatcherEnv = nil
			if i == 1 {
				b.dispatcherEnv = on
			}
			run, _, err := b.dispatcherRun(ctx, rcv, fmt.Sprintf("tr%d-%d", r, i), n, c, 1, "")
			if err != nil {
				return nil, err
			}
			runs[i] = append(runs[i], run)
			progress("  %-50s %s/s", names[i], num(run.rate))
		}
	}
	var rows [][]string
	var offRates, onRates, rs []float64
	for j := range runs[0] {
		offRates, onRates = append(offRates, runs[0][j].rate), append(onRates, runs[1][j].rate)
		rs = append(rs, runs[1][j].rate/runs[0][j].rate)
	}
	for i, name := range names {
		var rates, cpu []float64
		for _, r := range runs[i] {
			rates, cpu = append(rates, r.rate), append(cpu, r.clientUS)
		}
		rows = append(rows, []string{name, nums(rates), "**" + num(median(rates)) + "**", fmt.Sprintf("%.1f", median(cpu))})
	}
	s.printf("The throughput scenario's dispatcher (every feature on, %d events of 1 KB, each with a producer `traceparent`, concurrency %d), %d runs, off and on in turn (each run starting with the other). With tracing on, every attempt is a span exported in batches (the SDK's defaults: 512 spans, 5s) to an OTLP/HTTP receiver on loopback that decodes each export.", n, c, o.Repeat)
	s.table([]string{"dispatcher", "runs (deliveries/s)", "median /s", "dispatcher CPU µs/delivery (median)"}, rows)
	s.printf("Throughput with tracing on, relative to off in the same run: %s (median **%s**). Spans received by the OTLP receiver: %s (deliveries traced: %s).",
		ratios(rs), ratio(median(rs)), num(float64(sink.spans.Load())), num(float64(n*o.Repeat)))
	s.printf("With tracing off the attempt path allocates exactly as before tracing existed (`go test ./dispatcher/deliver -bench BenchmarkAttempt -benchmem`; `TestOffAllocatesNothing`).")
	return s, nil
}
