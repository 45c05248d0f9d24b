package harness

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// The scale-endpoints scenario (issue 32; issue 33 runs it with many namespaces): the whole
// product as an installation runs it, at a given number of endpoints, with the figures that
// grow with endpoints and namespaces. Each count is a fresh installation:
//
//   - nats-server processes (the module's version, GoBuild) clustered on loopback, streams and
//     consumers with -se-replicas replicas, each server with its monitoring and profiling port,
//     so that its memory, CPU, goroutines, store files and JetStream assets are its own;
//   - a kube-apiserver and etcd, the real controller (`webhook-operator controller`) and every
//     dispatcher Deployment's replica as processes (internal/localstack, in auth-callout mode
//     over TLS, as an installation runs);
//   - N WebhookEndpoints in M namespaces, applied as a user would (the controller makes their
//     Secrets and consumers); a fraction of them receives events, a few of those fail (500)
//     and a few answer after 10s.

// seConfig sizes one installation of the scenario.
type seConfig struct {
	// Endpoints in Namespaces namespaces (spread evenly).
	Endpoints, Namespaces int
	// Servers nats-servers; streams and consumers with Replicas replicas.
	Servers, Replicas int
	// Active is the fraction of endpoints that receive events; Dead and Slow the fractions of
	// those that answer 500 and that answer after SlowAnswer (at least one each when set).
	Active, Dead, Slow float64
	SlowAnswer         time.Duration
	// Reference adds a namespace with one idle endpoint, whose dispatcher is the baseline of
	// the dispatchers' memory per idle endpoint.
	Reference bool
	// ReadyTimeout bounds the wait for every endpoint to be Ready.
	ReadyTimeout time.Duration
	// Idle is the quiet window (idle CPU, status writes); 0 skips it.
	Idle time.Duration
	// Restarts is how many servers are stopped and started again, one after the other.
	Restarts int
	// StopGrace bounds a server's graceful stop.
	StopGrace time.Duration
	// Rates are the offered rates (events/s over the healthy active endpoints) of the latency
	// phases, each offered for Phase; the first is the isolation phases' baseline. HotRate is
	// the hot endpoint's rate (0: no hot phase). Phase 0 skips the traffic.
	Rates   []int
	HotRate int
	Phase   time.Duration
	// OperatorBinary is webhook-operator, NATSBinary nats-server.
	OperatorBinary, NATSBinary string
	// Dir holds the installation (configurations, storage, logs).
	Dir string
	// ControllerHeap, when set, is where the controller's heap profile is saved after the
	// quiet window (its /debug/pprof, served on loopback for the scenario).
	ControllerHeap string
	// Shared runs the controller with --shared-dispatcher: the shared dispatcher's replicas
	// serve every namespace (their processes count as the dispatchers).
	Shared bool
	// IdleAfter is the shared dispatcher's --idle-after (0: namespaces never sleep).
	IdleAfter time.Duration
}

// seTag is the server tag of the bench's NATS servers, where the streams are placed.
const seTag = "bench"

// seClass is what an endpoint does in the scenario.
type seClass int

const (
	seIdle    seClass = iota // receives nothing
	seHealthy                // receives events, answers 200 at once
	seHot                    // receives events at HotRate
	seDead                   // receives events, answers 500
	seSlow                   // receives events, answers 200 after SlowAnswer
)

// seEndpoint is one WebhookEndpoint of the scenario.
type seEndpoint struct {
	ns, name string
	class    seClass
}

// seNamespaces are the scenario's namespace names.
func seNamespaces(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("se-%04d", i)
	}
	return out
}

// spread divides total into n shares differing by at most one, the larger first.
func spread(total, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = total / n
		if i < total%n {
			out[i]++
		}
	}
	return out
}

// atLeastOne is round(n*f), but at least 1 when f > 0 and n > 0.
func atLeastOne(n int, f float64) int {
	if f <= 0 || n <= 0 {
		return 0
	}
	return max(1, int(math.Round(float64(n)*f)))
}

// seLayout places the endpoints: each namespace's first endpoints are its active ones (the
// active fraction spread over the namespaces); the hot endpoint is namespace 0's first; the
// dead and slow ones are the last active endpoints of the namespaces in turn.
func seLayout(c seConfig) []seEndpoint {
	nss := seNamespaces(c.Namespaces)
	if c.Endpoints == 0 || len(nss) == 0 {
		return nil
	}
	perNS := spread(c.Endpoints, len(nss))
	active := spread(atLeastOne(c.Endpoints, c.Active), len(nss))
	var eps []seEndpoint
	first := make([]int, len(nss)) // index in eps of each namespace's first endpoint
	for i, ns := range nss {
		first[i] = len(eps)
		for j := range perNS[i] {
			class := seIdle
			if j < min(active[i], perNS[i]) {
				class = seHealthy
			}
			eps = append(eps, seEndpoint{ns: ns, name: fmt.Sprintf("e%06d", len(eps)), class: class})
		}
	}
	if c.HotRate > 0 && eps[0].class == seHealthy {
		eps[0].class = seHot
	}
	total := 0
	for _, a := range active {
		total += a
	}
	// The last healthy endpoint of each namespace in turn becomes dead or slow, as long as a
	// namespace keeps one healthy endpoint.
	next := make([]int, len(nss)) // how many of each namespace's active endpoints are taken
	turn := 0
	take := func(class seClass) {
		for range len(nss) {
			i := turn % len(nss)
			turn++
			a := min(active[i], perNS[i])
			if a-next[i] < 2 {
				continue
			}
			next[i]++
			eps[first[i]+a-next[i]].class = class
			return
		}
	}
	for range atLeastOne(total, c.Dead) {
		take(seDead)
	}
	for range atLeastOne(total, c.Slow) {
		take(seSlow)
	}
	return eps
}

// seInstall is one running installation of the scenario.
type seInstall struct {
	c       seConfig
	logf    func(string, ...any)
	logFile *os.File
	cluster *testenv.NATSCluster
	stack   *localstack.Stack
	k8s     client.Client
	cs      kubernetes.Interface
	watched cache.Cache
	stopW   context.CancelFunc
	nc      *nats.Conn
	js      jetstream.JetStream
	eps     []seEndpoint
	ok      *receiver
	dead    *receiver
	slow    *receiver
	// controllerPprof is the controller's /debug/pprof address (ControllerHeap set).
	controllerPprof string
}

// quietControllerRuntime gives controller-runtime's global logger (the envtest control
// plane's, the pod runner's, the harness's watch) a sink that drops what it logs, once: the
// processes' own logs are in the installation's directory.
var quietControllerRuntime sync.Once

// startSE starts the NATS servers, the control plane, the controller and the receivers.
func startSE(ctx context.Context, c seConfig) (_ *seInstall, err error) {
	quietControllerRuntime.Do(func() { ctrllog.SetLogger(logr.Discard()) })
	in := &seInstall{c: c, eps: seLayout(c)}
	defer func() {
		if err != nil {
			in.close()
		}
	}()
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, err
	}
	if in.logFile, err = os.Create(filepath.Join(c.Dir, "install.log")); err != nil {
		return nil, err
	}
	var logMu sync.Mutex
	in.logf = func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintf(in.logFile, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
	}
	auth, err := testenv.NewNATSAuth(streams.DefaultNames())
	if err != nil {
		return nil, err
	}
	if err := auth.WithTLS(filepath.Join(c.Dir, "tls")); err != nil {
		return nil, err
	}
	// Every namespace's streams reserve their byte bounds in each server's storage (the
	// reference namespace's and the installation's too): room for all of them.
	perNamespace := streams.DefaultConfig().For(seNamespaces(1)[0]).Reservation()
	store := max(8<<30, int64(c.Namespaces+2)*perNamespace+1<<30)
	if in.cluster, err = testenv.StartNATSCluster(testenv.NATSClusterOptions{Binary: c.NATSBinary, Dir: filepath.Join(c.Dir, "nats"),
		Size: c.Servers, Auth: auth, Name: "bench", Tag: seTag, Profile: true, StopGrace: c.StopGrace, MaxFileStore: store, Logf: in.logf}); err != nil {
		return nil, err
	}
	args := []string{"--allow-http", "--allowed-cidrs=127.0.0.0/8", fmt.Sprintf("--stream-replicas=%d", c.Replicas)}
	if c.ControllerHeap != "" {
		port, err := testenv.FreePort()
		if err != nil {
			return nil, err
		}
		in.controllerPprof = fmt.Sprintf("127.0.0.1:%d", port)
		args = append(args, "--pprof-bind-address="+in.controllerPprof)
	}
	if c.Servers > 1 {
		args = append(args, "--stream-placement-tags="+seTag)
	}
	if c.Shared {
		args = append(args, "--shared-dispatcher", "--shared-dispatcher-idle-after="+c.IdleAfter.String())
	}
	if in.stack, err = localstack.Start(ctx, localstack.Options{Dir: filepath.Join(c.Dir, "stack"), Binary: c.OperatorBinary,
		NATSURL: in.cluster.URLs(), NATSAuth: auth, ControllerArgs: args, Logf: in.logf, Grace: 10 * time.Second}); err != nil {
		return nil, err
	}
	rc := rest.CopyConfig(in.stack.ControlPlane.Config)
	rc.QPS = -1 // thousands of objects; no client-side throttling of the harness
	if in.k8s, err = client.New(rc, client.Options{Scheme: scheme.New()}); err != nil {
		return nil, err
	}
	if in.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, err
	}
	// The endpoints are counted from a watch, so that counting costs the API server nothing.
	if in.watched, err = cache.New(rc, cache.Options{Scheme: scheme.New(), ByObject: map[client.Object]cache.ByObject{}}); err != nil {
		return nil, err
	}
	if _, err := in.watched.GetInformer(ctx, &v1alpha1.WebhookEndpoint{}); err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	in.stopW = stop
	go func() { _ = in.watched.Start(wctx) }()
	if !in.watched.WaitForCacheSync(ctx) {
		return nil, errors.New("the harness's watch of WebhookEndpoints did not sync")
	}
	if in.nc, in.js, err = in.stack.ConnectAdmin(); err != nil {
		return nil, err
	}
	if in.js, err = jetstream.New(in.nc, jetstream.WithPublishAsyncMaxPending(16384)); err != nil {
		return nil, err
	}
	if in.ok, err = newReceiver("se-ok", nil); err != nil {
		return nil, err
	}
	if in.dead, err = newReceiver("se-dead", func(string) int { return http.StatusInternalServerError }); err != nil {
		return nil, err
	}
	if in.slow, err = newReceiver("se-slow", nil); err != nil {
		return nil, err
	}
	slow := in.slow
	slow.SetResponder(func(req testenv.Request) testenv.Response {
		r := slow.respond(req)
		r.Delay = c.SlowAnswer
		return r
	})
	return in, nil
}

// close stops everything the installation started and waits until it is gone.
func (in *seInstall) close() {
	if in.nc != nil {
		in.nc.Close()
	}
	if in.stopW != nil {
		in.stopW()
	}
	if in.stack != nil {
		if err := in.stack.Stop(); err != nil {
			in.logf("stopping the stack: %v", err)
		}
	}
	if in.cluster != nil {
		// Graceful stops were measured; the storage is thrown away.
		for _, n := range in.cluster.Nodes {
			n.Kill()
		}
	}
	for _, r := range []*receiver{in.ok, in.dead, in.slow} {
		if r != nil {
			r.Close()
		}
	}
	if in.logFile != nil {
		in.logFile.Close()
	}
}

// spec is an endpoint's WebhookEndpoint spec: its own event types (`<name>.>`), a path of its
// own on the receiver of its class.
func (in *seInstall) spec(ep seEndpoint) v1alpha1.WebhookEndpointSpec {
	r := in.ok
	switch ep.class {
	case seDead:
		r = in.dead
	case seSlow:
		r = in.slow
	}
	s := v1alpha1.WebhookEndpointSpec{URL: r.URLWithPath("/" + ep.ns + "/" + ep.name), EventTypes: []v1alpha1.EventTypePattern{v1alpha1.EventTypePattern(ep.name + ".>")}}
	if ep.class == seSlow {
		s.Timeout = dur(in.c.SlowAnswer + 5*time.Second) // slow, not failing
	}
	return s
}

// seResult is what one installation measured.
type seResult struct {
	c seConfig
	// applied: every WebhookEndpoint created; consumers: the last time the count of consumers
	// on server n1 grew before every endpoint was Ready; ready: every endpoint Ready. All
	// from the first create.
	applied, consumers, ready time.Duration
	readyCount, total         int
	// applyAPI is how many JetStream API requests the servers answered from the first create
	// until every endpoint was Ready (jsAPIRequests; 0: not read).
	applyAPI int64
	// applyCPU is the CPU each part spent from the first create until every endpoint was Ready
	// (seconds: kube-apiserver, etcd, controller, dispatchers, nats-servers); applyRequests
	// the API server's requests meanwhile by "VERB resource[/subresource]" (apiRequests).
	applyCPU      map[string]float64
	applyRequests map[string]float64
	// settle is the wait after every endpoint was Ready until the status writes stopped.
	settle time.Duration
	// sleep: the shared dispatcher's sleeping namespaces (Shared, IdleAfter).
	sleep  sleepFigures
	assets brokerAssets
	// servers' figures, in the servers' order.
	servers []serverFigures
	// idle window: its load averages before and after, the others' CPU meanwhile (cores),
	// and per process its CPU.
	idleLoad       [2]string
	idleOthers     float64
	controllerIdle float64
	dispatcherIdle float64 // all dispatchers together
	apiIdle        float64
	etcdIdle       float64
	// status writes to WebhookEndpoints (the status subresource) and other writes to them,
	// per minute over the idle window, from the API server's apiserver_request_total.
	statusWrites, otherWrites float64
	controllerRSS             int64
	controllerHeap            string // the path of its heap profile, when taken
	// dispatchers' RSS by namespace, the reference dispatcher's RSS (one endpoint).
	dispatcherRSS map[string]int64
	refRSS        int64
	restartLoad   string
	traffic       *seTraffic
	natsVersion   string
	// reached is the last stage measured in full: a run stopped before a stage (an error, a
	// timeout, an interrupt) leaves its goals unjudged, not met by zero figures.
	reached seStage
	stopped error
}

// seStage is how far a run got: each stage's figures are whole once it is reached.
type seStage int

const (
	seStarted     seStage = iota
	seAllReady            // every endpoint Ready: the apply figures
	seQuiet               // the quiet window: idle CPU, status writes
	seSnapshot            // the servers, the account's assets, the processes' memory
	seTrafficDone         // the traffic phases
)

// dispatchersRSS is every dispatcher's RSS together (the reference excepted).
func (r *seResult) dispatchersRSS() int64 {
	var t int64
	for _, v := range r.dispatcherRSS {
		t += v
	}
	return t
}

// perIdleEndpoint is the dispatchers' memory per endpoint: their mean RSS less the reference
// dispatcher's, over the mean endpoints per namespace (NaN without a reference).
func (r *seResult) perIdleEndpoint() float64 {
	if r.refRSS == 0 || len(r.dispatcherRSS) == 0 || r.c.Endpoints == 0 {
		return math.NaN()
	}
	mean := float64(r.dispatchersRSS()) / float64(len(r.dispatcherRSS))
	return (mean - float64(r.refRSS)) / (float64(r.c.Endpoints) / float64(len(r.dispatcherRSS)))
}

// runSE runs the scenario once: start, apply, wait for Ready, the quiet window, the figures,
// the restarts, the traffic; then it stops everything.
func runSE(ctx context.Context, c seConfig) (*seResult, error) {
	in, err := startSE(ctx, c)
	if err != nil {
		return nil, err
	}
	defer in.close()
	res, err := in.measure(ctx)
	if res != nil {
		res.stopped = err
	}
	return res, err
}

func (in *seInstall) measure(ctx context.Context) (*seResult, error) {
	c := in.c
	res := &seResult{c: c, total: len(in.eps), dispatcherRSS: map[string]int64{}}
	res.natsVersion = in.nc.ConnectedServerVersion()
	for _, n := range in.cluster.Nodes {
		res.servers = append(res.servers, serverFigures{name: n.Name, idleCores: math.NaN()})
	}
	nss := seNamespaces(c.Namespaces)
	if c.Endpoints == 0 {
		nss = nil
	}
	all := slices.Clone(nss)
	if c.Reference {
		all = append(all, "se-ref")
		res.total++
	}
	for _, ns := range all {
		if err := in.k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return nil, err
		}
	}
	if err := in.apply(ctx, res); err != nil {
		return res, err
	}
	progress("  %d endpoints applied in %s; consumers on n1 last grew after %s; %d Ready after %s",
		res.total, res.applied.Round(100*time.Millisecond), res.consumers.Round(100*time.Millisecond), res.readyCount, res.ready.Round(100*time.Millisecond))
	if res.readyCount < res.total {
		return res, fmt.Errorf("%d of %d endpoints Ready within %s (logs in %s)", res.readyCount, res.total, c.ReadyTimeout, c.Dir)
	}
	res.reached = seAllReady
	settled := time.Now()
	in.waitWritesQuiet(ctx, 5*time.Minute)
	res.settle = time.Since(settled)
	if err := in.untilAsleep(ctx, res); err != nil {
		return res, err
	}
	if err := in.idle(ctx, res); err != nil {
		return res, err
	}
	res.reached = seQuiet
	if err := in.wakeLatency(ctx, res); err != nil {
		return res, err
	}
	if err := in.snapshot(ctx, res); err != nil {
		return res, err
	}
	res.reached = seSnapshot
	if c.ControllerHeap != "" {
		if err := fetchPprof(in.controllerPprof, "heap?gc=1", c.ControllerHeap); err != nil {
			return res, fmt.Errorf("the controller's heap profile: %w", err)
		}
		res.controllerHeap = c.ControllerHeap
	}
	if err := in.restarts(ctx, res); err != nil {
		return res, err
	}
	if c.Phase > 0 {
		t, err := in.trafficPhases(ctx)
		res.traffic = t
		if err != nil {
			return res, err
		}
		res.reached = seTrafficDone
	}
	return res, nil
}

// apply creates every WebhookEndpoint (16 at a time) and waits until each is Ready, reading
// the consumers of server n1 and the Ready endpoints every second meanwhile.
func (in *seInstall) apply(ctx context.Context, res *seResult) error {
	eps := slices.Clone(in.eps)
	if in.c.Reference {
		eps = append(eps, seEndpoint{ns: "se-ref", name: "ref", class: seIdle})
	}
	apiBefore := in.jsAPIRequests()
	reqBefore, _ := in.apiRequests(ctx)
	cpuBefore := in.partsCPU()
	began := time.Now()
	// The timeline: consumers on n1 and Ready endpoints, every second.
	var lastGrowth time.Duration
	n1 := in.cluster.Nodes[0]
	lastCount := -1
	sample := func() (ready int) {
		if n, err := jszConsumers(n1); err == nil {
			if n > lastCount {
				lastCount, lastGrowth = n, time.Since(began)
			}
		}
		ready, _ = in.readyCount(ctx)
		return ready
	}
	work := make(chan seEndpoint)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ep := range work {
				obj := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ep.ns, Name: ep.name}, Spec: in.spec(ep)}
				if err := in.k8s.Create(ctx, obj); err != nil {
					select {
					case errs <- fmt.Errorf("creating %s/%s: %w", ep.ns, ep.name, err):
					default:
					}
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, ep := range eps {
			select {
			case work <- ep:
			case <-ctx.Done():
				close(work)
				return
			}
		}
		close(work)
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	applied := false
	deadline := began.Add(in.c.ReadyTimeout)
	for {
		select {
		case <-done:
			if !applied {
				wg.Wait()
				applied, res.applied = true, time.Since(began)
				select {
				case err := <-errs:
					return err
				default:
				}
			}
			done = nil
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		if !applied {
			sample()
			continue
		}
		ready := sample()
		if ready >= len(eps) || time.Now().After(deadline) {
			res.ready, res.readyCount, res.consumers = time.Since(began), ready, lastGrowth
			if apiBefore >= 0 {
				if after := in.jsAPIRequests(); after >= apiBefore {
					res.applyAPI = after - apiBefore
				}
			}
			res.applyCPU = map[string]float64{}
			for part, cpu := range in.partsCPU() {
				res.applyCPU[part] = (cpu - cpuBefore[part]).Seconds()
			}
			if reqAfter, err := in.apiRequests(ctx); err == nil && reqBefore != nil {
				res.applyRequests = map[string]float64{}
				for k, v := range reqAfter {
					if d := v - reqBefore[k]; d > 0 {
						res.applyRequests[k] = d
					}
				}
			}
			return nil
		}
	}
}

// jsAPIRequests is how many JetStream API requests the servers have answered so far (their
// /jsz api.total, summed): every client's, the controller's, the dispatchers' and the
// harness's. -1 when a server does not say.
func (in *seInstall) jsAPIRequests() int64 {
	var total int64
	for _, n := range in.cluster.Nodes {
		info, err := testenv.NATSJSZ(n.MonitorPort)
		if err != nil {
			return -1
		}
		total += int64(info.API.Total)
	}
	return total
}

// readyCount counts the WebhookEndpoints whose Ready condition is True, from the watch.
func (in *seInstall) readyCount(ctx context.Context) (int, error) {
	var list v1alpha1.WebhookEndpointList
	if err := in.watched.List(ctx, &list); err != nil {
		return 0, err
	}
	n := 0
	for i := range list.Items {
		if meta.IsStatusConditionTrue(list.Items[i].Status.Conditions, v1alpha1.ConditionReady) {
			n++
		}
	}
	return n, nil
}

// partsCPU is the CPU the installation's parts have used so far, by part (a dispatcher that
// has not started yet has used none).
func (in *seInstall) partsCPU() map[string]time.Duration {
	p := in.pids()
	out := map[string]time.Duration{}
	add := func(part string, pid int) {
		if pid == 0 {
			return
		}
		if s, err := sampleProc(pid); err == nil {
			out[part] += s.CPU
		}
	}
	add("kube-apiserver", p.api)
	add("etcd", p.etcd)
	add("controller", p.controller)
	for _, pid := range p.dispatchers {
		add("dispatchers", pid)
	}
	for _, pid := range p.servers {
		add("nats-servers", pid)
	}
	return out
}

// apiRequests reads the API server's requests so far (apiserver_request_total, watches and
// connects left out) by "VERB resource[/subresource]".
func (in *seInstall) apiRequests(ctx context.Context) (map[string]float64, error) {
	raw, err := in.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		return nil, err
	}
	f := fams["apiserver_request_total"]
	if f == nil {
		return nil, errors.New("the API server has no apiserver_request_total")
	}
	out := map[string]float64{}
	for _, m := range f.GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["verb"] == "WATCH" || l["verb"] == "CONNECT" || l["resource"] == "" {
			continue
		}
		k := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			k += "/" + l["subresource"]
		}
		out[k] += m.GetCounter().GetValue()
	}
	return out, nil
}

// endpointWrites reads the API server's count of writes to WebhookEndpoints so far: to the
// status subresource, and to the rest (finalizers, metadata).
func (in *seInstall) endpointWrites(ctx context.Context) (status, other float64, err error) {
	raw, err := in.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, 0, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		return 0, 0, err
	}
	f := fams["apiserver_request_total"]
	if f == nil {
		return 0, 0, errors.New("the API server has no apiserver_request_total")
	}
	for _, m := range f.GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["resource"] != "webhookendpoints" {
			continue
		}
		switch l["verb"] {
		case "GET", "LIST", "WATCH", "CONNECT":
			continue
		}
		if l["subresource"] == "status" {
			status += m.GetCounter().GetValue()
		} else {
			other += m.GetCounter().GetValue()
		}
	}
	return status, other, nil
}

// waitWritesQuiet waits until no status was written for 10s, or timeout passes.
func (in *seInstall) waitWritesQuiet(ctx context.Context, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	last, _, _ := in.endpointWrites(ctx)
	quiet := time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(2 * time.Second)
		now, _, err := in.endpointWrites(ctx)
		if err != nil {
			return
		}
		if now != last {
			last, quiet = now, time.Now()
		}
		if time.Since(quiet) >= 10*time.Second {
			return
		}
	}
}

// processes are the pids the scenario reads: the servers', the controller's, each
// dispatcher's (by namespace), the API server's and etcd's.
type sePIDs struct {
	servers     []int
	controller  int
	dispatchers map[string]int
	api, etcd   int
}

func (in *seInstall) pids() sePIDs {
	p := sePIDs{dispatchers: map[string]int{}, api: childByName("kube-apiserver"), etcd: childByName("etcd")}
	for _, n := range in.cluster.Nodes {
		p.servers = append(p.servers, n.PID())
	}
	if procs, err := localstack.Descendants(os.Getpid()); err == nil {
		for _, pr := range procs {
			if strings.HasPrefix(pr.Command, in.c.OperatorBinary+" controller") {
				p.controller = pr.PID
			}
		}
	}
	nss := seNamespaces(in.c.Namespaces)
	if in.c.Endpoints == 0 {
		nss = nil
	}
	if in.c.Reference {
		nss = append(nss, "se-ref")
	}
	for _, ns := range nss {
		for _, pid := range in.stack.Runner.Pods(ns, names.SharedDispatcher) {
			if pid != 0 {
				p.dispatchers[ns] = pid
			}
		}
	}
	// The shared dispatcher's replicas, by pod.
	for pod, pid := range in.stack.Runner.Pods(localstack.OperatorNamespace, names.SharedPool) {
		if pid != 0 {
			p.dispatchers[localstack.OperatorNamespace+"/"+pod] = pid
		}
	}
	return p
}

// idle measures the quiet window: every process's CPU, the status writes, the load.
func (in *seInstall) idle(ctx context.Context, res *seResult) error {
	if in.c.Idle <= 0 {
		return nil
	}
	p := in.pids()
	read := func() (map[int]procSample, float64, float64) {
		out := map[int]procSample{}
		ids := append(slices.Clone(p.servers), p.controller, p.api, p.etcd)
		for _, pid := range p.dispatchers {
			ids = append(ids, pid)
		}
		for _, pid := range ids {
			if s, err := sampleProc(pid); err == nil {
				out[pid] = s
			}
		}
		st, other, _ := in.endpointWrites(ctx)
		return out, st, other
	}
	progress("  quiet window of %s", in.c.Idle)
	res.idleLoad[0] = loadAvg()
	m := startMeter()
	s0, st0, ot0 := read()
	t0 := time.Now()
	select {
	case <-time.After(in.c.Idle):
	case <-ctx.Done():
		return ctx.Err()
	}
	s1, st1, ot1 := read()
	wall := time.Since(t0)
	res.idleOthers = m.others()
	res.idleLoad[1] = loadAvg()
	cpu := func(pid int) float64 {
		a, ok0 := s0[pid]
		b, ok1 := s1[pid]
		if !ok0 || !ok1 {
			return math.NaN()
		}
		return (b.CPU - a.CPU).Seconds() / wall.Seconds()
	}
	for i, pid := range p.servers {
		res.servers[i].idleCores = cpu(pid)
	}
	res.controllerIdle, res.apiIdle, res.etcdIdle = cpu(p.controller), cpu(p.api), cpu(p.etcd)
	for ns, pid := range p.dispatchers {
		if ns != "se-ref" {
			res.dispatcherIdle += cpu(pid)
		}
	}
	res.statusWrites = (st1 - st0) / wall.Minutes()
	res.otherWrites = (ot1 - ot0) / wall.Minutes()
	return nil
}

// snapshot reads every server, the account's assets and the processes' memory.
func (in *seInstall) snapshot(ctx context.Context, res *seResult) error {
	for i, n := range in.cluster.Nodes {
		f, err := readServer(n, in.cluster.ProfilePorts[i])
		if err != nil {
			return err
		}
		f.idleCores = res.servers[i].idleCores
		res.servers[i] = f
	}
	var err error
	if res.assets, err = readBrokerAssets(ctx, in.js); err != nil {
		return err
	}
	p := in.pids()
	if s, err := sampleProc(p.controller); err == nil {
		res.controllerRSS = s.RSS
	}
	for ns, pid := range p.dispatchers {
		s, err := sampleProc(pid)
		if err != nil {
			continue
		}
		if ns == "se-ref" {
			res.refRSS = s.RSS
		} else {
			res.dispatcherRSS[ns] = s.RSS
		}
	}
	return nil
}

// restarts stops servers one after the other (SIGTERM) and starts each again, timing the
// graceful stop and how long until its /healthz answers 200; before the next, every server
// is healthy again.
func (in *seInstall) restarts(ctx context.Context, res *seResult) error {
	res.restartLoad = loadAvg()
	for i := range min(in.c.Restarts, len(in.cluster.Nodes)) {
		n := in.cluster.Nodes[i]
		progress("  restarting %s", n.Name)
		took, graceful := n.Stop()
		began := time.Now()
		if err := n.Launch(); err != nil {
			return err
		}
		f := &res.servers[i]
		f.stop, f.graceful, f.restarted = took, graceful, true
		err := testenv.Poll(15*time.Minute, func() bool {
			if f.jsReady == 0 && n.WaitReady(time.Second) == nil {
				f.jsReady = time.Since(began)
			}
			return healthy(n.MonitorPort)
		})
		if err != nil {
			return fmt.Errorf("%s not healthy within 15 minutes of its restart: %w", n.Name, err)
		}
		f.ready = time.Since(began)
		progress("  %s: graceful stop %s, healthy %s after its start", n.Name, took.Round(100*time.Millisecond), f.ready.Round(100*time.Millisecond))
		if err := testenv.Poll(15*time.Minute, func() bool {
			for _, o := range in.cluster.Nodes {
				if !healthy(o.MonitorPort) {
					return false
				}
			}
			return true
		}); err != nil {
			return fmt.Errorf("the servers not all healthy within 15 minutes of %s's restart: %w", n.Name, err)
		}
	}
	return ctx.Err()
}

// seLatency is the publish → receipt latency of one group of deliveries.
type seLatency struct {
	sent, got     int
	p50, p99, max float64 // ms
	achieved      float64 // events/s offered
}

// latencyOf is the latency of the deliveries r accepted under tags, of sent published at
// achieved events/s.
func latencyOf(r *receiver, tags []string, sent int, achieved float64) seLatency {
	var lat []float64
	got := 0
	for _, tag := range tags {
		recv, pub := r.times(tag)
		for i := range recv {
			lat = append(lat, float64(recv[i]-pub[i])/1e6)
		}
		_, unique, _ := r.counts(tag)
		got += unique
	}
	slices.Sort(lat)
	return seLatency{sent: sent, got: got, p50: percentile(lat, 50), p99: percentile(lat, 99), max: percentile(lat, 100), achieved: achieved}
}

// seTraffic is what the traffic phases measured.
type seTraffic struct {
	healthy, neighbours int
	// rates: every healthy active endpoint at each offered rate.
	rates map[int]seLatency
	// base is the neighbours' (the healthy endpoints of the hot one's namespace) latency at
	// the first rate; hotNeighbours theirs beside the hot endpoint, hotOthers the other
	// healthy endpoints' meanwhile; hot the hot endpoint's own deliveries.
	base, hotNeighbours, hotOthers, hot seLatency
	// iso: the healthy endpoints while the dead and slow ones also receive events; dead
	// and slow count the requests they got.
	iso              seLatency
	deadN, slowN     int
	deadReq, slowReq int
	load             [2]string
}

// seTarget is one endpoint events are published to: its events subject and the receiver tag
// its deliveries are counted under.
type seTarget struct{ subject, tag string }

// pace publishes to targets in turn, rate events a second in all, for d, each event stamped
// with its publish time and tagged with its target's tag, ids <id>-<i>. It returns how many
// it published per tag and the rate achieved.
func pace(ctx context.Context, js jetstream.JetStream, id string, targets []seTarget, rate int, d time.Duration) (map[string]int, float64, error) {
	sent := map[string]int{}
	if len(targets) == 0 || rate <= 0 {
		return sent, 0, nil
	}
	total := int(float64(rate) * d.Seconds())
	futures := make([]jetstream.PubAckFuture, 0, min(total, 1<<16))
	start := time.Now()
	for i := 0; i < total; {
		due := min(total, int(time.Since(start).Seconds()*float64(rate))+1)
		for ; i < due; i++ {
			t := targets[i%len(targets)]
			m := nats.NewMsg(t.subject)
			m.Header.Set(records.HeaderMsgID, fmt.Sprintf("%s-%d", id, i))
			m.Data = eventBody(t.tag, i, time.Now())
			// A cluster that cannot store the rate offered holds the producer back (up to
			// a minute for room among the pending publishes): the rate achieved says so.
			f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute))
			if err != nil {
				return sent, 0, err
			}
			sent[t.tag]++
			futures = append(futures, f)
			if len(futures) == cap(futures) {
				if err := waitFutures(ctx, futures); err != nil {
					return sent, 0, err
				}
				futures = futures[:0]
			}
		}
		next := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
		if wait := time.Until(next); wait > 0 {
			time.Sleep(min(wait, time.Millisecond))
		}
		if ctx.Err() != nil {
			return sent, 0, ctx.Err()
		}
	}
	achieved := float64(total) / time.Since(start).Seconds()
	return sent, achieved, waitFutures(ctx, futures)
}

// trafficPhases offers events: to every healthy active endpoint at each rate; then beside the
// hot endpoint; then beside the dead and slow ones (last, as they keep failing afterwards).
func (in *seInstall) trafficPhases(ctx context.Context) (*seTraffic, error) {
	c := in.c
	t := &seTraffic{rates: map[int]seLatency{}}
	t.load[0] = loadAvg()
	defer func() { t.load[1] = loadAvg() }()
	set := func(ns string) streams.Set { return streams.DefaultConfig().For(ns) }
	var hot *seEndpoint
	var healthy, bad []seEndpoint
	for i, ep := range in.eps {
		switch ep.class {
		case seHealthy:
			healthy = append(healthy, ep)
		case seHot:
			hot = &in.eps[i]
		case seDead:
			t.deadN++
			bad = append(bad, ep)
		case seSlow:
			t.slowN++
			bad = append(bad, ep)
		}
	}
	t.healthy = len(healthy)
	if len(healthy) == 0 || len(c.Rates) == 0 {
		return t, nil
	}
	hotNS := healthy[0].ns
	if hot != nil {
		hotNS = hot.ns
	}
	targets := func(eps []seEndpoint, tag func(seEndpoint) string) []seTarget {
		out := make([]seTarget, len(eps))
		for i, ep := range eps {
			out[i] = seTarget{subject: set(ep.ns).EventSubject(ep.name + ".evt"), tag: tag(ep)}
		}
		return out
	}
	group := func(phase string) func(seEndpoint) string {
		return func(ep seEndpoint) string {
			if ep.ns == hotNS {
				return phase + "-nb"
			}
			return phase + "-far"
		}
	}
	for _, ep := range healthy {
		if ep.ns == hotNS {
			t.neighbours++
		}
	}
	awaitAll := func(sent map[string]int) error {
		for tag, n := range sent {
			timeout := 2*time.Minute + time.Duration(n)*time.Millisecond
			if w := await(ctx, in.ok, tag, n, timeout, nil); !w.reached {
				return fmt.Errorf("%s: %d of %d deliveries to the healthy endpoints within %s (logs in %s)", tag, w.unique, n, timeout, c.Dir)
			}
		}
		return nil
	}
	merged := func(phase string, sent map[string]int, achieved float64) seLatency {
		return latencyOf(in.ok, []string{phase + "-nb", phase + "-far"}, sent[phase+"-nb"]+sent[phase+"-far"], achieved)
	}

	// Warm-up: one event to every healthy endpoint.
	warm := targets(healthy, func(seEndpoint) string { return "warm" })
	progress("  warm-up: one event to each of the %d healthy active endpoints", len(healthy))
	sent, _, err := pace(ctx, in.js, "warm", warm, len(warm), time.Second)
	if err != nil {
		return t, err
	}
	if err := awaitAll(sent); err != nil {
		got := in.ok.paths("warm")
		var missed []string
		for _, ep := range healthy {
			if !got["/"+ep.ns+"/"+ep.name] {
				missed = append(missed, ep.ns+"/"+ep.name)
			}
		}
		return t, fmt.Errorf("%w; not delivered to: %s", err, strings.Join(missed, ", "))
	}
	for i, rate := range c.Rates {
		phase := fmt.Sprintf("r%d", rate)
		progress("  %d events/s over the %d healthy active endpoints for %s", rate, len(healthy), c.Phase)
		sent, achieved, err := pace(ctx, in.js, phase, targets(healthy, group(phase)), rate, c.Phase)
		if err != nil {
			return t, err
		}
		if err := awaitAll(sent); err != nil {
			return t, err
		}
		t.rates[rate] = merged(phase, sent, achieved)
		if i == 0 {
			t.base = latencyOf(in.ok, []string{phase + "-nb"}, sent[phase+"-nb"], achieved)
		}
		progress("    p50 %s ms, p99 %s ms", ms(t.rates[rate].p50), ms(t.rates[rate].p99))
	}
	base := c.Rates[0]
	if hot != nil && c.HotRate > 0 {
		progress("  hot endpoint %s/%s at %d events/s beside %d events/s over the healthy ones for %s", hot.ns, hot.name, c.HotRate, base, c.Phase)
		var wg sync.WaitGroup
		var hotSent map[string]int
		var hotAchieved float64
		var hotErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			hotSent, hotAchieved, hotErr = pace(ctx, in.js, "hot", targets([]seEndpoint{*hot}, func(seEndpoint) string { return "hot-hot" }), c.HotRate, c.Phase)
		}()
		sent, achieved, err := pace(ctx, in.js, "hotphase", targets(healthy, group("hot")), base, c.Phase)
		wg.Wait()
		if err != nil {
			return t, err
		}
		if hotErr != nil {
			return t, hotErr
		}
		if err := awaitAll(sent); err != nil {
			return t, err
		}
		t.hotNeighbours = latencyOf(in.ok, []string{"hot-nb"}, sent["hot-nb"], achieved)
		t.hotOthers = latencyOf(in.ok, []string{"hot-far"}, sent["hot-far"], achieved)
		// The hot endpoint's backlog drains within a bounded while; what arrived is reported.
		await(ctx, in.ok, "hot-hot", hotSent["hot-hot"], 3*time.Minute, nil)
		t.hot = latencyOf(in.ok, []string{"hot-hot"}, hotSent["hot-hot"], hotAchieved)
		progress("    neighbours p99 %s ms (alone %s ms); the hot endpoint got %d of %d", ms(t.hotNeighbours.p99), ms(t.base.p99), t.hot.got, t.hot.sent)
	}
	if len(bad) > 0 {
		// The dead and slow endpoints get the healthy ones' rate per endpoint, from SlowAnswer
		// before the measurement (so the slow ones hold their maxInFlight) to its end.
		perEndpoint := max(1, base/len(healthy))
		progress("  %d dead and %d slow endpoints at %d events/s each; after %s, %d events/s over the healthy ones for %s", t.deadN, t.slowN, perEndpoint, c.SlowAnswer, base, c.Phase)
		d0, s0 := in.dead.Stats().Requests, in.slow.Stats().Requests
		var wg sync.WaitGroup
		var badErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, badErr = pace(ctx, in.js, "bad", targets(bad, func(ep seEndpoint) string { return "iso-bad" }), perEndpoint*len(bad), c.SlowAnswer+c.Phase)
		}()
		select {
		case <-time.After(c.SlowAnswer):
		case <-ctx.Done():
			return t, ctx.Err()
		}
		sent, achieved, err := pace(ctx, in.js, "iso", targets(healthy, group("iso")), base, c.Phase)
		wg.Wait()
		if err != nil {
			return t, err
		}
		if badErr != nil {
			return t, badErr
		}
		if err := awaitAll(sent); err != nil {
			return t, err
		}
		t.iso = merged("iso", sent, achieved)
		t.deadReq, t.slowReq = in.dead.Stats().Requests-d0, in.slow.Stats().Requests-s0
		progress("    healthy p99 %s ms beside them (alone %s ms)", ms(t.iso.p99), ms(t.rates[base].p99))
	}
	return t, nil
}
