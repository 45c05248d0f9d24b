package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
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
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/kube"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

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
	// HealthFlushInterval is how often batched health counts reach the bucket (default 2s).
	HealthFlushInterval time.Duration
	// InPlaceRetryMax: retries due sooner than this are waited out by the worker; later ones
	// become JetStream message schedules (default 2s; the server fires schedules with about
	// one second's resolution).
	InPlaceRetryMax time.Duration
	// LeaseTTL is how long a silent lease holder keeps the lease (default 10s).
	LeaseTTL time.Duration
	// Registry receives the Prometheus metrics (default: controller-runtime's registry).
	Registry prometheus.Registerer
	// Logger logs.
	Logger logr.Logger
}

// Dispatcher is a running dispatcher.
type Dispatcher struct {
	namespace string
	dedicated string
	identity  string
	replicas  int
	cfg       opconfig.Config
	// names are the streams, bucket and subjects of the namespace.
	names streams.NamespaceNames

	inPlaceRetryMax time.Duration
	guard           netguard.Policy
	runners         *runners
	log             logr.Logger

	nc       *nats.Conn
	js       jetstream.JetStream
	health   *healthStore
	metrics  *metrics
	status   *statusWriter
	lease    *lease
	cache    cache.Cache
	client   client.Client
	recorder record.EventRecorder
	secrets  *secretCache

	routes atomic.Pointer[routeTable]
	// synced is closed after the first resync: the router waits for it, so no event is routed
	// against an empty table.
	synced chan struct{}

	mu             sync.Mutex
	workers        map[string]*worker
	secretVersions map[string]string

	// runCtx ends when a stop is asked; hardCtx ends ShutdownGrace later and aborts requests.
	runCtx  context.Context
	hardCtx context.Context
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
		o.HealthFlushInterval = 2 * time.Second
	}
	if o.InPlaceRetryMax <= 0 {
		o.InPlaceRetryMax = 2 * time.Second
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 10 * time.Second
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
	d := &Dispatcher{
		namespace: o.Namespace, dedicated: o.Endpoint, identity: o.Identity, replicas: o.Replicas, inPlaceRetryMax: o.InPlaceRetryMax,
		cfg: o.Config, names: o.Config.Streams.Names.For(o.Namespace), log: log, workers: map[string]*worker{}, secretVersions: map[string]string{},
		guard:   netguard.Policy{AllowHTTP: o.Config.AllowHTTP, Allowed: o.Config.AllowedCIDRs},
		runners: newRunners(),
	}
	d.routes.Store(&routeTable{})
	d.synced = make(chan struct{})

	nc, _, err := o.Config.Connect("webhook-dispatcher "+o.Namespace+" "+o.Identity,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Info("disconnected from NATS", "error", err.Error())
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("reconnected to NATS") }))
	if err != nil {
		return err
	}
	defer nc.Close()
	d.nc = nc
	// webhook_nats_connected (see opconfig.NATSConnectedMetric), read from the connection at
	// every scrape.
	if err := o.Registry.Register(opconfig.NATSConnectedMetric(nc.IsConnected)); err != nil {
		return err
	}
	// Every asynchronous publish resolves (acknowledged or failed) within 10s, so the router's
	// in-order acknowledgement of events can never wait forever on a lost reply.
	if d.js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192), jetstream.WithPublishAsyncTimeout(10*time.Second)); err != nil {
		return err
	}
	kv, err := waitForBucket(ctx, d.js, d.names.Bucket(), log)
	if err != nil {
		return err
	}
	d.metrics = newMetrics(o.Registry)
	d.health = newHealthStore(kv, func(ep string, transition bool) {
		if transition {
			// Perhaps another replica's transition: whichever replica holds the lease writes
			// the status, at once.
			d.status.mark(ep, true)
		}
		if w := d.worker(ep); w != nil {
			w.wake()
		}
	})
	d.status = newStatusWriter(d, o.StatusInterval)
	d.lease = &lease{kv: kv, key: streams.LeaseKey(o.Endpoint), identity: o.Identity, ttl: o.LeaseTTL}

	cacheOpts := cache.Options{
		Scheme:            kube.Scheme(),
		DefaultNamespaces: map[string]cache.Config{o.Namespace: {}},
	}
	if o.Endpoint != "" {
		cacheOpts.ByObject = map[client.Object]cache.ByObject{
			&v1alpha1.WebhookEndpoint{}: {Field: fields.OneTermEqualSelector("metadata.name", o.Endpoint)},
		}
	}
	mgr, err := manager.New(o.RestConfig, manager.Options{
		Scheme:                 kube.Scheme(),
		Cache:                  cacheOpts,
		Metrics:                metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress: o.ProbeAddr,
		Logger:                 log,
		GracefulShutdownTimeout: func() *time.Duration {
			t := o.ShutdownGrace + 5*time.Second
			return &t
		}(),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	d.cache = mgr.GetCache()
	d.client = mgr.GetClient()
	d.recorder = mgr.GetEventRecorderFor("webhook-dispatcher")
	d.secrets = &secretCache{reader: mgr.GetAPIReader(), namespace: o.Namespace, ttl: 5 * time.Minute, m: map[string]cachedSecret{}}
	_ = mgr.AddHealthzCheck("ping", healthz.Ping)
	_ = mgr.AddReadyzCheck("nats", func(*http.Request) error {
		if !nc.IsConnected() {
			return errors.New("not connected to NATS")
		}
		return nil
	})
	_ = mgr.AddReadyzCheck("informers", func(r *http.Request) error {
		if !d.cache.WaitForCacheSync(r.Context()) {
			return errors.New("informers not synced")
		}
		return nil
	})

	resyncCh := make(chan struct{}, 1)
	trigger := func() {
		select {
		case resyncCh <- struct{}{}:
		default:
		}
	}
	for _, obj := range []client.Object{&v1alpha1.WebhookEndpoint{}, &v1alpha1.RetryPolicy{}} {
		inf, err := d.cache.GetInformer(ctx, obj)
		if err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { trigger() },
			DeleteFunc: func(any) { trigger() },
			UpdateFunc: func(oldObj, newObj any) {
				o, ok1 := oldObj.(client.Object)
				n, ok2 := newObj.(client.Object)
				if !ok1 || !ok2 || relevantUpdate(o, n) {
					trigger()
				}
			},
		}); err != nil {
			return err
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	hardCtx, hardStop := context.WithCancel(context.Background())
	defer hardStop()
	d.runCtx, d.hardCtx = runCtx, hardCtx

	mgrCtx, mgrStop := context.WithCancel(context.Background())
	defer mgrStop()
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()
	if !d.cache.WaitForCacheSync(ctx) {
		mgrStop()
		<-mgrDone
		return fmt.Errorf("informer caches did not sync")
	}
	log.Info("dispatcher started", "identity", o.Identity, "replicas", o.Replicas, "nats", nc.ConnectedUrl())

	var bg sync.WaitGroup
	goBG := func(f func()) { bg.Add(1); go func() { defer bg.Done(); f() }() }
	goBG(func() {
		for runCtx.Err() == nil {
			if err := d.health.watch(runCtx, d.nc, d.js); err != nil {
				log.V(1).Info("health watch", "error", err.Error())
			}
			select {
			case <-runCtx.Done():
			case <-time.After(time.Second):
			}
		}
	})
	goBG(func() {
		t := time.NewTicker(o.HealthFlushInterval)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
				d.health.flush(runCtx, d.policyOf)
			}
		}
	})
	goBG(func() { d.status.run(runCtx) })
	goBG(func() {
		var routerStop context.CancelFunc
		var routerDone chan struct{}
		d.lease.run(runCtx, func(held bool) {
			log.Info("lease", "held", held)
			if held {
				rctx, cancel := context.WithCancel(runCtx)
				routerStop, routerDone = cancel, make(chan struct{})
				done := routerDone
				go func() {
					defer close(done)
					select {
					case <-d.synced:
					case <-rctx.Done():
						return
					}
					r := &router{d: d}
					if err := r.run(rctx); err != nil {
						log.Error(err, "router")
					}
				}()
			} else if routerStop != nil {
				routerStop()
				<-routerDone
				routerStop = nil
			}
			d.mu.Lock()
			for _, w := range d.workers {
				w.wake()
			}
			d.mu.Unlock()
		})
	})
	goBG(func() {
		tick := time.NewTicker(5 * time.Minute)
		defer tick.Stop()
		d.resync(runCtx)
		close(d.synced)
		for {
			select {
			case <-runCtx.Done():
				return
			case <-resyncCh:
				// Debounce bursts of changes.
				select {
				case <-time.After(50 * time.Millisecond):
				case <-runCtx.Done():
					return
				}
				d.resync(runCtx)
			case <-tick.C:
				d.secrets.invalidate()
				d.resync(runCtx)
			}
		}
	})

	<-ctx.Done()
	log.Info("stopping: no new pulls; waiting for in-flight deliveries", "grace", o.ShutdownGrace)
	stop()
	graceTimer := time.AfterFunc(o.ShutdownGrace, hardStop)
	d.mu.Lock()
	workers := make([]*worker, 0, len(d.workers))
	for _, w := range d.workers {
		workers = append(workers, w)
	}
	d.mu.Unlock()
	for _, w := range workers {
		if w.cancel != nil {
			w.cancel()
		}
	}
	for _, w := range workers {
		w.wait()
	}
	graceTimer.Stop()
	bg.Wait()
	fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
	d.health.flush(fctx, d.policyOf)
	fcancel()
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		log.V(1).Info("flushing NATS", "error", err.Error())
	}
	mgrStop()
	<-mgrDone
	log.Info("dispatcher stopped")
	return nil
}

type policyT = policy.Policy

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
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

func (d *Dispatcher) worker(ep string) *worker {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.workers[ep]
}

func (d *Dispatcher) endpointNames() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.workers))
	for n := range d.workers {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (d *Dispatcher) policyOf(ep string) (policyT, bool) {
	if w := d.worker(ep); w != nil {
		if c := w.cfg.Load(); c != nil {
			return c.Policy, true
		}
	}
	return policyT{}, false
}

func (d *Dispatcher) isLeader() bool { return d.lease.held.Load() }

func (d *Dispatcher) markActive(ep string) { d.status.mark(ep, false) }
