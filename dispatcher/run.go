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

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/deliver"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/counts"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/leases"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/report"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
	"github.com/webhook-operator/webhook-operator/internal/kube"
	"github.com/webhook-operator/webhook-operator/internal/metricsauth"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
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
	// Partitions is how many partitions the endpoints fall into (default DefaultPartitions, 1
	// for a dedicated dispatcher): each is held by one replica, which alone delivers its
	// single-active endpoints and writes its endpoints' statuses (see leases.Partitions).
	Partitions int
	// MemoryBudget bounds the bytes of events and deliveries held in memory (default
	// DefaultMemoryBudget); more waits in the streams.
	MemoryBudget int64
	// Tracer makes each delivery attempt a span (tracing.FromEnv); nil traces nothing.
	Tracer *tracing.Tracer
	// Registry receives the Prometheus metrics (default: controller-runtime's registry).
	Registry prometheus.Registerer
	// Logger logs.
	Logger logr.Logger
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
	if o.Endpoint != "" {
		o.Partitions = 1
	} else if o.Partitions <= 0 {
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

// process is a running dispatcher: the composition root. It builds the stages and hands each
// the narrow dependencies it needs; no stage holds a pointer back to it.
type process struct {
	o     Options
	log   logr.Logger
	names streams.NamespaceNames

	nc *nats.Conn
	js jetstream.JetStream
	kv jetstream.KeyValue

	mgr      manager.Manager
	cache    cache.Cache
	secrets  *endpoint.SecretCache
	resyncCh chan struct{}

	workers *workers
	health  *health.Health
	parts   *leases.Partitions
	status  *report.StatusWriter
	puller  *deliver.Puller
	// pullerRef is puller for the connection's error handler (another goroutine).
	pullerRef atomic.Pointer[deliver.Puller]
	tally     *counts.FilterTally
	env       *deliver.Env
	// announcer publishes operational events (endpoint disabled, circuit opened...).
	announcer *report.Announcer
	// synced is closed after the first resync: the fold waits for it, so no record is folded
	// for an endpoint not yet known.
	synced chan struct{}
	// secretVersions are the endpoints' status.secretsVersion at the last resync.
	secretVersions map[string]string

	// runCtx ends when a stop is asked; hardCtx ends ShutdownGrace later and aborts requests.
	runCtx  context.Context
	hardCtx context.Context
}

// Run runs a dispatcher until ctx ends, then drains: it stops pulling, lets in-flight
// deliveries finish within the grace period (releasing the rest for redelivery) and returns.
func Run(ctx context.Context, o Options) error {
	o.defaults()
	if o.Namespace == "" {
		return errors.New("a namespace is required")
	}
	log := o.Logger.WithValues("namespace", o.Namespace)
	if o.Endpoint != "" {
		log = log.WithValues("endpoint", o.Endpoint)
	}
	p := &process{o: o, log: log, names: o.Config.Streams.Names.For(o.Namespace), synced: make(chan struct{}),
		workers: &workers{m: map[string]*deliver.Worker{}}, secretVersions: map[string]string{}, resyncCh: make(chan struct{}, 1)}
	if err := p.connect(ctx); err != nil {
		return err
	}
	defer p.nc.Close()
	if err := p.kube(ctx); err != nil {
		return err
	}
	if err := p.assemble(); err != nil {
		return err
	}
	return p.serve(ctx)
}

// connect reaches NATS and the namespace's bucket (created by the controller).
func (p *process) connect(ctx context.Context) error {
	log := p.log
	name := "webhook-dispatcher " + p.o.Namespace + " " + p.o.Identity
	nc, _, err := p.o.Config.Connect(name,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Info("disconnected from NATS", "error", err.Error())
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("reconnected to NATS") }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				ctrllog.Log.WithName("nats").Info(opconfig.RefusedMessage, "connection", name, "error", err.Error())
				if pl := p.pullerRef.Load(); pl != nil {
					pl.PermissionDenied(err)
				}
			}
		}))
	if err != nil {
		return err
	}
	p.nc = nc
	// webhook_nats_connected (see opconfig.NATSConnectedMetric), read from the connection at
	// every scrape.
	if err := p.o.Registry.Register(opconfig.NATSConnectedMetric(nc.IsConnected)); err != nil {
		nc.Close()
		return err
	}
	// Every asynchronous publish resolves (acknowledged or failed) within 10s, so a delivery
	// waiting for its log record or its held copy can never wait forever on a lost reply.
	if p.js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192), jetstream.WithPublishAsyncTimeout(10*time.Second)); err != nil {
		nc.Close()
		return err
	}
	if p.kv, err = waitForBucket(ctx, p.js, p.names.Bucket(), log); err != nil {
		nc.Close()
		return err
	}
	return nil
}

// kube builds the manager: the informer cache of endpoints and policies (a change triggers a
// resync), the Secret reader, and the probes.
func (p *process) kube(ctx context.Context) error {
	o := p.o
	cacheOpts := cache.Options{
		Scheme:            kube.Scheme(),
		DefaultNamespaces: map[string]cache.Config{o.Namespace: {}},
		// Thousands of endpoints: keep what the dispatcher reads, not who wrote which field.
		DefaultTransform: cache.TransformStripManagedFields(),
	}
	if o.Endpoint != "" {
		cacheOpts.ByObject = map[client.Object]cache.ByObject{
			&v1alpha1.WebhookEndpoint{}: {Field: fields.OneTermEqualSelector("metadata.name", o.Endpoint)},
		}
	}
	grace := o.ShutdownGrace + 5*time.Second
	mgr, err := manager.New(o.RestConfig, manager.Options{
		Scheme:                  kube.Scheme(),
		Cache:                   cacheOpts,
		Metrics:                 metricsauth.ServerOptions(o.MetricsAddr, o.Config.MetricsSecure),
		HealthProbeBindAddress:  o.ProbeAddr,
		Logger:                  p.log,
		GracefulShutdownTimeout: &grace,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	p.mgr, p.cache = mgr, mgr.GetCache()
	// A referenced Secret's change reaches the dispatcher at once through the endpoint's
	// status.secretsVersion (the controller's); re-reading every Secret now and then is only a
	// safety net, spread over time so thousands of endpoints do not read theirs at once.
	p.secrets = endpoint.NewSecretCache(mgr.GetAPIReader(), o.Namespace, time.Hour)
	_ = mgr.AddHealthzCheck("ping", healthz.Ping)
	_ = mgr.AddReadyzCheck("nats", func(*http.Request) error {
		if !p.nc.IsConnected() {
			return errors.New("not connected to NATS")
		}
		return nil
	})
	_ = mgr.AddReadyzCheck("informers", func(r *http.Request) error {
		if !p.cache.WaitForCacheSync(r.Context()) {
			return errors.New("informers not synced")
		}
		return nil
	})
	for _, obj := range []client.Object{&v1alpha1.WebhookEndpoint{}, &v1alpha1.RetryPolicy{}} {
		inf, err := p.cache.GetInformer(ctx, obj)
		if err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { p.triggerResync() },
			DeleteFunc: func(any) { p.triggerResync() },
			UpdateFunc: func(oldObj, newObj any) {
				o, ok1 := oldObj.(client.Object)
				n, ok2 := newObj.(client.Object)
				if !ok1 || !ok2 || relevantUpdate(o, n) {
					p.triggerResync()
				}
			},
		}); err != nil {
			return err
		}
	}
	return nil
}

func (p *process) triggerResync() {
	select {
	case p.resyncCh <- struct{}{}:
	default:
	}
}

// assemble builds the stages: health (store, lease, status writer, reporter) and deliver
// (the puller and the workers' environment), each with what it needs.
func (p *process) assemble() error {
	o := p.o
	m := metrics.New(o.Registry)
	budget := deliver.NewBudget(o.MemoryBudget)
	maxPayload := p.nc.MaxPayload()
	// A pull may bring a few messages of the largest size, never more than a quarter of the
	// budget, and always at least one message.
	pullBytes := int(max(min(o.MemoryBudget/4, 4*maxPayload), maxPayload+64<<10))
	// Through the auth callout a connection is granted its endpoints' consumers on other
	// namespaces' events streams when it connects: a new one renews it (Puller.Regrant).
	var foreign func(string) bool
	if o.Config.NATS.TokenFile != "" {
		ownEvents, ownDeliveries := p.names.EventsStream(), p.names.DeliveriesStream()
		foreign = func(stream string) bool { return stream != ownEvents && stream != ownDeliveries }
	}
	puller, err := deliver.NewPuller(p.nc, pullBytes, foreign, p.log)
	if err != nil {
		return err
	}
	p.puller = puller
	p.pullerRef.Store(puller)
	p.parts = leases.NewPartitions(p.js, p.kv, o.Endpoint, o.Identity, o.Partitions, o.Replicas, o.LeaseTTL, p.log)
	store := state.NewStore(p.kv, o.Namespace, o.DeadLetterNewsWindow, p.log)
	p.status = report.NewStatusWriter(report.StatusConfig{Endpoints: p.workers, Store: store, Holds: p.parts.Holds, JS: p.js, Names: p.names,
		Reader: p.cache, Client: p.mgr.GetClient(), Interval: o.StatusInterval, Log: p.log})
	outboxes := report.NewOutboxes()
	p.health = health.New(store, p.workers.policyOf, p.workers, p.status, outboxes,
		report.Events{Recorder: p.mgr.GetEventRecorderFor("webhook-dispatcher"), Reader: p.cache, Namespace: o.Namespace, Log: p.log})
	p.tally = &counts.FilterTally{Target: p.health}
	// The holder of partition 0 sweeps every endpoint's operational events left behind.
	p.announcer = &report.Announcer{JS: p.js, Names: p.names, Store: p.health, Outboxes: outboxes, Endpoints: p.workers,
		Leader: func() bool { return p.parts.Held(0) }, Interval: o.OpsSweepInterval, Log: p.log}
	p.env = &deliver.Env{JS: p.js, Streams: o.Config.Streams, Names: p.names, Identity: o.Identity, Health: p.health,
		Holds: p.parts.Holds, AllowSources: o.Config.AllowCrossNamespaceSources,
		Dirtied: func(ep string) { p.status.Mark(ep, false) }, Filtered: p.tally.Filtered,
		Puller: puller, Windows: deliver.NewWindows(p.js), LogWriter: deliver.NewLogWriter(p.js, maxPayload, p.log),
		Guard: netguard.Policy{AllowHTTP: o.Config.AllowHTTP, Allowed: o.Config.AllowedCIDRs}, Runners: deliver.NewRunners(),
		Budget: budget, MaxEventBytes: o.Config.MaxEventBytes, MaxPayload: maxPayload, PullBytes: pullBytes,
		InPlaceRetryMax: o.InPlaceRetryMax, Tracer: o.Tracer, Log: p.log}
	p.workers.metrics, p.workers.namespace = m, o.Namespace
	held := m.Held(o.Namespace)
	budget.OnChange(func(n int64) { held.Set(float64(n)) })
	return nil
}

// serve starts the manager and the stages, waits for ctx, then drains.
func (p *process) serve(ctx context.Context) error {
	o := p.o
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	hardCtx, hardStop := context.WithCancel(context.Background())
	defer hardStop()
	p.runCtx, p.hardCtx = runCtx, hardCtx
	p.env.HardCtx = hardCtx

	mgrCtx, mgrStop := context.WithCancel(context.Background())
	defer mgrStop()
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- p.mgr.Start(mgrCtx) }()
	if !p.cache.WaitForCacheSync(ctx) {
		mgrStop()
		<-mgrDone
		return fmt.Errorf("informer caches did not sync")
	}
	p.log.Info("dispatcher started", "identity", o.Identity, "replicas", o.Replicas, "nats", p.nc.ConnectedUrl())

	var bg sync.WaitGroup
	bg.Go(func() { p.watchHealth(runCtx) })
	bg.Go(func() { p.status.Run(runCtx) })
	bg.Go(func() { p.announcer.Run(runCtx) })
	bg.Go(func() { p.parts.Run(runCtx, p.partitionChanged(runCtx)) })
	// The delivery log's writer runs until every worker is done.
	logCtx, stopLog := context.WithCancel(context.Background())
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		p.env.LogWriter.Run(logCtx, hardCtx)
	}()
	// Filters run in every replica's workers: each replica adds what its filters rejected.
	tallyCtx, stopTally := context.WithCancel(context.Background())
	tallied := make(chan struct{})
	go func() {
		defer close(tallied)
		p.tally.Run(tallyCtx)
	}()
	bg.Go(func() { p.resyncLoop(runCtx) })

	<-ctx.Done()
	p.log.Info("stopping: no new pulls; waiting for in-flight deliveries", "grace", o.ShutdownGrace)
	stop()
	graceTimer := time.AfterFunc(o.ShutdownGrace, hardStop)
	workers := p.workers.all()
	for _, w := range workers {
		w.Stop()
	}
	for _, w := range workers {
		w.Wait()
	}
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
	<-mgrDone
	p.log.Info("dispatcher stopped")
	return nil
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
			if p.parts.Of(w.Name()) == part {
				w.Wake()
				if held {
					// Its status was another replica's to write: look at it again.
					p.status.Mark(w.Name(), false)
				}
			}
		}
	}
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
		Serves: p.workers.has, Target: p.health, Interval: p.o.HealthFlushInterval, Log: p.log}
	for ctx.Err() == nil {
		if err := f.Run(ctx); err != nil && ctx.Err() == nil {
			p.log.V(1).Info("folding the delivery log; starting again from the checkpoint", "error", err.Error())
			sleep(ctx, time.Second)
		}
	}
}

// resyncLoop resyncs at start, on every relevant change (debounced) and every 5 minutes (a
// Secret read an hour ago is read again then).
func (p *process) resyncLoop(ctx context.Context) {
	tick := time.NewTicker(5 * time.Minute)
	defer tick.Stop()
	p.resync(ctx)
	close(p.synced)
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.resyncCh:
			// Debounce bursts of changes.
			if !sleep(ctx, 50*time.Millisecond) {
				return
			}
			p.resync(ctx)
		case <-tick.C:
			p.resync(ctx)
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
// except the controller's secretsVersion, which says a referenced Secret changed.
func relevantUpdate(oldObj, newObj client.Object) bool {
	if oldObj.GetGeneration() != newObj.GetGeneration() || !oldObj.GetDeletionTimestamp().Equal(newObj.GetDeletionTimestamp()) {
		return true
	}
	if oldObj.GetAnnotations()[v1alpha1.AnnotationEnable] != newObj.GetAnnotations()[v1alpha1.AnnotationEnable] {
		return true
	}
	o, ok1 := oldObj.(*v1alpha1.WebhookEndpoint)
	n, ok2 := newObj.(*v1alpha1.WebhookEndpoint)
	return ok1 && ok2 && o.Status.SecretsVersion != n.Status.SecretsVersion
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
