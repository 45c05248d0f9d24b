package harness

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// rawStream holds the messages of the raw JetStream and naive-loop baselines: a work queue
// with the same storage as the deliveries stream.
const rawStream = "BENCHRAW"

// world is one bench run's real parts.
type world struct {
	o          Options
	dir        string
	cp         *testenv.ControlPlane
	k8s        client.Client
	kubeconfig string
	nats       *proc
	natsURL    string
	// natsDebug serves nats-server's /debug/pprof.
	natsDebug string
	nc        *nats.Conn
	js        jetstream.JetStream
	cfg       opconfig.Config
	seq       int
	// endpoints created per namespace, so retire can remove their consumers.
	endpoints map[string][]string
	// dispatcherEnv is added to the environment of the dispatchers started (OTEL_*);
	// traceparent makes every published event carry a producer's trace context.
	dispatcherEnv []string
	traceparent   bool
	// sinkSetup, when set, changes the spec of dispatcherRun's measured endpoint (and creates
	// what it needs in the namespace) before it is created.
	sinkSetup func(ctx context.Context, ns string, spec *v1alpha1.WebhookEndpointSpec) error
}

func newWorld(ctx context.Context, o Options) (*world, error) {
	dir, err := os.MkdirTemp("", "webhook-operator-bench-")
	if err != nil {
		return nil, err
	}
	w := &world{o: o, dir: dir, cfg: opconfig.Default(), endpoints: map[string][]string{}}
	// The throughput profile run publishes 150,000 events of 1 KB before the dispatcher starts:
	// more than the default bounds of a namespace's events stream and log (128 MiB each), which
	// would drop the oldest events before they are routed.
	w.cfg.Streams.EventsMaxBytes, w.cfg.Streams.AttemptsMaxBytes = 1<<30, 1<<30
	if err := useOwnCopy(dir); err != nil {
		return nil, err
	}
	progress("starting the control plane (kube-apiserver, etcd) and nats-server; logs in %s", dir)
	if w.cp, err = testenv.StartControlPlane(); err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(w.cp.Config)
	rc.QPS = -1 // the harness creates thousands of objects; no client-side throttling
	if w.k8s, err = client.New(rc, client.Options{Scheme: scheme.New()}); err != nil {
		w.close()
		return nil, err
	}
	if w.kubeconfig, err = w.cp.WriteKubeconfig(dir); err != nil {
		w.close()
		return nil, err
	}
	if w.nats, err = startChild(dir, "nats-server", nil, "nats", "-store", filepath.Join(dir, "nats")); err != nil {
		w.close()
		return nil, err
	}
	if w.natsDebug, err = w.nats.line("DEBUG", time.Minute); err != nil {
		w.close()
		return nil, err
	}
	if w.natsURL, err = w.nats.line("READY", time.Minute); err != nil {
		w.close()
		return nil, err
	}
	w.cfg.NATS.URL = w.natsURL
	if w.nc, err = nats.Connect(w.natsURL, nats.MaxReconnects(-1)); err != nil {
		w.close()
		return nil, err
	}
	if w.js, err = jetstream.New(w.nc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		w.close()
		return nil, err
	}
	if _, err := w.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: rawStream, Subjects: []string{"benchraw.>"}, Retention: jetstream.WorkQueuePolicy,
		Storage: w.cfg.Streams.Storage, Replicas: 1, MaxConsumers: -1,
	}); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

func (w *world) close() {
	if w.nc != nil {
		w.nc.Close()
	}
	if w.nats != nil {
		_ = w.nats.stop(30 * time.Second)
	}
	if w.cp != nil {
		_ = w.cp.Stop()
	}
}

// removeDir removes the logs and storage of a run that went well.
func (w *world) removeDir() { _ = os.RemoveAll(w.dir) }

// namespace creates a fresh namespace.
func (w *world) namespace(ctx context.Context, prefix string) (string, error) {
	w.seq++
	name := fmt.Sprintf("%s-%d", prefix, w.seq)
	return name, w.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// endpoint is one WebhookEndpoint to create.
type endpoint struct {
	name string
	spec v1alpha1.WebhookEndpointSpec
}

// createEndpoints creates endpoints as the controller would wire them: the signing Secret, the
// WebhookEndpoint and its durable consumers on the events and deliveries streams.
func (w *world) createEndpoints(ctx context.Context, ns string, eps []endpoint) error {
	if err := w.cfg.Streams.For(ns).Ensure(ctx, w.js); err != nil {
		return err
	}
	const parallel = 16
	work := make(chan endpoint)
	errs := make(chan error, parallel)
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ep := range work {
				if err := w.createEndpoint(ctx, ns, ep); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for _, ep := range eps {
		w.endpoints[ns] = append(w.endpoints[ns], ep.name)
		work <- ep
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	return nil
}

func (w *world) createEndpoint(ctx context.Context, ns string, ep endpoint) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ep.name + "-signing",
		Annotations: map[string]string{consent.AllowedEndpoints: ep.name}}, StringData: map[string]string{"secret": newSecret()}}
	if err := w.k8s.Create(ctx, s); err != nil {
		return err
	}
	obj := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ep.name}, Spec: ep.spec}
	if err := w.k8s.Create(ctx, obj); err != nil {
		return err
	}
	set := w.cfg.Streams.For(ns)
	if streams.LaneOf(&obj.Spec) == streams.LaneShared {
		// As the controller does: the namespace's intake and queue consumers, and the
		// endpoint's place on the shared lane from its creation.
		if err := set.EnsureSharedLane(ctx, w.js, obj.CreationTimestamp.Time); err != nil {
			return err
		}
		patch := client.MergeFrom(obj.DeepCopy())
		obj.Status.Lane, obj.Status.SharedSince = streams.LaneShared.String(), &obj.CreationTimestamp
		return w.k8s.Status().Patch(ctx, obj, patch)
	}
	opts := streams.EndpointConsumerOptionsFor(&obj.Spec)
	if err := set.EnsureDeliveriesConsumer(ctx, w.js, ep.name, opts); err != nil {
		return err
	}
	return set.EnsureEventsConsumer(ctx, w.js, ns, ep.name, streams.EventPatterns(&obj.Spec), opts, streams.ConsumerStart{Time: obj.CreationTimestamp.Time})
}

// retire removes what a finished run left in JetStream: its namespace's streams and bucket,
// with their consumers and the deliveries and scheduled retries still waiting, so every run
// starts from the same server state (consumers and schedules left behind would cost later runs).
func (w *world) retire(ctx context.Context, ns string) {
	delete(w.endpoints, ns)
	_ = w.cfg.Streams.For(ns).Delete(ctx, w.js)
}

func (w *world) retryPolicy(ctx context.Context, ns, name string, spec v1alpha1.RetryPolicySpec) error {
	return w.k8s.Create(ctx, &v1alpha1.RetryPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec})
}

// circuitState reads the circuit state the dispatcher wrote to an endpoint's status.
func (w *world) circuitState(ctx context.Context, ns, name string) string {
	var ep v1alpha1.WebhookEndpoint
	if err := w.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &ep); err != nil || ep.Status.Health == nil {
		return ""
	}
	return string(ep.Status.Health.CircuitState)
}

// publish publishes n events of eventType in ns, ids <tag>-<from+i>, each body stamped with
// the time of its publication. It returns when every event is stored.
func (w *world) publish(ctx context.Context, ns, eventType, tag string, from, n int) error {
	return w.publishTo(ctx, w.cfg.Streams.For(ns).EventSubject(eventType), tag, from, n)
}

func (w *world) publishTo(ctx context.Context, subject, tag string, from, n int) error {
	futures := make([]jetstream.PubAckFuture, 0, 1024)
	for i := from; i < from+n; i++ {
		m := nats.NewMsg(subject)
		m.Header.Set(records.HeaderMsgID, fmt.Sprintf("%s-%d", tag, i))
		if w.traceparent {
			m.Header.Set(records.HeaderTraceParent, fmt.Sprintf("00-%032x-%016x-01", i+1, i+1))
		}
		m.Data = eventBody(tag, i, time.Now())
		f, err := w.js.PublishMsgAsync(m)
		if err != nil {
			return err
		}
		futures = append(futures, f)
		if len(futures) == cap(futures) {
			if err := waitFutures(ctx, futures); err != nil {
				return err
			}
			futures = futures[:0]
		}
	}
	return waitFutures(ctx, futures)
}

func waitFutures(ctx context.Context, fs []jetstream.PubAckFuture) error {
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	for _, f := range fs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return errors.New("no publish acknowledgement within a minute")
		}
	}
	return nil
}

// rawConsumer creates a consumer on the raw stream shaped like an endpoint's (explicit acks,
// MaxAckPending = concurrency) over the subject benchraw.<name>.
func (w *world) rawConsumer(ctx context.Context, name string, maxAck int) error {
	_, err := w.js.CreateOrUpdateConsumer(ctx, rawStream, jetstream.ConsumerConfig{
		Durable: name, FilterSubject: "benchraw." + name, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 40 * time.Second, MaxDeliver: -1, MaxAckPending: maxAck, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	return err
}

// dispatcherProc is a dispatcher child process.
type dispatcherProc struct {
	*proc
	debug string
}

// startReplicas starts n replicas of namespace ns's dispatcher, identities <tag>-<i>.
func (w *world) startReplicas(ns, tag string, n int) ([]*dispatcherProc, error) {
	var out []*dispatcherProc
	for i := range max(n, 1) {
		id := fmt.Sprintf("%s-%d", tag, i)
		d, err := w.startDispatcher(ns, "-identity", id, "-replicas", strconv.Itoa(n), "-log-name", id)
		if err != nil {
			for _, d := range out {
				d.kill()
			}
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (w *world) startDispatcher(ns string, extra ...string) (*dispatcherProc, error) {
	args := append([]string{"dispatcher", "-namespace", ns, "-nats", w.natsURL}, extra...)
	logName := "dispatcher-" + ns
	for i := 0; i+1 < len(extra); i++ {
		if extra[i] == "-log-name" {
			logName += "-" + extra[i+1]
		}
	}
	p, err := startChild(w.dir, logName, append([]string{"KUBECONFIG=" + w.kubeconfig}, w.dispatcherEnv...), args...)
	if err != nil {
		return nil, err
	}
	debug, err := p.line("DEBUG", 30*time.Second)
	if err != nil {
		p.kill()
		return nil, err
	}
	return &dispatcherProc{proc: p, debug: debug}, nil
}

func (d *dispatcherProc) stats() (memStats, error) {
	var m memStats
	resp, err := http.Get("http://" + d.debug + "/stats")
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	return m, json.NewDecoder(resp.Body).Decode(&m)
}

// mallocs is how many heap objects the dispatcher has allocated since it started.
func (d *dispatcherProc) mallocs() (uint64, error) {
	resp, err := http.Get("http://" + d.debug + "/mallocs")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// fetch saves a /debug/pprof profile to path.
func (d *dispatcherProc) fetch(query, path string) error { return fetchPprof(d.debug, query, path) }

// fetchPprof saves the /debug/pprof profile of the process serving it on addr to path.
func fetchPprof(addr, query, path string) error {
	cl := &http.Client{Timeout: 2 * time.Minute}
	resp, err := cl.Get("http://" + addr + "/debug/pprof/" + query)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof %s: %s", query, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// waits samples the dispatcher's goroutines samples times, every interval, and counts where
// in-flight deliveries are (see waitSummary).
func (d *dispatcherProc) waits(samples int, every time.Duration) map[string]int {
	out := map[string]int{}
	cl := &http.Client{Timeout: 30 * time.Second}
	for range samples {
		time.Sleep(every)
		resp, err := cl.Get("http://" + d.debug + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			waitSummary(string(b), out)
		}
	}
	return out
}

// waitTable renders waits as rows: where, goroutines, share.
func waitTable(s *section, waits map[string]int, samples int) {
	total := 0
	for _, v := range waits {
		total += v
	}
	var rows [][]string
	for _, k := range sortedByCount(waits) {
		rows = append(rows, []string{"`" + k + "`", fmt.Sprint(waits[k]), fmt.Sprintf("%.0f%%", 100*float64(waits[k])/float64(max(1, total)))})
	}
	s.table([]string{"where (innermost dispatcher function → what it called)", fmt.Sprintf("goroutines (%d samples)", samples), "share"}, rows)
}

// window is what a receiver saw of one tag until it had every expected delivery (or time ran
// out), with the CPU each watched process used in between.
type window struct {
	want, unique, ok int
	reached          bool
	first, last      time.Time
	// cpu each watched process used between the first arrival and completion, over wall.
	cpu  map[string]time.Duration
	wall time.Duration
	// delivered between the two CPU samples.
	sampled int
	// others is the CPU the rest of the machine used meanwhile, in cores.
	others float64
}

// rate is distinct deliveries per second between the first and the last arrival.
func (m window) rate() float64 {
	d := m.last.Sub(m.first).Seconds()
	if m.unique < 2 || d <= 0 {
		return 0
	}
	return float64(m.unique-1) / d
}

// await polls r until tag has want distinct accepted deliveries or timeout passes.
func await(ctx context.Context, r *receiver, tag string, want int, timeout time.Duration, watch map[string]int) window {
	m := window{want: want, cpu: map[string]time.Duration{}}
	deadline := time.Now().Add(timeout)
	var t0 time.Time
	var at0 int
	var s0 map[string]procSample
	var load meter
	sample := func() map[string]procSample {
		out := map[string]procSample{}
		for name, pid := range watch {
			if s, err := sampleProc(pid); err == nil {
				out[name] = s
			}
		}
		return out
	}
	for {
		_, unique, _ := r.counts(tag)
		if unique > 0 && s0 == nil {
			s0, t0, at0, load = sample(), time.Now(), unique, startMeter()
		}
		if unique >= want || time.Now().After(deadline) || ctx.Err() != nil {
			m.reached = unique >= want
			if s0 != nil {
				s1 := sample()
				m.wall = time.Since(t0)
				m.sampled = unique - at0
				m.others = load.others()
				for name, a := range s0 {
					if b, ok := s1[name]; ok {
						m.cpu[name] = b.CPU - a.CPU
					}
				}
			}
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	m.first, m.last, _ = r.span(tag)
	m.ok, m.unique, _ = r.counts(tag)
	return m
}

func progress(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
}

func ptr[T any](v T) *T { return &v }

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

// stallWatch notices when a tag's deliveries stop arriving for stallAfter or more before all
// want have arrived, and calls onStall once per stall.
type stallWatch struct {
	mu     sync.Mutex
	stalls []time.Duration
	stop   chan struct{}
	done   chan struct{}
}

const stallAfter = 5 * time.Second

func watchStalls(r *receiver, tag string, want int, onStall func()) *stallWatch {
	sw := &stallWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(sw.done)
		last, lastAt, in := -1, time.Now(), false
		record := func() {
			if in {
				sw.mu.Lock()
				sw.stalls = append(sw.stalls, time.Since(lastAt))
				sw.mu.Unlock()
			}
		}
		for {
			select {
			case <-sw.stop:
				record()
				return
			case <-time.After(250 * time.Millisecond):
			}
			_, u, _ := r.counts(tag)
			if u >= want {
				record()
				return
			}
			if u != last {
				record()
				last, lastAt, in = u, time.Now(), false
				continue
			}
			if u > 0 && !in && time.Since(lastAt) >= stallAfter {
				in = true
				if onStall != nil {
					onStall()
				}
			}
		}
	}()
	return sw
}

// end stops watching and returns the stalls' lengths.
func (sw *stallWatch) end() []time.Duration {
	select {
	case <-sw.done:
	default:
		close(sw.stop)
		<-sw.done
	}
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return sw.stalls
}
