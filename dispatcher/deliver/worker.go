// Package deliver delivers each endpoint's deliveries. A Worker per endpoint takes messages
// from two kinds of durable consumers, through the dispatcher's Puller: its consumer on the
// events stream (every event its patterns match, delivered straight from there) and its
// consumer on the deliveries stream (retries, replays, test deliveries, and events it held
// there). Each message waits at the gate (suspend, lease, circuit, half-open probe, rate and
// concurrency limits), PerKey endpoints keep per-key queues, one HTTP attempt is sent at a time
// (send) and each outcome is settled in one place (settle): acknowledged after its
// delivery-log record is stored, retried (in place or as a message schedule), or
// dead-lettered. An endpoint that cannot deliver now (suspended, circuit open) or lags behind
// what the events stream's limits keep holds its events: it copies them into the deliveries
// stream (hold.go), where nothing ages out. A byte budget shared by every worker bounds what is
// held in memory.
//
// A worker has a goroutine only while it has something to do: an idle endpoint is a pull
// request waiting at the server and a few structures here.
package deliver

import (
	"context"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/match"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/records"
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
	Snapshot(ep string) state.State
	// Refresh reads the endpoint's state from the bucket now (another replica's change the
	// polled watch has not brought yet).
	Refresh(ctx context.Context, ep string) error
	// Change changes the state by compare-and-set and reports the consequences.
	Change(ctx context.Context, ep string, fn func(s *state.State, now time.Time) []state.Transition) (state.State, error)
	// DisabledReason says why an endpoint is disabled, or false.
	DisabledReason(ep string) (string, bool)
}

// Env is what every worker of a dispatcher shares.
type Env struct {
	JS jetstream.JetStream
	// Streams is the installation's layout (source namespaces' streams); Names the
	// dispatcher's own namespace's.
	Streams  streams.Config
	Names    streams.NamespaceNames
	Identity string
	Health   Health
	// Holds reports whether this replica holds the lease of an endpoint's partition: only the
	// holder delivers a single-active (PerKey or rate-limited) endpoint.
	Holds func(ep string) bool
	// AllowSources says whether endpoints may read other namespaces' events.
	AllowSources bool
	// Dirtied is told when an endpoint's counts or pending start to change (see Worker.Dirty).
	Dirtied func(ep string)
	// Filtered counts an event an endpoint's filter rejected, for its health.
	Filtered func(ep string)
	Puller   *Puller
	Windows  *Windows
	// Room keeps held events within the deliveries stream's hold threshold; nil: no bound.
	Room *Room
	// LogWriter writes the delivery log.
	LogWriter *LogWriter
	Guard     netguard.Policy
	Runners   *Runners
	Budget    *Budget
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

// perKeyBatch is how many messages a PerKey endpoint keeps requested per consumer: later
// deliveries of busy keys wait in memory, in order, while other keys flow.
const perKeyBatch = 512

// Worker delivers one endpoint.
type Worker struct {
	env  *Env
	name string

	cfg    atomic.Pointer[endpoint.Config]
	client atomic.Pointer[http.Client]
	// logSubject is the endpoint's subject in the delivery log; logged indexes it for
	// redelivered messages; deliveriesStream is the namespace's deliveries stream, the one
	// stream whose messages carry delivery metadata.
	logSubject       string
	logged           *decided
	deliveriesStream string
	// busy are the deliveries being attempted or logged.
	busy busy
	// exact says the consumers' filters are the endpoint's patterns; otherwise (patterns that
	// overlap in a way JetStream filters cannot express) events are matched here too.
	exact atomic.Bool

	slots   *slots
	limiter *rate.Limiter
	ramped  atomic.Bool // limits are below the configuration: ramping up after the circuit closed
	// unlimited says the limiter allows any rate, so deliveries need not reserve a token.
	unlimited atomic.Bool
	// refreshed is when the endpoint's state was last read from the bucket (unix
	// nanoseconds; see mode).
	refreshed atomic.Int64
	keys      keyQueues

	// Metrics are the endpoint's metric handles.
	Metrics *metrics.Endpoint
	// Dirty says deliveries happened since the status was last written.
	Dirty atomic.Bool

	inflight sync.WaitGroup
	// inProcess counts messages taken and not yet settled (queued behind a key included);
	// active counts those being worked on; probeBusy is the half-open probe token.
	inProcess atomic.Int64
	active    atomic.Int64
	probeBusy atomic.Bool
	// lagging says the last event taken was among those the events stream's limits drop
	// next: events are held in the deliveries stream until the endpoint catches up.
	lagging atomic.Bool

	mu       sync.Mutex
	ctx      context.Context
	cancel   context.CancelFunc
	queue    []*pulled
	running  bool
	kick     bool
	stopped  bool
	done     chan struct{}
	doneOnce sync.Once
	timer    *time.Timer
	// events are the endpoint's consumers on events streams (its namespace's first, then its
	// source namespaces'); deliveries its consumer on the deliveries stream.
	events     []*Source
	eventsFrom []string
	deliveries *Source
	// held says events were held since the deliveries stream was last found drained: a PerKey
	// endpoint takes no event until every held one has come back from there (drained).
	held bool
}

// NewWorker returns the worker of endpoint name; Configure it, then Start it.
func NewWorker(env *Env, name string, m *metrics.Endpoint) *Worker {
	return &Worker{
		env:              env,
		name:             name,
		logSubject:       env.Names.AttemptSubject(name),
		logged:           &decided{js: env.JS, stream: env.Names.AttemptsStream(), subject: env.Names.AttemptSubject(name)},
		deliveriesStream: env.Names.DeliveriesStream(),
		slots:            newSlots(1),
		limiter:          rate.NewLimiter(rate.Inf, 1),
		keys:             keyQueues{busy: map[string][]jetstream.Msg{}},
		Metrics:          m,
		done:             make(chan struct{}),
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
			time.AfterFunc(c.Timeout+time.Second, prev.CloseIdleConnections)
		}
	}
	_, exact := w.env.Streams.For(w.env.Names.Namespace()).EventFilters(c.EventTypes)
	w.exact.Store(exact)
	w.applyLimits(c, w.env.Health.Snapshot(w.name))
	w.mu.Lock()
	started := w.ctx != nil && !w.stopped
	w.mu.Unlock()
	if started {
		w.syncSources(c)
	}
	w.Wake()
}

// Wake makes the worker look at its configuration and state again.
func (w *Worker) Wake() { w.activate() }

// Start registers the worker's consumers with the puller and starts delivering.
func (w *Worker) Start(ctx context.Context) {
	w.mu.Lock()
	w.ctx, w.cancel = context.WithCancel(ctx)
	w.deliveries = w.env.Puller.Source(w.env.Names.DeliveriesStream(), w.env.Names.EndpointConsumer(w.name), w)
	w.mu.Unlock()
	if c := w.cfg.Load(); c != nil {
		w.syncSources(c)
	}
	w.activate()
}

// syncSources makes the worker's events consumers those of its namespace and, where the
// installation allows it, of its source namespaces.
func (w *Worker) syncSources(c *endpoint.Config) {
	own := w.env.Names.Namespace()
	want := []string{own}
	if w.env.AllowSources {
		want = streams.SourceNamespaces(own, c.Sources)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || slices.Equal(want, w.eventsFrom) {
		return
	}
	keep := map[string]*Source{}
	for i, ns := range w.eventsFrom {
		keep[ns] = w.events[i]
	}
	var srcs []*Source
	for _, ns := range want {
		s := keep[ns]
		if s == nil {
			s = w.env.Puller.Source(w.env.Streams.For(ns).EventsStream(), streams.EndpointConsumerOf(own, w.name), w)
		}
		delete(keep, ns)
		srcs = append(srcs, s)
	}
	for _, s := range keep {
		s.Close()
	}
	w.events, w.eventsFrom = srcs, want
}

// Stop stops taking messages: nothing more is requested, what is queued or arrives is handed
// back. Wait waits for the worker and its in-flight deliveries.
func (w *Worker) Stop() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.stopped = true
	if w.cancel != nil {
		w.cancel()
	}
	srcs := append(slices.Clone(w.events), w.deliveries)
	if w.timer != nil {
		w.timer.Stop()
	}
	started := w.ctx != nil
	w.mu.Unlock()
	for _, s := range srcs {
		if s != nil {
			s.Close()
		}
	}
	if !started {
		w.closeDone()
		return
	}
	w.activate()
}

// Wait waits for the worker and its in-flight deliveries.
func (w *Worker) Wait() {
	<-w.done
	w.inflight.Wait()
}

// Pulled takes a message from one of the worker's consumers (SourceHandler).
func (w *Worker) Pulled(m *pulled) {
	w.mu.Lock()
	w.queue = append(w.queue, m)
	w.mu.Unlock()
	w.activate()
}

// SourceChanged is called when a consumer went missing or came back (SourceHandler).
func (w *Worker) SourceChanged() { w.activate() }

// activate runs a pass of the worker, on a runner, unless one runs: it will run again.
func (w *Worker) activate() {
	w.mu.Lock()
	if w.running {
		w.kick = true
		w.mu.Unlock()
		return
	}
	if w.ctx == nil {
		w.mu.Unlock()
		return
	}
	w.running = true
	w.mu.Unlock()
	w.env.Runners.Go(w.drive)
}

// drive runs passes until nothing more happened meanwhile.
func (w *Worker) drive() {
	for {
		w.pass()
		w.mu.Lock()
		if w.kick || len(w.queue) > 0 {
			w.kick = false
			w.mu.Unlock()
			continue
		}
		w.running = false
		stopped := w.stopped
		w.mu.Unlock()
		if stopped {
			w.closeDone()
		}
		return
	}
}

func (w *Worker) closeDone() { w.doneOnce.Do(func() { close(w.done) }) }

// pass looks at the worker's mode, decides what to request from each consumer, and takes,
// holds or hands back what was pulled.
func (w *Worker) pass() {
	w.mu.Lock()
	ctx, queue := w.ctx, w.queue
	w.queue = nil
	w.mu.Unlock()
	if ctx.Err() != nil {
		for _, m := range queue {
			_ = m.Nak()
		}
		return
	}
	c := w.cfg.Load()
	m, recheck := w.mode(ctx)
	hold := w.holding(c, m)
	w.refill(c, m, hold)
	for _, msg := range queue {
		w.handle(ctx, c, m, hold, msg)
	}
	if w.drainCheck(ctx, c, hold) {
		recheck = min(recheck, 200*time.Millisecond)
	}
	if hold && w.env.Room.Full() {
		recheck = min(recheck, roomRefresh)
	}
	w.arm(recheck)
}

// handle takes, holds or hands back one pulled message.
func (w *Worker) handle(ctx context.Context, c *endpoint.Config, m mode, hold bool, msg *pulled) {
	fromEvents := msg.src != w.deliveries
	switch {
	case c == nil:
		_ = msg.Nak()
	case fromEvents && !w.admit(ctx, c, msg):
		// Not for this endpoint (its filter rejected it, or its consumer's filter is wider than
		// its patterns): settled by admit.
	case !c.Deleting && !fromEvents && strings.HasPrefix(msg.Subject(), w.env.Names.RetrySubject(w.name, "")):
		// A scheduled retry, which the deliveries consumer brings only once the endpoint's
		// deletion widened it: dead-lettered when this dispatcher sees the deletion too, never
		// sent ahead of its time.
		_ = msg.NakWithDelay(time.Second)
	case c.Deleting && fromEvents && afterDeletion(c, msg):
		// Stored after the endpoint was deleted: not its event.
		_ = msg.Ack()
	case c.Deleting:
		// Queued before the endpoint was deleted: dead-lettered (attempt), never sent.
		w.take(ctx, msg)
	case fromEvents && (hold || c.PerKey && w.heldBefore()):
		// Held: copied into the deliveries stream. A PerKey endpoint also holds what still
		// arrives until the events it held before have come back, so no key goes out of order.
		w.hold(ctx, c, msg)
	case fromEvents && c.SingleActive() && !w.env.Holds(w.name):
		// The lease moved: the new holder gets it first.
		_ = msg.Nak()
	case m == modePaused && !c.PerKey:
		// Requested before the endpoint paused (half-open with another replica probing, or
		// suspended with deliveries arriving): hand it back for whoever takes it next.
		_ = msg.NakWithDelay(time.Second)
	default:
		if fromEvents && w.endangered(msg) {
			w.lagging.Store(true)
			w.Wake()
			w.hold(ctx, c, msg)
			return
		}
		if fromEvents {
			w.lagging.Store(false)
			w.Metrics.Routed()
		}
		w.take(ctx, msg)
	}
}

// admit decides whether an event from an events stream is the endpoint's: its patterns match
// (the consumer's filter may be the whole namespace when they overlap), it is not an
// operational event the endpoint does not ask for, and its filter (spec.filter) accepts it.
// An event that is not is acknowledged (a filtered one counted); one the filter cannot decide
// on is dead-lettered as filter_failed. First of all, the operator's headers (Whk-*) its
// producer set are deleted (records.StripOperatorHeaders): whatever follows (holding it,
// delivering it, dead-lettering it) never takes a producer's header for the operator's.
func (w *Worker) admit(ctx context.Context, c *endpoint.Config, msg *pulled) bool {
	ns, typ := eventNamespaceType(msg.Subject(), w.env.Streams.EventsSubjectPrefix)
	records.StripOperatorHeaders(msg.Headers(), typ)
	if ns == "" {
		_ = msg.Ack()
		return false
	}
	if !w.exact.Load() && !slices.ContainsFunc(c.EventTypes, func(p string) bool { return match.Match(p, typ) }) {
		_ = msg.Ack()
		return false
	}
	h := msg.Headers()
	if records.IsOpsType(typ) && !receivesOps(ns, h.Get(records.HOpsEndpoint), w.env.Names.Namespace(), w.name, c.EventTypes) {
		_ = msg.Ack()
		return false
	}
	if c.Filter == nil || len(msg.Data()) > w.env.MaxEventBytes {
		return true
	}
	md, err := msg.Metadata()
	if err != nil {
		_ = msg.Nak()
		return false
	}
	in := expr.NewInput(&expr.Event{ID: records.EventID(md.Stream, md.Sequence.Stream, h), Type: typ, Namespace: ns,
		Time: records.EventTime(h, md.Timestamp), Headers: h, Data: msg.Data()})
	ok, err := c.Filter.Match(ctx, in)
	switch {
	case err != nil && ctx.Err() != nil:
		_ = msg.Nak() // stopping: it comes back
		return false
	case err != nil:
		meta, _, _ := records.EventDelivery(msg.Subject(), w.env.Streams.EventsSubjectPrefix, md.Stream, md.Sequence.Stream, md.Timestamp,
			h, w.env.Names.Namespace(), w.name)
		w.inflight.Add(1)
		w.env.Runners.Go(func() {
			defer w.inflight.Done()
			w.deadLetter(ctx, msg, meta, records.ReasonFilterFailed, records.Bound(err.Error(), records.MaxErrorText), nil, nil)
		})
		return false
	case !ok:
		w.Metrics.Filtered()
		if w.env.Filtered != nil {
			w.env.Filtered(w.name)
		}
		_ = msg.Ack()
		return false
	}
	return true
}

// receivesOps says whether endpoint ep of namespace own (with event-type patterns) receives an
// operational event of namespace ns about endpoint about: only when a pattern names the
// operational types explicitly (its first token is webhook_operator: a catch-all such as > or
// *.created does not receive them), and never an event about ep itself, so an endpoint failing
// to deliver operational events does not feed on its own failures.
func receivesOps(ns, about, own, ep string, patterns []string) bool {
	if about == ep && ns == own {
		return false
	}
	for _, p := range patterns {
		if p == records.OpsTypePrefix || strings.HasPrefix(p, records.OpsTypePrefix+".") {
			return true
		}
	}
	return false
}

// refill sets how many messages each consumer should have requested: the endpoint's free
// concurrency while it runs (PerKey: a window of later deliveries), one while it probes, a
// window of events to hold while it holds, nothing while it is paused.
func (w *Worker) refill(c *endpoint.Config, m mode, hold bool) {
	w.mu.Lock()
	events, deliveries, held := w.events, w.deliveries, w.held
	w.mu.Unlock()
	evWant, dlWant := 0, 0
	switch {
	case c == nil:
	case c.Deleting:
		// Any replica dead-letters what is left, as fast as its concurrency allows.
		evWant = w.free(c)
		dlWant = evWant
	case c.SingleActive() && !w.env.Holds(w.name):
	case hold:
		evWant = perKeyBatch
		if w.env.Room.Full() {
			// No room to hold more: the events wait in the events stream.
			evWant = 0
		}
		if m == modeRun && !c.PerKey {
			dlWant = w.free(c)
		} else if m == modeRun {
			dlWant = perKeyBatch
		}
	case m == modeProbe:
		evWant, dlWant = 1, 1
	case m == modeRun && c.PerKey:
		evWant, dlWant = perKeyBatch, perKeyBatch
		if held {
			evWant = 0
		}
	case m == modeRun:
		evWant = w.free(c)
		dlWant = evWant
	}
	if deliveries != nil {
		deliveries.SetWant(dlWant)
	}
	for _, s := range events {
		s.SetWant(evWant)
	}
}

// free is the endpoint's concurrency this replica does not use now.
func (w *Worker) free(c *endpoint.Config) int {
	return max(0, max(c.MaxInFlight, 1)-int(w.inProcess.Load()))
}

// arm wakes the worker after d, when d is shorter than a minute (longer waits are ended by a
// change of configuration or state, which wakes the worker).
func (w *Worker) arm(d time.Duration) {
	if d <= 0 || d >= time.Minute {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.activate)
	} else {
		w.timer.Reset(d)
	}
}

// applyLimits sets concurrency and rate for the current configuration and ramp-up.
func (w *Worker) applyLimits(c *endpoint.Config, st state.State) {
	f := state.RampFactor(&st, c.Policy, time.Now())
	// While limited, mode() keeps calling here, so the full limits come back when the ramp ends.
	w.ramped.Store(f < 1)
	conc := max(1, int(math.Ceil(float64(c.MaxInFlight)*f)))
	w.slots.setLimit(conc)
	w.Metrics.ConcLimit(float64(conc))
	limit, burst := rate.Inf, 1
	if c.RateLimit > 0 {
		// Rate-limited endpoints are delivered by one replica at a time (the holder of the
		// endpoint's partition), so its token bucket is the endpoint's.
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
		w.Metrics.RateLimit(math.Inf(1))
	} else {
		w.Metrics.RateLimit(float64(limit))
	}
}

// take holds a pulled message in memory (within the byte budget, waiting for room) and starts
// its delivery, or queues it behind its key.
func (w *Worker) take(ctx context.Context, msg jetstream.Msg) {
	size := msgSize(msg)
	if !w.env.Budget.Acquire(ctx, size) {
		_ = msg.Nak()
		return
	}
	w.inProcess.Add(1)
	if w.cfg.Load().PerKey {
		w.enqueueKeyed(ctx, msg, size)
		return
	}
	// The consumers' MaxAckPending and what refill requests bound how many are out at once.
	w.inflight.Add(1)
	w.env.Runners.Go(func() {
		defer w.inflight.Done()
		defer w.settled(size)
		w.runMsg(ctx, msg)
	})
}

// settled gives back what a finished message held, and requests more.
func (w *Worker) settled(size int64) {
	w.env.Budget.Release(size)
	w.inProcess.Add(-1)
	if c := w.cfg.Load(); c != nil && !c.PerKey {
		m, _ := w.mode(w.ctx)
		w.refill(c, m, w.holding(c, m))
	}
}

// dirty says the endpoint's counts or pending changed: the first time since the status
// writer cleared Dirty, the writer is told.
func (w *Worker) dirty() {
	if !w.Dirty.Swap(true) && w.env.Dirtied != nil {
		w.env.Dirtied(w.name)
	}
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

// afterDeletion reports whether an event was stored after its endpoint was deleted (the
// deletion timestamp has whole seconds: the second it names counts as before).
func afterDeletion(c *endpoint.Config, msg *pulled) bool {
	md, err := msg.Metadata()
	return err == nil && md.Timestamp.After(c.DeletedAt.Add(time.Second))
}
