package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/deliver"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/counts"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/leases"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/report"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/dispatcher/intake"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
	"github.com/webhook-operator/webhook-operator/dispatcher/settle"
	"github.com/webhook-operator/webhook-operator/internal/egressproxy"
	"github.com/webhook-operator/webhook-operator/internal/metricsauth"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/pull"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
	"github.com/webhook-operator/webhook-operator/internal/wake"
)

// FieldManager is the dispatcher's server-side-apply field manager. It owns status.health and
// the Disabled and CircuitOpen conditions, and nothing else.
const FieldManager = report.FieldManager

// DefaultPartitions is how many partitions a shared dispatcher's endpoints fall into: enough
// for an even share among 1, 2, 3, 4, 6 or 12 replicas.
const DefaultPartitions = 12

// DefaultMemoryBudget is the default byte budget: with the Go runtime, the informer cache and
// the pull buffers it fits the chart's 256Mi memory limit of a dispatcher.
const DefaultMemoryBudget = 64 << 20

// SetMemoryLimit sets the Go runtime's soft memory limit for a byte budget of budget (twice
// it and 48Mi for the rest), unless GOMEMLIMIT says otherwise: the heap is collected harder
// near what the budget implies rather than let grow to twice the live heap.
func SetMemoryLimit(budget int64) {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(2*budget + 48<<20)
		if os.Getenv("GOGC") == "" {
			debug.SetGCPercent(200)
		}
	}
}

// Options configure a dispatcher.
type Options struct {
	// Namespace whose endpoints are served.
	Namespace string
	// Endpoint, when set, is the one dedicated endpoint served.
	Endpoint string
	// Config is the installation's configuration (NATS, streams, outbound policy).
	Config opconfig.Config
	// Replicas of this dispatcher's Deployment; rate limits are divided among them.
	Replicas int
	// Identity of this replica (the pod name).
	Identity string
	// RestConfig reaches the API server.
	RestConfig *rest.Config
	// MetricsAddr and ProbeAddr serve /metrics and /healthz, /readyz ("0" disables).
	MetricsAddr, ProbeAddr string
	// MetricsClientCerts are the scrapers /metrics accepts with Config.MetricsSecure: client
	// certificates of the installation's scraper CA (the controller mounts the CA's
	// certificate). A dispatcher asks the API server nothing about its scrapers: its
	// ServiceAccount, which a tenant may run pods as, holds no TokenReview or
	// SubjectAccessReview grant.
	MetricsClientCerts metricsauth.ClientCerts
	// ShutdownGrace is how long in-flight deliveries may take after a stop is asked.
	ShutdownGrace time.Duration
	// StatusInterval bounds how often an active endpoint's status is written (default 5s).
	StatusInterval time.Duration
	// HealthFlushInterval is how often the fold of the delivery log applies counts to the
	// bucket (default 1s).
	HealthFlushInterval time.Duration
	// InPlaceRetryMax: retries due sooner than this are waited out by the worker; later ones
	// become JetStream message schedules (default 2s; the server fires schedules with about
	// one second's resolution).
	InPlaceRetryMax time.Duration
	// DeadLetterNewsWindow is the least time between two delivery.dead_lettered operational
	// events of one endpoint (default state.DeadLetterNewsWindow, a minute).
	DeadLetterNewsWindow time.Duration
	// OpsSweepInterval is how often the holder of partition 0 publishes operational events
	// left behind (default 5s).
	OpsSweepInterval time.Duration
	// LeaseTTL is how long a silent replica keeps its partitions' leases (default 10s).
	LeaseTTL time.Duration
	// Partitions is how many partitions the endpoints fall into (default DefaultPartitions):
	// each is held by one replica, which alone delivers its single-active endpoints and writes
	// its endpoints' statuses, and an endpoint's maxInFlight is divided among them
	// (leases.Partitions, leases.ShareOf). A dedicated dispatcher has as many: its one
	// endpoint's maxInFlight spreads over its replicas.
	Partitions int
	// MemoryBudget bounds the bytes of events and deliveries held in memory (default
	// DefaultMemoryBudget); more waits in the streams.
	MemoryBudget int64
	// Tracer makes each delivery attempt a span (tracing.FromEnv); nil traces nothing.
	Tracer *tracing.Tracer
	// EgressProxyCredentials is a directory holding the installation's egress proxy
	// (Config.EgressProxy) credentials as files username and password (the mirrored Secret's
	// mount), read at every new tunnel; empty: none.
	EgressProxyCredentials string
	// Registry receives the Prometheus metrics (default: controller-runtime's registry).
	Registry prometheus.Registerer
	// Metrics, when set, are the metrics this dispatcher counts in, made with metrics.New on
	// Registry by whoever runs the dispatchers of several namespaces in one process (they are
	// labelled by namespace); nil: its own.
	Metrics *metrics.Metrics
	// MemoryPool, when set, is a process-wide budget this dispatcher's own (MemoryBudget)
	// draws from as well: a shared dispatcher's, shared by the namespaces it serves
	// (deliver.Budget.Share).
	MemoryPool *deliver.Budget
	// PullExpiry is how long an idle consumer's pull request lasts (default 90s): how long the
	// requests of a dispatcher let quiet by Pause may take to run out.
	PullExpiry time.Duration
	// Pause, when set, lets whoever runs this dispatcher quiet it before stopping it.
	Pause *Pause
	// Logger logs.
	Logger logr.Logger
}

// A Pause lets whoever runs a dispatcher (a shared dispatcher letting an idle namespace sleep)
// stop it with no pull request of it left at the server. A request whose reply crossed the
// auth callout's account boundary keeps its interest on the consumer leader's server (when
// that is not the connection's) until it expires, whatever became of the connection: a
// message handed to it meanwhile would wait for the consumer's ack wait.
type Pause struct {
	mu     sync.Mutex
	puller *pull.Puller
}

func (q *Pause) set(p *pull.Puller) {
	q.mu.Lock()
	q.puller = p
	q.mu.Unlock()
}

// Resume makes requests again after a Quiesce that returned true, when the dispatcher is to
// go on running after all.
func (q *Pause) Resume() {
	q.mu.Lock()
	p := q.puller
	q.mu.Unlock()
	if p != nil {
		p.SetQuiet(false)
	}
}

// Quiesce stops the running dispatcher's pull requests and waits until none is outstanding
// (at most PullExpiry and a grace). It returns true then, the dispatcher still running with
// nothing asked of the server; false, with requests made again, when a message arrived
// meanwhile, ctx ended or no dispatcher runs.
func (q *Pause) Quiesce(ctx context.Context) bool {
	q.mu.Lock()
	p := q.puller
	q.mu.Unlock()
	if p == nil {
		return false
	}
	_, before := p.Quiesced()
	p.SetQuiet(true)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		none, received := p.Quiesced()
		switch {
		case received != before:
			p.SetQuiet(false)
			return false
		case none:
			return true
		}
		select {
		case <-ctx.Done():
			p.SetQuiet(false)
			return false
		case <-tick.C:
		}
	}
}

func (o *Options) defaults() {
	if o.Replicas < 1 {
		o.Replicas = 1
	}
	if o.Identity == "" {
		h, _ := os.Hostname()
		o.Identity = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = 25 * time.Second
	}
	if o.StatusInterval <= 0 {
		o.StatusInterval = 5 * time.Second
	}
	if o.HealthFlushInterval <= 0 {
		o.HealthFlushInterval = time.Second
	}
	if o.InPlaceRetryMax <= 0 {
		o.InPlaceRetryMax = 2 * time.Second
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 10 * time.Second
	}
	if o.Partitions <= 0 {
		o.Partitions = DefaultPartitions
	}
	if o.MemoryBudget <= 0 {
		o.MemoryBudget = DefaultMemoryBudget
	}
	if o.Registry == nil {
		o.Registry = ctrlmetrics.Registry
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = "0"
	}
	if o.ProbeAddr == "" {
		o.ProbeAddr = "0"
	}
}

// process is a running dispatcher: the composition root. assemble builds it and every stage
// in it, in dependency order, handing each the narrow dependencies it needs; no stage holds a
// pointer back to it, and nothing is set after construction.
type process struct {
	o     Options
	log   logr.Logger
	names streams.NamespaceNames
	bus
	cluster

	// resyncs asks for a resync (debounced); synced is closed after the first one: the fold
	// waits for it, so no record is folded for an endpoint not yet known.
	resyncs chan struct{}
	synced  chan struct{}
	// resolved is what each endpoint's configuration was last resolved from (resolve).
	resolved map[string]resolvedFrom
	// rotationEnd resyncs when the first signing-secret rotation ends (nextRotationEnd).
	rotationEnd *time.Timer
	// configRetry resyncs soon while configurations fail (nextConfigRetry): when, and the
	// backoff.
	configRetry   *time.Timer
	configRetryAt time.Time
	configBackoff time.Duration

	workers   *workers
	health    *health.Health
	parts     *leases.Partitions
	status    *report.StatusWriter
	announcer *report.Announcer
	tally     *counts.FilterTally
	puller    *pull.Puller
	// intake is the shared lane (nil for a dedicated dispatcher).
	intake *intake.Intake
	// factory makes the endpoints' workers; logs writes their delivery log; guard is the
	// outbound address policy; hard ends the grace period of a stop.
	factory *deliver.Factory
	logs    *settle.LogWriter
	guard   netguard.Policy
	hard    context.Context
	// proxy is the installation's egress proxy, for endpoints without their own; nil: direct.
	proxy *egressproxy.Proxy
}

// bus is the NATS connection, its JetStream and the namespace's bucket.
type bus struct {
	nc *nats.Conn
	js jetstream.JetStream
	kv jetstream.KeyValue
}

// cluster is the Kubernetes side: the manager, its informer cache and the Secret reader.
type cluster struct {
	mgr     manager.Manager
	cache   cache.Cache
	secrets *endpoint.SecretCache
}

// Run runs a dispatcher until ctx ends, then drains: it stops pulling, lets in-flight
// deliveries finish within the grace period (releasing the rest for redelivery) and returns.
func Run(ctx context.Context, o Options) error {
	o.defaults()
	if o.Namespace == "" {
		return errors.New("a namespace is required")
	}
	metrics, err := MetricsOptions(o)
	if err != nil {
		return err
	}
	log := o.Logger.WithValues("namespace", o.Namespace)
	if o.Endpoint != "" {
		log = log.WithValues("endpoint", o.Endpoint)
	}
	names := o.Config.Streams.Names.For(o.Namespace)
	// The connection's error handler tells the puller of refused pulls, and the puller is made
	// on the connection: the one reference set after construction.
	var puller atomic.Pointer[pull.Puller]
	b, err := connect(ctx, o, names, log, func(err error) {
		if pl := puller.Load(); pl != nil {
			pl.PermissionDenied(err)
		}
	})
	if err != nil {
		return err
	}
	defer b.nc.Close()
	// webhook_nats_connected{namespace} (see opconfig.NATSConnectedMetric), read from the
	// connection at every scrape: one a namespace where a process serves several, removed
	// when this dispatcher ends.
	connected := prometheus.WrapRegistererWith(prometheus.Labels{"namespace": o.Namespace}, o.Registry)
	gauge := opconfig.NATSConnectedMetric(b.nc.IsConnected)
	if err := connected.Register(gauge); err != nil {
		return err
	}
	defer connected.Unregister(gauge)
	resyncs := make(chan struct{}, 1)
	c, err := informers(ctx, o, metrics, log, b.nc, resyncs)
	if err != nil {
		return err
	}
	// hardCtx ends ShutdownGrace after a stop is asked: in-flight requests are aborted.
	hardCtx, hardStop := context.WithCancel(context.Background())
	defer hardStop()
	p, err := assemble(o, log, names, b, c, resyncs, hardCtx)
	if err != nil {
		return err
	}
	puller.Store(p.puller)
	if o.Pause != nil {
		o.Pause.set(p.puller)
		defer o.Pause.set(nil)
	}
	return p.serve(ctx, hardStop)
}

// MetricsOptions is how /metrics is served: with Config.MetricsSecure, over mutual TLS to
// client certificates of the scraper CA (MetricsClientCerts, required then); otherwise plain
// HTTP.
func MetricsOptions(o Options) (metricsserver.Options, error) {
	if o.MetricsAddr == "0" || !o.Config.MetricsSecure {
		return metricsauth.ServerOptions(o.MetricsAddr, false), nil
	}
	if o.MetricsClientCerts.CAFile == "" {
		return metricsserver.Options{}, errors.New("--metrics-secure needs --metrics-client-ca-file, the scraper CA whose client certificates may read /metrics (the controller mounts it with --dispatcher-metrics-ca-secret); or --metrics-secure=false")
	}
	return metricsauth.ClientCertServerOptions(o.MetricsAddr, o.MetricsClientCerts)
}

// connect reaches NATS and the namespace's bucket (created by the controller). denied is told
// of every permission violation the server reports.
func connect(ctx context.Context, o Options, names streams.NamespaceNames, log logr.Logger, denied func(error)) (bus, error) {
	name := "webhook-dispatcher " + o.Namespace + " " + o.Identity
	nc, _, err := o.Config.Connect(name,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Info("disconnected from NATS", "error", err.Error())
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("reconnected to NATS") }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				ctrllog.Log.WithName("nats").Info(opconfig.RefusedMessage, "connection", name, "error", err.Error())
				denied(err)
			}
		}))
	if err != nil {
		return bus{}, err
	}
	// Every asynchronous publish resolves (acknowledged or failed) within 10s, so a delivery
	// waiting for its log record or its held copy can never wait forever on a lost reply.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192), jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		nc.Close()
		return bus{}, err
	}
	kv, err := waitForBucket(ctx, js, names.Bucket(), log)
	if err != nil {
		nc.Close()
		return bus{}, err
	}
	return bus{nc: nc, js: js, kv: kv}, nil
}

// informers builds the manager: the informer cache of endpoints and policies (a change asks
// for a resync on resyncs), the Secret reader, and the probes.
func informers(ctx context.Context, o Options, metrics metricsserver.Options, log logr.Logger, nc *nats.Conn, resyncs chan<- struct{}) (cluster, error) {
	cacheOpts := cache.Options{
		Scheme:            scheme.New(),
		DefaultNamespaces: map[string]cache.Config{o.Namespace: {}},
		// Thousands of endpoints: keep what the dispatcher reads.
		DefaultTransform: scheme.StripApplied,
	}
	endpoints := cache.ByObject{Transform: keepReadStatus}
	if o.Endpoint != "" {
		endpoints.Field = fields.OneTermEqualSelector("metadata.name", o.Endpoint)
	}
	cacheOpts.ByObject = map[client.Object]cache.ByObject{&v1alpha1.WebhookEndpoint{}: endpoints}
	grace := o.ShutdownGrace + 5*time.Second
	mgr, err := manager.New(o.RestConfig, manager.Options{
		Scheme:                  scheme.New(),
		Cache:                   cacheOpts,
		Metrics:                 metrics,
		HealthProbeBindAddress:  o.ProbeAddr,
		Logger:                  log,
		GracefulShutdownTimeout: &grace,
	})
	if err != nil {
		return cluster{}, fmt.Errorf("creating the manager: %w", err)
	}
	cc := mgr.GetCache()
	_ = mgr.AddHealthzCheck("ping", healthz.Ping)
	_ = mgr.AddReadyzCheck("nats", func(*http.Request) error {
		if !nc.IsConnected() {
			return errors.New("not connected to NATS")
		}
		return nil
	})
	_ = mgr.AddReadyzCheck("informers", func(r *http.Request) error {
		if !cc.WaitForCacheSync(r.Context()) {
			return errors.New("informers not synced")
		}
		return nil
	})
	resync := func() { askResync(resyncs) }
	for _, obj := range []client.Object{&v1alpha1.WebhookEndpoint{}, &v1alpha1.RetryPolicy{}} {
		inf, err := cc.GetInformer(ctx, obj)
		if err != nil {
			return cluster{}, err
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { resync() },
			DeleteFunc: func(any) { resync() },
			UpdateFunc: func(oldObj, newObj any) {
				o, ok1 := oldObj.(client.Object)
				n, ok2 := newObj.(client.Object)
				if !ok1 || !ok2 || relevantUpdate(o, n) {
					resync()
				}
			},
		}); err != nil {
			return cluster{}, err
		}
	}
	// A referenced Secret's change reaches the dispatcher at once through the endpoint's
	// status.secretsVersion (the controller's); resolving every endpoint again about hourly
	// (secretsMaxAge) is only a safety net. A Secret read is kept for the resolves that follow
	// a change, not for idle endpoints.
	secrets := endpoint.NewSecretCache(mgr.GetAPIReader(), o.Namespace, secretsHold)
	return cluster{mgr: mgr, cache: cc, secrets: secrets}, nil
}

// assemble builds the stages in dependency order, each with what it needs: the metrics and the
// byte budget; the puller; health (partitions, the state store, the status writer, Health with
// what its changes reach, the filter tally, the announcer); and the workers' environment.
func assemble(o Options, log logr.Logger, names streams.NamespaceNames, b bus, c cluster, resyncs chan struct{}, hardCtx context.Context) (*process, error) {
	m := o.Metrics
	if m == nil {
		m = metrics.New(o.Registry)
	}
	held := m.Held(o.Namespace)
	budget := deliver.NewBudget(o.MemoryBudget, func(n int64) { held.Set(float64(n)) })
	if o.MemoryPool != nil {
		budget = o.MemoryPool.Share(o.MemoryBudget, func(n int64) { held.Set(float64(n)) })
	}
	ws := newWorkers(m, o.Namespace)
	maxPayload := b.nc.MaxPayload()
	// A pull may bring a few messages of the largest size, never more than a quarter of the
	// budget, and always at least one message.
	pullBytes := int(max(min(o.MemoryBudget/4, 4*maxPayload), maxPayload+64<<10))
	// Through the auth callout a connection is granted its endpoints' consumers on other
	// namespaces' events streams when it connects: a new one renews it (Puller.Regrant).
	var foreign func(string) bool
	if o.Config.NATS.TokenFile != "" {
		ownEvents, ownDeliveries := names.EventsStream(), names.DeliveriesStream()
		foreign = func(stream string) bool { return stream != ownEvents && stream != ownDeliveries }
	}
	puller, err := pull.NewPuller(b.nc, pullBytes, foreign, log)
	if err != nil {
		return nil, err
	}
	puller.SetIdleExpiry(o.PullExpiry)

	settings := deliver.Settings{Streams: o.Config.Streams, Names: names, Identity: o.Identity, AllowSources: o.Config.AllowCrossNamespaceSources,
		Guard: o.Config.Outbound(), MaxEventBytes: o.Config.MaxEventBytes,
		InPlaceRetryMax: o.InPlaceRetryMax}
	logs := settle.NewLogWriter(b.js, maxPayload, log)
	settler := settle.New(b.js, names, logs, settle.NewRoom(b.js, names.DeliveriesStream()), maxPayload, hardCtx, log)
	runners := deliver.NewRunners()
	var lane *intake.Intake
	if o.Endpoint == "" {
		// The shared lane of the namespace's shared dispatcher.
		lane = intake.New(intake.Parts{Settings: intake.Settings{Streams: settings.Streams, Names: names, AllowSources: settings.AllowSources},
			Puller: puller, JS: b.js, Memory: budget, Run: runners.Go, Log: log})
	}

	parts := leases.NewPartitions(b.js, b.kv, o.Endpoint, o.Identity, o.Partitions, o.Replicas, o.LeaseTTL, log)
	store := state.NewStore(b.kv, o.Namespace, o.DeadLetterNewsWindow, log)
	status := report.NewStatusWriter(report.StatusConfig{Endpoints: ws, Store: store, Holds: parts.Holds, JS: b.js, Names: names,
		Waiting: lane.Waiting, Reader: c.cache, Client: c.mgr.GetClient(), Interval: o.StatusInterval, Log: log})
	outboxes := report.NewOutboxes()
	h := health.New(store, ws.policyOf, ws, status, outboxes,
		report.Events{Recorder: c.mgr.GetEventRecorderFor("webhook-dispatcher"), Reader: c.cache, Namespace: o.Namespace, Log: log})
	tally := &counts.FilterTally{Target: h}
	// The holder of partition 0 sweeps every endpoint's operational events left behind.
	announcer := &report.Announcer{JS: b.js, Names: names, Store: h, Outboxes: outboxes, Endpoints: ws,
		Leader: func() bool { return parts.Held(0) }, Interval: o.OpsSweepInterval, Log: log}

	proxy, err := installationProxy(o)
	if err != nil {
		return nil, err
	}
	workers := &deliver.Factory{Settings: settings, JS: b.js, Settle: settler,
		Health: h, Lease: parts, Memory: budget, Sources: puller, Windows: deliver.NewWindows(b.js), Runners: runners,
		Watchers: deliver.Watchers{Dirtied: func(ep string) { status.Mark(ep, false) }, Filtered: tally.Filtered},
		Hard:     hardCtx, Tracer: o.Tracer, Log: log, Intake: lane}
	return &process{intake: lane, o: o, log: log, names: names, bus: b, cluster: c,
		resyncs: resyncs, synced: make(chan struct{}), resolved: map[string]resolvedFrom{},
		workers: ws, health: h, parts: parts, status: status, announcer: announcer, tally: tally, puller: puller,
		factory: workers, logs: logs, guard: workers.Settings.Guard, hard: hardCtx, proxy: proxy}, nil
}

// serve starts the manager and the stages, waits for ctx, then drains; hardStop aborts what is
// still in flight ShutdownGrace after the stop.
func (p *process) serve(ctx context.Context, hardStop context.CancelFunc) error {
	o := p.o
	runCtx, stop := context.WithCancel(ctx)
	defer stop()

	// The manager serves the probes and /metrics and runs the informers. When it ends on its
	// own (a server that cannot listen, a cache that fails), the dispatcher can neither say it
	// is ready nor follow its endpoints: it stops as it would when asked to, and returns the
	// manager's error, so that it is started again (the kubelet restarts the container).
	mgrCtx, mgrStop := context.WithCancel(context.Background())
	defer mgrStop()
	mgrEnded := make(chan struct{})
	var mgrErr error
	go func() {
		defer close(mgrEnded)
		mgrErr = p.mgr.Start(mgrCtx)
	}()
	managerStopped := func() error {
		if mgrErr != nil {
			return fmt.Errorf("the manager (probes, metrics, informers) stopped: %w", mgrErr)
		}
		return errors.New("the manager (probes, metrics, informers) stopped")
	}
	syncCtx, syncDone := context.WithCancel(ctx)
	go func() {
		select {
		case <-mgrEnded:
			syncDone()
		case <-syncCtx.Done():
		}
	}()
	synced := p.cache.WaitForCacheSync(syncCtx)
	syncDone()
	if !synced {
		mgrStop()
		<-mgrEnded
		if ctx.Err() == nil {
			return managerStopped()
		}
		return fmt.Errorf("informer caches did not sync")
	}
	p.log.Info("dispatcher started", "identity", o.Identity, "replicas", o.Replicas, "nats", p.nc.ConnectedUrl())

	var bg sync.WaitGroup
	bg.Go(func() { p.watchHealth(runCtx) })
	bg.Go(func() { p.status.Run(runCtx) })
	bg.Go(func() { p.announcer.Run(runCtx) })
	// The partitions are let go of once the workers' in-flight deliveries ended (below), so
	// the replicas taking them over never add their part of an endpoint's maxInFlight to
	// requests this one still makes.
	partsCtx, stopParts := context.WithCancel(context.Background())
	parted := make(chan struct{})
	go func() {
		defer close(parted)
		p.parts.Run(partsCtx, p.partitionChanged(runCtx), p.partitionBusy)
	}()
	// The delivery log's writer runs until every worker is done.
	logCtx, stopLog := context.WithCancel(context.Background())
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		p.logs.Run(logCtx, p.hard)
	}()
	// Filters run in every replica's workers: each replica adds what its filters rejected.
	tallyCtx, stopTally := context.WithCancel(context.Background())
	tallied := make(chan struct{})
	go func() {
		defer close(tallied)
		p.tally.Run(tallyCtx)
	}()
	bg.Go(func() { p.resyncLoop(runCtx) })

	var failed error
	select {
	case <-ctx.Done():
	case <-mgrEnded:
		failed = managerStopped()
		p.log.Error(failed, "stopping the dispatcher")
	}
	p.log.Info("stopping: no new pulls; waiting for in-flight deliveries", "grace", o.ShutdownGrace)
	stop()
	graceTimer := time.AfterFunc(o.ShutdownGrace, hardStop)
	if p.intake != nil {
		p.intake.Stop()
	}
	workers := p.workers.all()
	for _, w := range workers {
		w.Stop()
	}
	for _, w := range workers {
		w.Wait()
	}
	if p.intake != nil {
		p.intake.Wait()
	}
	stopParts()
	<-parted
	stopLog()
	<-logged
	graceTimer.Stop()
	p.puller.Stop()
	stopTally() // after the workers: their last counts are flushed too
	<-tallied
	bg.Wait()
	if err := p.nc.FlushTimeout(5 * time.Second); err != nil {
		p.log.V(1).Info("flushing NATS", "error", err.Error())
	}
	mgrStop()
	<-mgrEnded
	p.log.Info("dispatcher stopped")
	return failed
}

// watchHealth follows other replicas' changes of the shared state until ctx ends.
func (p *process) watchHealth(ctx context.Context) {
	for ctx.Err() == nil {
		if err := p.health.Watch(ctx, p.js); err != nil {
			p.log.V(1).Info("health watch", "error", err.Error())
		}
		sleep(ctx, time.Second)
	}
}

// partitionChanged is told when this replica takes or lets go of a partition: every worker
// of the partition looks again at what it may do, and the holder of partition 0 folds the
// delivery log into every endpoint's counts.
func (p *process) partitionChanged(ctx context.Context) func(part int, held bool) {
	var stopFold context.CancelFunc
	var folding sync.WaitGroup
	return func(part int, held bool) {
		if part == 0 {
			if held {
				fctx, cancel := context.WithCancel(ctx)
				stopFold = cancel
				folding.Go(func() { p.afterSync(fctx, p.fold) })
			} else if stopFold != nil {
				stopFold()
				folding.Wait()
				stopFold = nil
			}
		}
		for _, w := range p.workers.all() {
			own := p.parts.Of(w.Name()) == part
			if own || p.hasPart(w, part) {
				// What it may deliver changed: its share of maxInFlight, or its lease.
				w.Wake()
			}
			if own && held {
				// Its status was another replica's to write: look at it again.
				p.status.Mark(w.Name(), false)
			}
		}
	}
}

// hasPart says whether partition part holds a part of worker w's maxInFlight
// (leases.ShareOf; a single-active endpoint's is all on its own partition).
func (p *process) hasPart(w *deliver.Worker, part int) bool {
	c := w.Config()
	if c == nil {
		return false
	}
	if c.SingleActive() {
		return p.parts.Of(w.Name()) == part
	}
	return p.parts.Covers(w.Name(), max(c.MaxInFlight, 1), part)
}

// partitionBusy says whether requests this replica started under partition part, let go of,
// still run: an endpoint with a part there has more in flight than its share now.
func (p *process) partitionBusy(part int) bool {
	for _, w := range p.workers.all() {
		if p.hasPart(w, part) && w.Overcommitted() {
			return true
		}
	}
	return false
}

// afterSync runs f once the first resync is done, unless ctx ends first.
func (p *process) afterSync(ctx context.Context, f func(context.Context)) {
	select {
	case <-p.synced:
		f(ctx)
	case <-ctx.Done():
	}
}

// fold folds the delivery log into health counts until ctx ends, starting again from its
// checkpoint after an error.
func (p *process) fold(ctx context.Context) {
	filter := p.names.AttemptsSubjects()[0]
	if p.o.Endpoint != "" {
		filter = p.names.AttemptSubject(p.o.Endpoint)
	}
	f := &counts.Folder{JS: p.js, Stream: p.names.AttemptsStream(), Filter: filter, KV: p.kv, CheckpointKey: streams.FoldKey(p.o.Endpoint),
		Serves: p.workers.has, Elsewhere: p.workers.servedElsewhere, Subject: p.names.AttemptSubject,
		Target: p.health, Interval: p.o.HealthFlushInterval, Log: p.log}
	for ctx.Err() == nil {
		if err := f.Run(ctx); err != nil && ctx.Err() == nil {
			p.log.V(1).Info("folding the delivery log; starting again from the checkpoint", "error", err.Error())
			sleep(ctx, time.Second)
		}
	}
}

// resyncLoop resyncs at start, on every relevant change (debounced), when a signing-secret
// rotation ends, and every 5 minutes (a Secret read an hour ago is read again then).
func (p *process) resyncLoop(ctx context.Context) {
	tick := time.NewTicker(5 * time.Minute)
	defer tick.Stop()
	defer func() {
		if p.rotationEnd != nil {
			p.rotationEnd.Stop()
		}
		if p.configRetry != nil {
			p.configRetry.Stop()
		}
	}()
	p.resync(ctx, true)
	if p.intake != nil {
		// The shared lane pulls once it knows the endpoints and the partitions it holds: a
		// worker whose share is not taken yet would have every view handed to it parked.
		select {
		case <-p.parts.Rounded():
		case <-ctx.Done():
			return
		}
		p.intake.Start(ctx)
	}
	close(p.synced)
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.resyncs:
			// Debounce bursts of changes.
			if !sleep(ctx, 50*time.Millisecond) {
				return
			}
			p.resync(ctx, false)
		case <-tick.C:
			p.resync(ctx, true)
		}
	}
}

// sleep waits d; false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// relevantUpdate ignores status-only updates (including the dispatcher's own health writes),
// except what of the controller's status the endpoint's configuration reads (wake.Fingerprint:
// secretsVersion, the lane and its move, a hold by its quota or its source grants).
func relevantUpdate(oldObj, newObj client.Object) bool {
	o, ok1 := oldObj.(*v1alpha1.WebhookEndpoint)
	n, ok2 := newObj.(*v1alpha1.WebhookEndpoint)
	if ok1 && ok2 {
		return wake.Relevant(o, n)
	}
	return oldObj.GetGeneration() != newObj.GetGeneration() || !oldObj.GetDeletionTimestamp().Equal(newObj.GetDeletionTimestamp()) ||
		oldObj.GetAnnotations()[v1alpha1.AnnotationEnable] != newObj.GetAnnotations()[v1alpha1.AnnotationEnable]
}

func waitForBucket(ctx context.Context, js jetstream.JetStream, bucket string, log logr.Logger) (jetstream.KeyValue, error) {
	for {
		kv, err := js.KeyValue(ctx, bucket)
		if err == nil {
			return kv, nil
		}
		log.Info("waiting for the key-value bucket (the controller creates it)", "bucket", bucket, "error", err.Error())
		if !sleep(ctx, 2*time.Second) {
			return nil, ctx.Err()
		}
	}
}
