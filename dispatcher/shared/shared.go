// Package shared runs the dispatchers of many namespaces in one process: a shared dispatcher
// for the long tail of namespaces, which would otherwise each run an idle pod of their own.
//
// Each namespace is served exactly as its own dispatcher Deployment would serve it, under that
// namespace's identity: the process asks the TokenRequest API for tokens of the namespace's
// dispatcher ServiceAccount (names.SharedDispatcher) and runs dispatcher.Run with them, one of
// the NATS audience for its bus connection (the auth callout grants it that namespace's
// dispatcher permissions, nothing of another namespace) and one of the API server's for its
// Kubernetes client (its Role reads that namespace's endpoints and the Secrets that consent,
// nothing else). The process's own ServiceAccount may do nothing but create those tokens, in
// the namespaces whose RoleBinding lets it. What one namespace's dispatcher holds (its
// connection, informers, workers, Secrets read) is its own; they share the Go runtime, the
// metrics registry and the /metrics and probe endpoints. docs/security.md says what this
// trades.
package shared

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/dispatcher/deliver"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/satoken"
)

// TokenLifetime is how long a namespace's tokens are valid; they are refreshed at 80% of it.
const TokenLifetime = time.Hour

// Options configure a shared dispatcher.
type Options struct {
	// Dispatcher is what every namespace's dispatcher runs with: its Namespace, RestConfig,
	// NATS token file, Metrics and addresses are set for each namespace.
	Dispatcher dispatcher.Options
	// RestConfig is the process's own identity: it reaches the API server to create the
	// namespaces' tokens, and each namespace's client keeps its host and CA with that
	// namespace's token instead of these credentials.
	RestConfig *rest.Config
	// Audience of the bus tokens (natsauth.DefaultAudience).
	Audience string
	// ServiceAccount is each namespace's dispatcher ServiceAccount (names.SharedDispatcher).
	ServiceAccount string
	// Dir keeps the namespaces' tokens (a memory-backed volume in a pod).
	Dir string
	// MetricsAddr and ProbeAddr serve the process's /metrics (every namespace's series) and
	// /healthz, /readyz ("0" disables).
	MetricsAddr, ProbeAddr string
	// Retry is the first wait after a namespace's dispatcher failed to start or stopped by
	// itself; it doubles to a minute (default 1s).
	Retry time.Duration
	// MemoryBudget bounds the bytes of events and deliveries the whole process holds (0: no
	// bound but each namespace's own, Dispatcher.MemoryBudget): the namespaces share it, each
	// within its own, and one that holds nothing may always take a message.
	MemoryBudget int64
	// IdleAfter is how long a namespace's dispatcher runs with nothing to do before it is
	// stopped until something arrives (sleep.go); 0 keeps every namespace's running.
	IdleAfter time.Duration
	// Logger logs; each namespace's dispatcher logs with its namespace.
	Logger logr.Logger
}

// Shared serves a changing set of namespaces (Serve) until its Run ends.
type Shared struct {
	o    Options
	kube kubernetes.Interface

	mu  sync.Mutex
	ctx context.Context
	// want are the namespaces to serve (Serve), serving those served, draining those let go
	// of whose dispatcher may still be draining.
	want     []Entry
	serving  map[string]*served
	draining map[string]*served
	wg       sync.WaitGroup
	gauges   *gauges
}

// served is one namespace's dispatcher: stop ends it, done is closed when it ended. entry is
// the pool's line for it (s.mu), changed is told when it changes.
type served struct {
	stop    context.CancelFunc
	done    chan struct{}
	entry   Entry
	version uint64
	asleep  bool
	changed chan struct{}
}

// New makes a shared dispatcher.
func New(o Options) (*Shared, error) {
	if o.ServiceAccount == "" {
		o.ServiceAccount = names.SharedDispatcher
	}
	if o.Retry <= 0 {
		o.Retry = time.Second
	}
	if o.Dir == "" {
		return nil, errors.New("a directory for the namespaces' tokens is required")
	}
	if o.Audience == "" {
		return nil, errors.New("the audience of the bus tokens is required")
	}
	if o.Dispatcher.Config.NATS.CredsFile != "" {
		return nil, errors.New("a shared dispatcher connects to NATS with each namespace's token through the auth callout, not with credentials of its own: it cannot run with --nats-creds")
	}
	// One set of metrics, labelled by namespace, for every namespace's dispatcher.
	if o.Dispatcher.Registry == nil {
		o.Dispatcher.Registry = ctrlmetrics.Registry
	}
	o.Dispatcher.Metrics = metrics.New(o.Dispatcher.Registry)
	if o.MemoryBudget > 0 {
		o.Dispatcher.MemoryPool = deliver.NewBudget(o.MemoryBudget, nil)
	}
	kube, err := kubernetes.NewForConfig(o.RestConfig)
	if err != nil {
		return nil, err
	}
	g, err := newGauges(o.Dispatcher.Registry)
	if err != nil {
		return nil, err
	}
	return &Shared{o: o, kube: kube, serving: map[string]*served{}, draining: map[string]*served{}, gauges: g}, nil
}

// Run serves /metrics and the probes, and the namespaces Serve names, until ctx ends; then it
// stops every namespace's dispatcher (each drains within its grace) and returns.
func (s *Shared) Run(ctx context.Context) error {
	mgr, err := s.manager()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ctx = ctx
	s.apply()
	s.mu.Unlock()
	mctx, mstop := context.WithCancel(context.Background())
	mgrErr := make(chan error, 1)
	go func() { mgrErr <- mgr.Start(mctx) }()
	var failed error
	select {
	case <-ctx.Done():
	case failed = <-mgrErr:
		failed = fmt.Errorf("the metrics and probe servers stopped: %w", failed)
	}
	s.mu.Lock()
	s.want = nil
	s.apply()
	s.mu.Unlock()
	s.wg.Wait()
	mstop()
	if failed == nil {
		<-mgrErr
	}
	return failed
}

// manager serves the process's /metrics and probes; it runs no informer.
func (s *Shared) manager() (manager.Manager, error) {
	d := s.o.Dispatcher
	d.MetricsAddr = s.o.MetricsAddr
	mo, err := dispatcher.MetricsOptions(d)
	if err != nil {
		return nil, err
	}
	mgr, err := manager.New(s.o.RestConfig, manager.Options{Metrics: mo, HealthProbeBindAddress: s.o.ProbeAddr, Logger: s.o.Logger})
	if err != nil {
		return nil, err
	}
	_ = mgr.AddHealthzCheck("ping", healthz.Ping)
	_ = mgr.AddReadyzCheck("ping", healthz.Ping)
	return mgr, nil
}

// Serve makes the namespaces of entries the ones served: a dispatcher starts for each one not
// served yet, and the dispatcher of each one no longer named stops (draining its in-flight
// deliveries; another replica or the namespace's own dispatcher takes its partitions over); a
// sleeping namespace whose entry changed is woken. It may be called before Run starts and at
// any time while it runs.
func (s *Shared) Serve(entries []Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.want = slices.Clone(entries)
	s.apply()
}

// apply starts and stops dispatchers to serve s.want, once Run started (s.mu held).
func (s *Shared) apply() {
	if s.ctx == nil {
		return
	}
	want := map[string]bool{}
	entries := map[string]Entry{}
	for _, e := range s.want {
		want[e.Namespace] = s.ctx.Err() == nil
		entries[e.Namespace] = e
	}
	for ns, sv := range s.serving {
		if want[ns] && sv.entry != entries[ns] {
			sv.entry = entries[ns]
			sv.version++
			select {
			case sv.changed <- struct{}{}:
			default:
			}
		}
		if !want[ns] {
			sv.stop()
			delete(s.serving, ns)
			s.draining[ns] = sv
			s.o.Logger.Info("no longer serving namespace", "namespace", ns)
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(want)) {
		if !want[ns] || s.serving[ns] != nil {
			continue
		}
		ctx, stop := context.WithCancel(s.ctx)
		sv := &served{stop: stop, done: make(chan struct{}), entry: entries[ns], changed: make(chan struct{}, 1)}
		s.serving[ns] = sv
		// A namespace named again while its last dispatcher still drains starts once that one
		// ended: never two of one namespace in a process (they would share an identity, and
		// its tokens' directory).
		before := s.draining[ns]
		delete(s.draining, ns)
		s.o.Logger.Info("serving namespace", "namespace", ns)
		s.wg.Go(func() {
			defer func() {
				s.mu.Lock()
				if s.draining[ns] == sv {
					delete(s.draining, ns)
				}
				s.mu.Unlock()
				close(sv.done)
			}()
			if before != nil {
				select {
				case <-before.done:
				case <-ctx.Done():
					return
				}
			}
			s.serve(ctx, ns, sv)
		})
	}
}

// Serving are the namespaces served now, sorted.
func (s *Shared) Serving() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.serving))
}

// Asleep are the namespaces served whose dispatcher sleeps now, sorted.
func (s *Shared) Asleep() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for ns, sv := range s.serving {
		if sv.asleep {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return out
}

// serve runs namespace ns's dispatcher until ctx ends, starting it again after a failure with
// a backoff (a namespace whose RoleBinding is not there yet, a bus that refuses it).
func (s *Shared) serve(ctx context.Context, ns string, sv *served) {
	log := s.o.Logger.WithValues("namespace", ns)
	wait := s.o.Retry
	for ctx.Err() == nil {
		began := time.Now()
		err := s.runOnce(ctx, ns, sv, log)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("it stopped by itself")
		}
		if time.Since(began) > time.Minute {
			wait = s.o.Retry
		}
		log.Error(err, "the namespace's dispatcher stopped; starting it again", "after", wait.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
	}
}

// runOnce gets namespace ns's tokens and runs its dispatcher with them until ctx ends or it
// fails, letting it sleep while it is idle (sleep.go).
func (s *Shared) runOnce(ctx context.Context, ns string, sv *served, log logr.Logger) error {
	dir := filepath.Join(s.o.Dir, ns)
	defer os.RemoveAll(dir)
	logf := func(format string, args ...any) { log.Info(fmt.Sprintf(format, args...)) }
	bus, err := satoken.Start(ctx, s.kube, ns, s.o.ServiceAccount, []string{s.o.Audience}, TokenLifetime, filepath.Join(dir, "nats-token"), logf)
	if err != nil {
		return fmt.Errorf("the namespace's bus identity: %w", err)
	}
	defer bus.Close()
	api, err := satoken.Start(ctx, s.kube, ns, s.o.ServiceAccount, nil, TokenLifetime, filepath.Join(dir, "token"), logf)
	if err != nil {
		return fmt.Errorf("the namespace's Kubernetes identity: %w", err)
	}
	defer api.Close()

	o := s.o.Dispatcher
	o.Namespace = ns
	o.Endpoint = ""
	o.MetricsAddr, o.ProbeAddr = "0", "0"
	o.Logger = s.o.Logger
	o.Config.NATS.TokenFile, o.Config.NATS.Namespace = bus.Path(), ns
	o.RestConfig = AsServiceAccount(s.o.RestConfig, api.Path())
	if s.o.IdleAfter <= 0 {
		s.gauges.set(ns, stateAwake)
		defer s.gauges.set(ns, stateGone)
		return dispatcher.Run(ctx, o)
	}
	return s.runSleeping(ctx, ns, sv, o, log)
}

// AsServiceAccount is base's API server (host, CA, TLS server name) reached with the token
// in file, which client-go reads again as it changes, and nothing else of base's credentials.
func AsServiceAccount(base *rest.Config, file string) *rest.Config {
	anon := rest.AnonymousClientConfig(base)
	anon.BearerTokenFile = file
	return anon
}
