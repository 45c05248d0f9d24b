package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	_ "net/http/pprof" // the dispatcher child serves /debug/pprof on its debug address
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

func signalNotify(c chan os.Signal) { signal.Notify(c, syscall.SIGTERM, syscall.SIGINT) }

// Child runs one role of a child process (`bench child <role> flags...`) and returns its exit
// code. Roles: nats, dispatcher, http, jsack, naive, ingress, sink, load, apiserver.
func Child(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "child: a role is required")
		return 2
	}
	var err error
	switch args[0] {
	case "nats":
		err = childNATS(args[1:])
	case "dispatcher":
		err = childDispatcher(args[1:])
	case "http":
		err = childHTTP(args[1:])
	case "jsack":
		err = childJSAck(args[1:])
	case "naive":
		err = childNaive(args[1:])
	case "ingress":
		err = childIngress(args[1:])
	case "sink":
		err = childSink(args[1:])
	case "load":
		err = childLoad(args[1:])
	default:
		err = fmt.Errorf("unknown role %q", args[0])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child", args[0]+":", err)
		return 1
	}
	return 0
}

// childNATS runs a nats-server with JetStream and file storage until stdin closes.
func childNATS(args []string) error {
	fs := flag.NewFlagSet("nats", flag.ContinueOnError)
	dir := fs.String("store", "", "storage directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := parentGone()
	defer cancel()
	n, err := testenv.StartNATS(*dir)
	if err != nil {
		return err
	}
	// /debug/pprof of the server's process, so the bench can profile nats-server too.
	// /mallocs: heap objects allocated since start (no GC forced), for allocations per delivery.
	http.HandleFunc("/mallocs", func(w http.ResponseWriter, _ *http.Request) {
		sample := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
		metrics.Read(sample)
		fmt.Fprint(w, sample[0].Value.Uint64())
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = http.Serve(ln, nil) }()
	fmt.Println("DEBUG", ln.Addr().String())
	fmt.Println("READY", n.URL())
	<-ctx.Done()
	n.Stop()
	return nil
}

// memStats is what the dispatcher child's /stats reports (after a forced GC).
type memStats struct {
	HeapAlloc  uint64 `json:"heapAlloc"`
	HeapInuse  uint64 `json:"heapInuse"`
	StackInuse uint64 `json:"stackInuse"`
	Sys        uint64 `json:"sys"`
	Goroutines int    `json:"goroutines"`
	NumGC      uint32 `json:"numGC"`
}

// childDispatcher runs dispatcher.Run for one namespace, as `webhook-operator dispatcher`
// does (same defaults, a kubeconfig through $KUBECONFIG), plus a debug server with pprof and
// /stats on loopback.
func childDispatcher(args []string) error {
	fs := flag.NewFlagSet("dispatcher", flag.ContinueOnError)
	ns := fs.String("namespace", "", "namespace")
	natsURL := fs.String("nats", "", "NATS URL")
	identity := fs.String("identity", "bench-0", "replica identity")
	grace := fs.Duration("shutdown-grace", 10*time.Second, "shutdown grace")
	memRate := fs.Int("memprofilerate", 0, "runtime.MemProfileRate (0 keeps Go's default)")
	replicas := fs.Int("replicas", 1, "replicas of the dispatcher")
	_ = fs.String("log-name", "", "suffix of the log file's name (read by the harness)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *memRate > 0 {
		runtime.MemProfileRate = *memRate
	}
	ctx, cancel := parentGone()
	defer cancel()

	reg := prometheus.NewRegistry()
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	http.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		_ = json.NewEncoder(w).Encode(memStats{HeapAlloc: m.HeapAlloc, HeapInuse: m.HeapInuse, StackInuse: m.StackInuse,
			Sys: m.Sys, Goroutines: runtime.NumGoroutine(), NumGC: m.NumGC})
	})
	// /mallocs: heap objects allocated since start (no GC forced), for allocations per delivery.
	http.HandleFunc("/mallocs", func(w http.ResponseWriter, _ *http.Request) {
		sample := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
		metrics.Read(sample)
		fmt.Fprint(w, sample[0].Value.Uint64())
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = http.Serve(ln, nil) }()
	fmt.Println("DEBUG", ln.Addr().String())

	log := zap.New(zap.WriteTo(os.Stderr))
	ctrl.SetLogger(log)
	rc, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	dispatcher.SetMemoryLimit(dispatcher.DefaultMemoryBudget) // as `webhook-operator dispatcher` does
	cfg := opconfig.Default()
	cfg.NATS.URL = *natsURL
	cfg.AllowHTTP = true
	cfg.AllowedCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	// Traces as `webhook-operator dispatcher` makes them: only when OTEL_* asks.
	tracer, shutdown, err := tracing.FromEnv(ctx, "webhook-dispatcher")
	if err != nil {
		return err
	}
	defer func() { _ = shutdown(context.Background()) }()
	err = dispatcher.Run(ctx, dispatcher.Options{
		Namespace: *ns, Config: cfg, Identity: *identity, Replicas: *replicas, RestConfig: rc, ShutdownGrace: *grace,
		Registry: reg, Logger: log, MetricsAddr: "0", ProbeAddr: "0", Tracer: tracer,
	})
	fmt.Println("EXIT")
	return err
}

// clientResult is what the client roles print after RESULT.
type clientResult struct {
	N       int     `json:"n"`
	Errors  int     `json:"errors"`
	Seconds float64 `json:"seconds"`
	// CPU is the CPU time the process used over Seconds.
	CPU float64 `json:"cpu"`
	// MissedHeartbeats counts the pull iterator's "no heartbeat received" errors (a pull
	// that went silent for two heartbeat intervals), which the loop survives.
	MissedHeartbeats int `json:"missedHeartbeats,omitempty"`
}

// selfCPU is the CPU time this process has used so far.
func selfCPU() time.Duration {
	s, _ := sampleProc(os.Getpid())
	return s.CPU
}

func printResult(r clientResult) {
	b, _ := json.Marshal(r)
	fmt.Println("RESULT", string(b))
}

// plainClient is an HTTP client with keep-alive connections bounded by c.
func plainClient(c int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy: nil, MaxIdleConns: 0, MaxIdleConnsPerHost: c, MaxConnsPerHost: c,
		IdleConnTimeout: 90 * time.Second, DisableCompression: true,
	}, Timeout: 30 * time.Second}
}

// post sends one body; true on a 2xx.
func post(cl *http.Client, url string, body []byte, id string) bool {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(records.SendID, id)
	resp, err := cl.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}

// childHTTP POSTs n 1 KB bodies to url from c goroutines: the raw HTTP rate.
func childHTTP(args []string) error {
	fs := flag.NewFlagSet("http", flag.ContinueOnError)
	url := fs.String("url", "", "receiver URL")
	n := fs.Int("n", 10000, "requests")
	c := fs.Int("c", 64, "concurrency")
	tag := fs.String("tag", "http", "tag in the body")
	if err := fs.Parse(args); err != nil {
		return err
	}
	printResult(postLoop(*url, *n, *c, *tag))
	return nil
}

// postLoop POSTs n 1 KB bodies to url from c goroutines of a plain Go client.
func postLoop(url string, n, c int, tag string) clientResult {
	cl := plainClient(c)
	defer cl.CloseIdleConnections()
	var next, errs atomic.Int64
	var wg sync.WaitGroup
	start, cpu0 := time.Now(), selfCPU()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if !post(cl, url, eventBody(tag, i, time.Now()), fmt.Sprintf("%s-%d", tag, i)) {
					errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return clientResult{N: n, Errors: int(errs.Load()), Seconds: time.Since(start).Seconds(), CPU: (selfCPU() - cpu0).Seconds()}
}

func consumerOf(natsURL, stream, consumer string) (*nats.Conn, jetstream.Consumer, error) {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, stream, consumer)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, cons, nil
}

// childJSAck consumes n messages and acknowledges each: the raw JetStream rate. The time runs
// from the first message to the server's answer to a flush after the last ack.
func childJSAck(args []string) error {
	fs := flag.NewFlagSet("jsack", flag.ContinueOnError)
	natsURL := fs.String("nats", "", "NATS URL")
	stream := fs.String("stream", "", "stream")
	consumer := fs.String("consumer", "", "durable consumer")
	n := fs.Int("n", 10000, "messages")
	batch := fs.Int("batch", 256, "pull batch")
	if err := fs.Parse(args); err != nil {
		return err
	}
	nc, cons, err := consumerOf(*natsURL, *stream, *consumer)
	if err != nil {
		return err
	}
	defer nc.Close()
	it, err := cons.Messages(jetstream.PullMaxMessages(min(*batch, 512)))
	if err != nil {
		return err
	}
	defer it.Stop()
	var start time.Time
	var cpu0 time.Duration
	missed := 0
	for i := 0; i < *n; i++ {
		m, err := it.Next()
		if errors.Is(err, jetstream.ErrNoHeartbeat) {
			missed++
			fmt.Fprintln(os.Stderr, time.Now().Format(time.RFC3339Nano), "missed heartbeat after", i, "messages")
			i--
			continue
		}
		if err != nil {
			return err
		}
		if i == 0 {
			start, cpu0 = time.Now(), selfCPU()
		}
		_ = m.Ack()
	}
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		return err
	}
	printResult(clientResult{N: *n, Seconds: time.Since(start).Seconds(), CPU: (selfCPU() - cpu0).Seconds(), MissedHeartbeats: missed})
	return nil
}

// childNaive is the naive loop: consume, POST the body, ack on a 2xx, with c workers. No
// routing, signing, delivery log or health.
func childNaive(args []string) error {
	fs := flag.NewFlagSet("naive", flag.ContinueOnError)
	natsURL := fs.String("nats", "", "NATS URL")
	stream := fs.String("stream", "", "stream")
	consumer := fs.String("consumer", "", "durable consumer")
	url := fs.String("url", "", "receiver URL")
	n := fs.Int("n", 10000, "messages")
	c := fs.Int("c", 64, "workers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	nc, cons, err := consumerOf(*natsURL, *stream, *consumer)
	if err != nil {
		return err
	}
	defer nc.Close()
	it, err := cons.Messages(jetstream.PullMaxMessages(min(*c, 512)))
	if err != nil {
		return err
	}
	cl := plainClient(*c)
	ch := make(chan jetstream.Msg, *c)
	var errs atomic.Int64
	var wg sync.WaitGroup
	for range *c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range ch {
				if post(cl, *url, m.Data(), m.Headers().Get(records.HeaderMsgID)) {
					_ = m.Ack()
				} else {
					errs.Add(1)
					_ = m.Nak()
				}
			}
		}()
	}
	var start time.Time
	var cpu0 time.Duration
	missed := 0
	for i := 0; i < *n; i++ {
		m, err := it.Next()
		if errors.Is(err, jetstream.ErrNoHeartbeat) {
			missed++
			fmt.Fprintln(os.Stderr, time.Now().Format(time.RFC3339Nano), "missed heartbeat after", i, "messages")
			i--
			continue
		}
		if err != nil {
			close(ch)
			return err
		}
		if i == 0 {
			start, cpu0 = time.Now(), selfCPU()
		}
		ch <- m
	}
	close(ch)
	wg.Wait()
	it.Stop()
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		return err
	}
	printResult(clientResult{N: *n, Errors: int(errs.Load()), Seconds: time.Since(start).Seconds(), CPU: (selfCPU() - cpu0).Seconds(), MissedHeartbeats: missed})
	return nil
}
