package harness

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/client-go/rest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/dataapi"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// dataAPINamespace holds the data-api scenario's log.
const dataAPINamespace = "bench-data"

// dataAPI measures the data API server (issue 31) through the real aggregation layer of a
// control plane of its own, the server the real binary (`webhook-operator apiserver`, built as
// `make build` builds it, GOMEMLIMIT from the chart's memory limit) reading a nats-server child:
//   - a page of 500 deliveries of one endpoint (spec.endpoint=orders, limit=500) in a
//     namespace whose delivery log holds 1,000,000 records (-quick: 100,000), 1% of them the
//     endpoint's, the rest spread over 99 other endpoints: p50 and p99 of the request as a
//     client sees it (kube-apiserver, the aggregator's proxy, the server, NATS);
//   - a watch of the endpoint's deliveries: the time from an outcome's log record being stored
//     to its event arriving;
//   - the server's resident memory (VmRSS sampled, and its VmHWM; and its anonymous part, what
//     it allocates, apart from the executable's pages) while 100 clients list pages of 500 at
//     once.
//
// Goals: p99 under 100 ms, every watch event within 1 s, memory under 128 MiB.
func (b *bench) dataAPI(ctx context.Context) (*section, error) {
	s := &section{title: "Data API"}
	o := b.o
	records1M, pages, watches, clients, listFor := 1_000_000, 200, 20, 100, 20*time.Second
	if o.Quick {
		records1M, pages, watches, listFor = 100_000, 50, 5, 5*time.Second
	}
	dir, err := os.MkdirTemp("", "webhook-operator-bench-dataapi-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	progress("data-api: starting a control plane with the aggregation layer and nats-server")
	cp, err := testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{Aggregation: true})
	if err != nil {
		return nil, err
	}
	defer func() { _ = cp.Stop() }()
	kubeconfig, err := cp.WriteKubeconfig(dir)
	if err != nil {
		return nil, err
	}
	natsProc, err := startChild(dir, "nats", nil, "nats", "-store", filepath.Join(dir, "nats"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = natsProc.stop(30 * time.Second) }()
	if _, err := natsProc.line("DEBUG", time.Minute); err != nil {
		return nil, err
	}
	natsURL, err := natsProc.line("READY", time.Minute)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return nil, err
	}
	cfg := opconfig.Default()
	cfg.Streams.AttemptsMaxBytes = 4 << 30
	set := cfg.Streams.For(dataAPINamespace)
	if err := set.Ensure(ctx, js); err != nil {
		return nil, err
	}

	// The log: batches of 500 records of one endpoint, as the dispatchers' log writers store
	// them under load; every 100th batch is orders'.
	progress("data-api: writing %d delivery-log records", records1M)
	seedStart := time.Now()
	const batch = 500
	base := time.Now().Add(-24 * time.Hour).UTC()
	entries := make([]records.LogEntry, batch)
	var ordersRecords int
	for n, k := 0, 0; n < records1M; k++ {
		ep := fmt.Sprintf("ep-%02d", k%100)
		if k%100 == 0 {
			ep = "orders"
		}
		for i := range entries {
			id := fmt.Sprintf("evt_%d_%d", k, i)
			at := base.Add(time.Duration(n+i) * 50 * time.Millisecond)
			rec := records.LogRecord{DeliveryID: records.DeliveryID(id, dataAPINamespace, ep), EventID: id, EventType: "order.created",
				Namespace: dataAPINamespace, Endpoint: ep, Attempt: 1, State: records.StateSucceeded, Time: at, LatencyMS: 12, LatencyUS: 12345,
				Response: records.Response{StatusCode: 204}}
			entries[i] = records.EncodeLog(&rec, nil)
		}
		if ep == "orders" {
			ordersRecords += batch
		}
		if _, err := js.PublishMsgAsync(records.LogBatch(set.AttemptSubject(ep), entries)); err != nil {
			return nil, err
		}
		n += batch
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		return nil, fmt.Errorf("writing the log did not complete")
	}
	progress("data-api: %d records (%d of orders) written in %s", records1M, ordersRecords, time.Since(seedStart).Round(time.Second))

	// The server, registered with the aggregator.
	serving, err := testenv.WriteTLSFor(filepath.Join(dir, "serving"), testenv.APIServiceHost("bench-dataapi"))
	if err != nil {
		return nil, err
	}
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	// The server is the real binary, built as `make build` builds it, run as the chart runs it
	// (`webhook-operator apiserver`, GOMEMLIMIT from the container's memory limit).
	progress("data-api: building webhook-operator")
	exe := filepath.Join(dir, "webhook-operator")
	if err := testenv.GoBuild(exe, "./cmd/webhook-operator"); err != nil {
		return nil, err
	}
	srv, err := startExe(dir, "apiserver", exe, []string{"GOMEMLIMIT=" + strconv.Itoa(chartAPIServerMemoryLimit)}, "apiserver",
		"--nats-url="+natsURL, "--kubeconfig="+kubeconfig, "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port),
		"--tls-cert-file="+serving.ServerCert, "--tls-private-key-file="+serving.ServerKey)
	if err != nil {
		return nil, err
	}
	defer func() { _ = srv.stop(30 * time.Second) }()
	if err := waitServing(ctx, port, srv); err != nil {
		return nil, fmt.Errorf("the data API server did not serve (its log: %s): %w", srv.logPath, err)
	}
	idle, err := sampleProc(srv.pid())
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(serving.CA)
	if err != nil {
		return nil, err
	}
	if err := cp.RegisterAPIService(ctx, "bench-dataapi", datav1alpha1.GroupName, datav1alpha1.SchemeGroupVersion.Version, port, ca); err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(cp.Config)
	rc.QPS, rc.Burst = -1, 0
	rc.GroupVersion, rc.APIPath = &datav1alpha1.SchemeGroupVersion, "/apis"
	rc.NegotiatedSerializer = dataapi.Codecs.WithoutConversion()
	client, err := rest.RESTClientFor(rc)
	if err != nil {
		return nil, err
	}
	page := func(ctx context.Context, cont string) (*datav1alpha1.WebhookDeliveryList, error) {
		var l datav1alpha1.WebhookDeliveryList
		r := client.Get().Namespace(dataAPINamespace).Resource(datav1alpha1.ResourceDeliveries).
			Param("fieldSelector", datav1alpha1.FieldEndpoint+"=orders").Param("limit", "500")
		if cont != "" {
			r = r.Param("continue", cont)
		}
		return &l, r.Do(ctx).Into(&l)
	}

	// 1. Pages of 500.
	progress("data-api: %d first pages of 500 of orders' deliveries", pages)
	if _, err := page(ctx, ""); err != nil { // warm up
		return nil, err
	}
	var lat []float64
	var cont string
	for i := range pages {
		c := ""
		if i%2 == 1 {
			c = cont // every other request continues the first page
		}
		t0 := time.Now()
		l, err := page(ctx, c)
		if err != nil {
			return nil, err
		}
		lat = append(lat, float64(time.Since(t0).Microseconds())/1000)
		if len(l.Items) != 500 {
			return nil, fmt.Errorf("a page holds %d deliveries, want 500", len(l.Items))
		}
		if i == 0 {
			cont = l.Continue
		}
	}
	sort.Float64s(lat)
	p50, p99 := percentile(lat, 50), percentile(lat, 99)
	s.printf("A namespace whose delivery log holds %s records (%s of endpoint orders, in batches of 500 as the log writers store them; the rest over 99 other endpoints). Each request goes through kube-apiserver's aggregation layer to the server (a child process) and NATS.", num(float64(records1M)), num(float64(ordersRecords)))
	s.printf("")
	s.table([]string{"measurement", "requests", "p50 ms", "p99 ms", "max ms"},
		[][]string{{"page of 500 (spec.endpoint=orders, limit=500; half continue the first page)", strconv.Itoa(pages), ms(p50), ms(p99), ms(percentile(lat, 100))}})
	b.rep.goal(s, p99 < 100, "issue 31", "p99 of a page of 500 deliveries of one endpoint among %s log records under 100 ms: %%GOAL%% (p99 %s ms).", num(float64(records1M)), ms(p99))

	// 2. Watch: a new outcome of orders, from its storing to its event.
	progress("data-api: %d outcomes seen by a watch", watches)
	first, err := page(ctx, "")
	if err != nil {
		return nil, err
	}
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer wcancel()
	w, err := client.Get().Namespace(dataAPINamespace).Resource(datav1alpha1.ResourceDeliveries).
		Param("fieldSelector", datav1alpha1.FieldEndpoint+"=orders").Param("watch", "true").
		Param("resourceVersion", first.ResourceVersion).Watch(wctx)
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var wlat []float64
	for i := range watches {
		id := fmt.Sprintf("evt_watch_%d", i)
		rec := records.LogRecord{DeliveryID: records.DeliveryID(id, dataAPINamespace, "orders"), EventID: id, EventType: "order.created",
			Namespace: dataAPINamespace, Endpoint: "orders", Attempt: 1, State: records.StateSucceeded, Time: time.Now().UTC(), Response: records.Response{StatusCode: 204}}
		t0 := time.Now()
		if _, err := js.PublishMsg(ctx, records.LogBatch(set.AttemptSubject("orders"), []records.LogEntry{records.EncodeLog(&rec, nil)})); err != nil {
			return nil, err
		}
		deadline := time.After(30 * time.Second)
	wait:
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					return nil, fmt.Errorf("the watch ended")
				}
				if d, ok := ev.Object.(*datav1alpha1.WebhookDelivery); ok && d.Name == rec.DeliveryID {
					wlat = append(wlat, float64(time.Since(t0).Microseconds())/1000)
					break wait
				}
			case <-deadline:
				return nil, fmt.Errorf("the watch did not see %s within 30s", rec.DeliveryID)
			}
		}
	}
	sort.Float64s(wlat)
	s.printf("")
	s.table([]string{"measurement", "outcomes", "p50 ms", "p99 ms", "max ms"},
		[][]string{{"watch (spec.endpoint=orders): outcome stored → event received", strconv.Itoa(watches), ms(percentile(wlat, 50)), ms(percentile(wlat, 99)), ms(percentile(wlat, 100))}})
	b.rep.goal(s, percentile(wlat, 100) < 1000, "issue 31", "a watch sees an outcome within 1 s of its logging: %%GOAL%% (slowest of %d: %s ms).", watches, ms(percentile(wlat, 100)))

	// 3. Memory with 100 clients listing at once, each following the pages of orders.
	progress("data-api: %d clients listing for %s", clients, listFor)
	before, err := sampleProc(srv.pid())
	if err != nil {
		return nil, err
	}
	lctx, lcancel := context.WithTimeout(ctx, listFor)
	defer lcancel()
	var served, failed atomic.Int64
	var maxRSS, maxAnon atomic.Int64
	idleAnon := procAnon(srv.pid())
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cont := ""
			for lctx.Err() == nil {
				l, err := page(lctx, cont)
				if err != nil {
					if lctx.Err() == nil {
						failed.Add(1)
					}
					cont = ""
					continue
				}
				served.Add(1)
				cont = l.Continue
			}
		}()
	}
	tick := time.NewTicker(100 * time.Millisecond)
	for lctx.Err() == nil {
		select {
		case <-tick.C:
			if p, err := sampleProc(srv.pid()); err == nil && p.RSS > maxRSS.Load() {
				maxRSS.Store(p.RSS)
			}
			if a := procAnon(srv.pid()); a > maxAnon.Load() {
				maxAnon.Store(a)
			}
		case <-lctx.Done():
		}
	}
	tick.Stop()
	wg.Wait()
	hwm := procHWM(srv.pid())
	mib := func(v int64) string { return fmt.Sprintf("%.1f", float64(v)/(1<<20)) }
	s.printf("")
	s.table([]string{"measurement", "clients", "pages served", "failed", "RSS at start MiB", "RSS before MiB", "max RSS sampled MiB", "VmHWM MiB",
		"anonymous before MiB", "max anonymous sampled MiB"},
		[][]string{{fmt.Sprintf("clients listing pages of 500 for %s", listFor), strconv.Itoa(clients), strconv.FormatInt(served.Load(), 10),
			strconv.FormatInt(failed.Load(), 10), mib(idle.RSS), mib(before.RSS), mib(maxRSS.Load()), mib(hwm), mib(idleAnon), mib(maxAnon.Load())}})
	s.printf("")
	s.printf("The server is the binary `make build` builds, run as the chart runs it (`webhook-operator apiserver`, GOMEMLIMIT=%s from the container's memory limit). RSS is its anonymous memory (heap, stacks, the Go runtime: what it allocates) plus the executable's pages it touched (file-backed, clean, shared with every process of the same binary on the node, reclaimable by the kernel).", mib(chartAPIServerMemoryLimit)+"MiB")
	s.printf("The server reads the streams for at most %d requests at once (dataapi.MaxConcurrentReads); the others wait their turn. Without that bound the same run peaked at 387 MiB (-quick, 100 clients).", dataapi.MaxConcurrentReads)
	peak := max(maxRSS.Load(), hwm)
	b.rep.goal(s, peak < 128<<20 && failed.Load() == 0, "issue 31", "the server's memory with %d clients listing under 128 MiB: %%GOAL%% (peak %s MiB, %d failed requests).", clients, mib(peak), failed.Load())
	s.printf("")
	s.printf("Reproduce: `make bench BENCH_FLAGS='-run data-api'` (`-quick`: 100,000 records).")
	return s, nil
}

// procAnon is a process's resident anonymous memory (smaps_rollup's Anonymous), 0 when
// unreadable.
func procAnon(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	var kb int64
	for _, l := range strings.Split(string(b), "\n") {
		if _, err := fmt.Sscanf(l, "Anonymous: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	return 0
}

// procHWM is a process's peak resident memory (VmHWM), 0 when unreadable.
func procHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	var kb int64
	for _, l := range strings.Split(string(b), "\n") {
		if _, err := fmt.Sscanf(l, "VmHWM: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	return 0
}

// chartAPIServerMemoryLimit is the chart's memory limit of the data API server
// (apiserver.resources.limits.memory), which the chart gives the server as GOMEMLIMIT.
const chartAPIServerMemoryLimit = 256 << 20

// waitServing waits until the server on port answers (TLS; any HTTP answer will do), or its
// process ends.
func waitServing(ctx context.Context, port int, p *proc) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if resp, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d/livez", port)); err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("it exited: %v", p.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("not serving on port %d after a minute", port)
}
