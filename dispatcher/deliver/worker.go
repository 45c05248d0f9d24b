// Package deliver delivers each endpoint's deliveries: a Worker per endpoint pulls from its
// durable consumer (the pull loop), waits at the gate (suspend, lease, circuit, half-open
// probe, rate and concurrency limits), keeps per-key queues for PerKey ordering, sends one
// HTTP attempt at a time (send) and settles each outcome in one place (settle): acknowledged
// after its delivery-log record is stored, retried (in place or as a message schedule), or
// dead-lettered. A byte budget shared by every worker bounds what is held in memory.
package deliver

import (
	"context"
	"errors"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// Health is what delivery needs of the endpoints' shared state.
type Health interface {
	// Fast reports, without locks, whether an endpoint is disabled and whether its successes
	// must be written at once.
	Fast(ep string) (disabled, needsSync bool)
	// Ramping reports whether the endpoint ramps up after its circuit closed.
	Ramping(ep string, p policy.Policy, now time.Time) bool
	Snapshot(ep string) health.State
	// Refresh reads the endpoint's state from the bucket now (another replica's change the
	// polled watch has not brought yet).
	Refresh(ctx context.Context, ep string) error
	// Change changes the state by compare-and-set and reports the consequences.
	Change(ctx context.Context, ep string, fn func(s *health.State, now time.Time) []health.Transition) (health.State, error)
	// DisabledReason says why an endpoint is disabled, or false.
	DisabledReason(ep string) (string, bool)
}

// Env is what every worker of a dispatcher shares.
type Env struct {
	JS       jetstream.JetStream
	Names    streams.NamespaceNames
	Identity string
	Health   Health
	// Leader reports whether this replica holds the lease.
	Leader  func() bool
	Guard   netguard.Policy
	Runners *Runners
	Budget  *Budget
	// MaxEventBytes is the largest event delivered; MaxPayload the server's limit on one
	// message; PullBytes bounds what one pull may bring.
	MaxEventBytes int
	MaxPayload    int64
	PullBytes     int
	// InPlaceRetryMax: retries due sooner are waited out by the worker; later ones become
	// JetStream message schedules.
	InPlaceRetryMax time.Duration
	// HardCtx ends a grace period after a stop was asked: in-flight requests are aborted.
	HardCtx context.Context
	// Tracer makes each attempt a span; nil traces nothing.
	Tracer *tracing.Tracer
	Log    logr.Logger
}

// mode is what a worker may do right now.
type mode int

const (
	modePaused mode = iota // suspended, circuit open, not configured, or waiting for leadership
	modeProbe              // half-open: this replica delivers one at a time
	modeRun                // deliver normally (a disabled endpoint runs to dead-letter)
)

// Worker delivers one endpoint.
type Worker struct {
	env  *Env
	name string

	cfg    atomic.Pointer[endpoint.Config]
	client atomic.Pointer[http.Client]
	// changed wakes the worker when its configuration or shared state changed.
	changed chan struct{}

	slots   *slots
	limiter *rate.Limiter
	ramped  atomic.Bool // limits are below the configuration: ramping up after the circuit closed
	// unlimited says the limiter allows any rate, so deliveries need not reserve a token.
	unlimited atomic.Bool
	// busy says the last pull session received messages (see consume).
	busy atomic.Bool
	// refreshed is when the endpoint's state was last read from the bucket (unix
	// nanoseconds; see mode).
	refreshed atomic.Int64
	keys      keyQueues

	// Metrics are the endpoint's metric handles.
	Metrics *metrics.Endpoint
	// Dirty says deliveries happened since the status was last written.
	Dirty atomic.Bool

	inflight sync.WaitGroup
	// active counts messages being worked on here; probeBusy is the half-open probe token.
	active    atomic.Int64
	probeBusy atomic.Bool
	cancel    context.CancelFunc
	done      chan struct{}
}

// NewWorker returns the worker of endpoint name; Configure it, then Start it.
func NewWorker(env *Env, name string, m *metrics.Endpoint) *Worker {
	return &Worker{
		env:     env,
		name:    name,
		changed: make(chan struct{}, 1),
		slots:   newSlots(1),
		limiter: rate.NewLimiter(rate.Inf, 1),
		keys:    keyQueues{busy: map[string][]jetstream.Msg{}},
		Metrics: m,
		done:    make(chan struct{}),
	}
}

// Name is the endpoint's name.
func (w *Worker) Name() string { return w.name }

// Config is the endpoint's current configuration.
func (w *Worker) Config() *endpoint.Config { return w.cfg.Load() }

// Configure installs a new configuration.
func (w *Worker) Configure(c *endpoint.Config) {
	old := w.cfg.Swap(c)
	if !endpoint.SameTransport(old, c) || w.client.Load() == nil {
		prev := w.client.Swap(newClient(newTransport(w.env.Guard, c.MaxInFlight, c.TLS)))
		if prev != nil {
			// Idle connections of the old transport are closed once in-flight requests end.
			go func() { time.Sleep(c.Timeout + time.Second); prev.CloseIdleConnections() }()
		}
	}
	w.applyLimits(c, w.env.Health.Snapshot(w.name))
	w.Wake()
}

// Wake makes the worker look at its configuration and state again.
func (w *Worker) Wake() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Start runs the worker until ctx ends or Stop is called.
func (w *Worker) Start(ctx context.Context) {
	ctx, w.cancel = context.WithCancel(ctx)
	go w.run(ctx)
}

// Stop asks the worker to stop pulling; Wait waits for it and its in-flight deliveries.
func (w *Worker) Stop() {
	if w.cancel != nil {
		w.cancel()
	}
}

// Wait waits for the worker's loop and its in-flight deliveries.
func (w *Worker) Wait() {
	<-w.done
	w.inflight.Wait()
}

// applyLimits sets concurrency and rate for the current configuration and ramp-up.
func (w *Worker) applyLimits(c *endpoint.Config, st health.State) {
	f := health.RampFactor(&st, c.Policy, time.Now())
	// While limited, mode() keeps calling here, so the full limits come back when the ramp ends.
	w.ramped.Store(f < 1)
	conc := max(1, int(math.Ceil(float64(c.MaxInFlight)*f)))
	w.slots.setLimit(conc)
	w.Metrics.ConcLimit.Set(float64(conc))
	limit, burst := rate.Inf, 1
	if c.RateLimit > 0 {
		// Rate-limited endpoints are delivered by one replica at a time (the lease holder),
		// so its token bucket is the endpoint's.
		limit, burst = rate.Limit(c.RateLimit), max(1, c.Burst)
	}
	if f < 1 {
		// Slow start after the circuit closes: from 1/s doubling up to ~1000/s over the ramp.
		ramp := rate.Limit(math.Pow(2, 10*f))
		if limit == rate.Inf || ramp < limit {
			limit, burst = ramp, 1
		}
	}
	if limit != rate.Inf {
		w.unlimited.Store(false)
	}
	if w.limiter.Limit() != limit || w.limiter.Burst() != burst {
		w.limiter.SetLimit(limit)
		w.limiter.SetBurst(burst)
	}
	w.unlimited.Store(limit == rate.Inf)
	if limit == rate.Inf {
		w.Metrics.RateLimit.Set(math.Inf(1))
	} else {
		w.Metrics.RateLimit.Set(float64(limit))
	}
}

// run is the worker's loop until ctx ends; in-flight deliveries finish within grace.
func (w *Worker) run(ctx context.Context) {
	defer close(w.done)
	var cons jetstream.Consumer
	for ctx.Err() == nil {
		m, recheck := w.mode(ctx)
		if m != modePaused && cons == nil {
			var err error
			cons, err = w.env.JS.Consumer(ctx, w.env.Names.DeliveriesStream(), w.env.Names.EndpointConsumer(w.name))
			if err != nil {
				// The controller creates the consumer; wait for it.
				cons = nil
				m, recheck = modePaused, 2*time.Second
			}
		}
		switch m {
		case modePaused:
			w.waitChange(ctx, recheck)
		case modeProbe:
			w.probe(ctx, cons)
		case modeRun:
			if err := w.consume(ctx, cons, recheck); err != nil {
				if errors.Is(err, jetstream.ErrConsumerNotFound) {
					cons = nil
				}
				w.waitChange(ctx, time.Second)
			} else if c := w.cfg.Load(); c != nil && c.PerKey {
				// Let the server return what the ended session could not take to its
				// redelivery queue before pulling again: that queue is served first, in order.
				sleepCtx(ctx, perKeySessionGap)
			}
		}
	}
}

func (w *Worker) waitChange(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-w.changed:
	case <-t.C:
	}
}

// busyHeartbeat is the pull heartbeat of an endpoint that is receiving deliveries.
const busyHeartbeat = time.Second

// perKeySessionGap is how long a PerKey endpoint waits between two pull sessions.
const perKeySessionGap = 200 * time.Millisecond

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// consume pulls and delivers until the mode changes, recheck passes, or ctx ends.
func (w *Worker) consume(ctx context.Context, cons jetstream.Consumer, recheck time.Duration) error {
	c := w.cfg.Load()
	batch := min(max(c.MaxInFlight, 1), 512)
	if c.PerKey {
		batch = 512
	}
	// Under load the server sometimes ends a pull request without the client noticing (the
	// consumer then shows messages pending and no waiting pull, and nothing is delivered).
	// The iterator notices after two missed heartbeats and pulls again. Idle endpoints keep the
	// default heartbeat (15s, cheap with thousands of them); the session after one that
	// received messages has a 1s heartbeat, so a lost pull holds a busy endpoint up for about
	// 2s instead of 30s.
	//
	// A session is never ended just to change its heartbeat: the pull request it has
	// outstanding stays on the server until it expires, and with the auth callout (pull
	// requests reach the JetStream account through a service import) the server goes on
	// delivering to it after the session's inbox is gone; those messages then wait for their
	// AckWait before anyone sees them again.
	//
	// A PerKey endpoint keeps one session while it delivers. A session that ends while
	// messages stream hands the server messages it can no longer deliver; it puts them on its
	// redelivery queue for the next session, which may by then have received later ones, and a
	// key's events would go out of order. So a PerKey session starts with the busy heartbeat
	// instead of switching to it, and its recheck timer only re-evaluates the mode.
	//
	// A pull brings at most PullBytes: what waits in the iterator is bounded too, not only
	// what the byte budget admitted.
	keepSession := c.PerKey
	busy := w.busy.Load() || keepSession
	opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessagesWithBytesLimit(batch, w.env.PullBytes), jetstream.PullExpiry(30 * time.Second)}
	if busy {
		opts = append(opts, jetstream.PullHeartbeat(busyHeartbeat))
	}
	it, err := cons.Messages(opts...)
	if err != nil {
		return err
	}
	received := false
	defer func() { w.busy.Store(received) }()
	stop := make(chan struct{})
	var stopped sync.WaitGroup
	stopped.Go(func() { w.watchSession(ctx, it, c, recheck, keepSession, stop) })
	defer func() { close(stop); stopped.Wait() }()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				continue // the iterator pulls again
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return err
		}
		received = true
		if ctx.Err() != nil {
			_ = msg.Nak()
			continue
		}
		w.take(ctx, msg)
	}
}

// watchSession ends a pull session (drains its iterator) when ctx ends, when the mode or the
// pull configuration changed, or when recheck passes (a PerKey session re-evaluates instead);
// stop ends the watch with the session.
func (w *Worker) watchSession(ctx context.Context, it jetstream.MessagesContext, c *endpoint.Config, recheck time.Duration, keepSession bool, stop <-chan struct{}) {
	// stillRuns re-evaluates the mode: whether this session may go on, and when to look again.
	stillRuns := func() (bool, time.Duration) {
		m, next := w.mode(ctx)
		return m == modeRun && !pullChanged(c, w.cfg.Load()), next
	}
	t := time.NewTimer(recheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			it.Drain()
			return
		case <-stop:
			return
		case <-t.C:
			if keepSession {
				if ok, next := stillRuns(); ok {
					t.Reset(next)
					continue
				}
			}
			it.Drain()
			return
		case <-w.changed:
			if ok, _ := stillRuns(); !ok {
				it.Drain()
				// Let the next loop see the change too.
				w.Wake()
				return
			}
		}
	}
}

// take holds a pulled message in memory (within the byte budget, waiting for room: nothing
// more is pulled meanwhile) and starts its delivery, or queues it behind its key.
func (w *Worker) take(ctx context.Context, msg jetstream.Msg) {
	size := msgSize(msg)
	if !w.env.Budget.Acquire(ctx, size) {
		_ = msg.Nak()
		return
	}
	if w.cfg.Load().PerKey {
		w.enqueueKeyed(ctx, msg, size)
		return
	}
	// The consumer's MaxAckPending bounds how many messages are out at once.
	w.inflight.Add(1)
	w.env.Runners.Go(func() {
		defer w.inflight.Done()
		defer w.env.Budget.Release(size)
		w.runMsg(ctx, msg)
	})
}

// msgSize is what a message holds in memory, roughly: payload and headers.
func msgSize(msg jetstream.Msg) int64 {
	n := len(msg.Data())
	for k, vs := range msg.Headers() {
		for _, v := range vs {
			n += len(k) + len(v)
		}
	}
	return int64(n)
}

// pullChanged reports whether a new configuration changes how the worker pulls.
func pullChanged(a, b *endpoint.Config) bool {
	return b == nil || a.PerKey != b.PerKey || a.MaxInFlight != b.MaxInFlight || a.Suspend != b.Suspend || a.Deleting != b.Deleting
}
