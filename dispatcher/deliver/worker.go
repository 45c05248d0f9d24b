// Package deliver delivers each endpoint's deliveries. A Worker per endpoint takes messages
// from two kinds of durable consumers, through the dispatcher's pull.Puller: its consumer on the
// events stream (every event its patterns match, delivered straight from there) and its
// consumer on the deliveries stream (retries, replays, test deliveries, and events it held
// there). What becomes of each message is decided by functions that return a verdict
// (dispatcher/decide: Route, Admit, Check, Failed, LoggedAgain, Paused) and carried out in one place,
// dispatcher/settle, the only caller of Ack and Nak on a delivery: acknowledged after its
// delivery-log record is stored, handed back, retried (in place or as a message schedule),
// held, or dead-lettered. Between the decisions, an attempt waits at the gate (suspend,
// lease, circuit, half-open probe; limits.go: rate and concurrency), PerKey endpoints keep
// per-key queues (keys.go), and one HTTP attempt is sent at a time (dispatcher/attempt). An endpoint
// that cannot deliver now (suspended, circuit open) or lags behind what the events stream's
// limits keep holds its events: it copies them into the deliveries stream (hold.go), where
// nothing ages out. A byte budget shared by every worker bounds what is held in memory.
//
// A worker holds the seams it uses, each an interface declared here by its use (Health,
// Lease, Memory, Sources) or the package that ends its deliveries (dispatcher/settle); the
// Factory hands them to each worker it makes.
//
// A worker has a goroutine only while it has something to do: an idle endpoint is a pull
// request waiting at the server and a few structures here.
package deliver

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/dispatcher/intake"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
	"github.com/webhook-operator/webhook-operator/dispatcher/settle"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/pull"
	"github.com/webhook-operator/webhook-operator/internal/receiverauth"
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

// Lease says what this replica may do for an endpoint: whether it holds the lease of the
// endpoint's partition (only the holder delivers a single-active, PerKey or rate-limited,
// endpoint), and its part of a limit shared by all replicas (an endpoint's maxInFlight).
type Lease interface {
	Holds(ep string) bool
	// Share is the part of limit this replica may use for endpoint ep now; the parts of all
	// replicas add up to at most limit (leases.ShareOf).
	Share(ep string, limit int) int
}

// Memory is the byte budget every worker's messages in memory share.
type Memory interface {
	// Acquire waits until n bytes fit; false when ctx ended first.
	Acquire(ctx context.Context, n int64) bool
	// Force takes n bytes that arrived already (the shared lane's, bounded by its windows).
	Force(n int64)
	Release(n int64)
}

// Sources registers a worker's durable consumers (the Puller).
type Sources interface {
	Source(stream, consumer string, h pull.Handler) *pull.Source
}

// Watchers are told what the status needs to know: an endpoint whose counts or pending start
// to change (Dirtied), an event its filter rejected (Filtered).
type Watchers struct {
	Dirtied  func(ep string)
	Filtered func(ep string)
}

// Settings are the installation's fixed choices every worker reads.
type Settings struct {
	// Streams is the installation's layout (source namespaces' streams); Names the
	// dispatcher's own namespace's.
	Streams  streams.Config
	Names    streams.NamespaceNames
	Identity string
	// AllowSources says whether endpoints may read other namespaces' events.
	AllowSources bool
	Guard        netguard.Policy
	// MaxEventBytes is the largest event delivered.
	MaxEventBytes int
	// InPlaceRetryMax: retries due sooner are waited out by the worker; later ones become
	// JetStream message schedules.
	InPlaceRetryMax time.Duration
}

// Factory makes a dispatcher's workers, giving each part of a worker the seams it uses: the
// intake its sources, lease, health and memory; the finish its settler; the attempt its
// deadline (hard: it ends a grace period after a stop was asked, aborting requests in
// flight) and tracer.
type Factory struct {
	Settings Settings
	// JS is the dispatcher's JetStream context; Settle ends its deliveries.
	JS       jetstream.JetStream
	Settle   *settle.Settler
	Health   Health
	Lease    Lease
	Memory   Memory
	Sources  Sources
	Windows  *Windows
	Runners  *Runners
	Watchers Watchers
	Hard     context.Context
	// Tracer makes each attempt a span; nil traces nothing.
	Tracer *tracing.Tracer
	Log    logr.Logger
	// Intake is the shared lane (a shared dispatcher's; nil for a dedicated one).
	Intake *intake.Intake

	// parks are the deliveries stream's handles every endpoint's parkReader reads with.
	parksOnce sync.Once
	parks     *parkStream
}

// parkStream is the workers' shared handle on the deliveries stream's parks.
func (f *Factory) parkStream() *parkStream {
	f.parksOnce.Do(func() { f.parks = &parkStream{js: f.JS, name: f.Settings.Names.DeliveriesStream()} })
	return f.parks
}

// perKeyBatch is how many messages a PerKey endpoint keeps requested per consumer: later
// deliveries of busy keys wait in memory, in order, while other keys flow.
const perKeyBatch = 512

// Worker delivers one endpoint. Its inbox (this file) takes what its consumers bring and
// routes it; its limits (limits.go) pace attempts; PerKey endpoints queue behind keys
// (keys.go); an attempt (attempt.go) ends in a verdict (dispatcher/decide) that finish (finish.go)
// hands to dispatcher/settle.
type Worker struct {
	name string
	// f made it: its settings and seams (each declared above by what the worker uses of it)
	// are every worker's, held once for thousands of idle endpoints.
	f *Factory

	cfg atomic.Pointer[endpoint.Config]
	// client is the endpoint's HTTP client, made by its first attempt (httpClient).
	client atomic.Pointer[madeClient]
	// auth is the token source of spec.auth (auth.go); nil without it.
	auth atomic.Pointer[receiverauth.Source]
	// reconfigured is closed, and dropped, when a configuration is installed: a wait that a
	// change ends (holdFor: a deleted endpoint's retries waiting here) watches it, made by the
	// first such wait (changes).
	reconfigured atomic.Pointer[chan struct{}]
	// logSubject is the endpoint's subject in the delivery log; logged indexes it for
	// redelivered messages (made at the first one: decidedIndex). The namespace's deliveries
	// stream, the one stream whose messages carry delivery metadata, is f.parks.name.
	logSubject string
	logged     atomic.Pointer[decided]
	// busy are the deliveries being attempted or logged.
	busy busy
	// exact says the consumers' filters are the endpoint's patterns; otherwise (patterns that
	// overlap in a way JetStream filters cannot express) events are matched here too.
	exact atomic.Bool

	// limits and park are held in place: an idle endpoint's worker is one allocation and its
	// name's strings.
	limits limits
	keys   keyQueues

	// Metrics are the endpoint's metric handles.
	Metrics *metrics.Endpoint
	// Dirty says deliveries happened since the status was last written.
	Dirty atomic.Bool

	inflight sync.WaitGroup
	// inProcess counts messages taken and not yet settled (queued behind a key included).
	inProcess atomic.Int64
	// refreshed is when the endpoint's state was last read from the bucket (unix
	// nanoseconds; see mode).
	refreshed atomic.Int64
	// lagging says the last event taken was among those the events stream's limits drop
	// next: events are held in the deliveries stream until the endpoint catches up.
	lagging atomic.Bool

	// The shared lane (dispatcher/intake, f.Intake): the views it handed this worker and that
	// are not settled yet, how many it may hand now (set by every pass), the endpoint's park
	// and (once it is deleted) its scheduled retries, both read back by its partition's holder.
	sharedOut atomic.Int64
	shareCap  atomic.Int64
	park      parkReader
	// sched is made when first used (scheduledRetries): only a deleted endpoint reads them.
	sched atomic.Pointer[parkReader]

	in inbox
}

// inbox is a worker's lifecycle and what its consumers bring: the messages pulled and not yet
// looked at, the pass that runs (one at a time, again when kicked), and its consumers.
type inbox struct {
	mu      sync.Mutex
	ctx     context.Context
	cancel  context.CancelFunc
	queue   []*pulled
	running bool
	kick    bool
	stopped bool
	// finished says the worker stopped and its last pass ended; done, made by the first Wait
	// before that, is closed then.
	finished bool
	done     chan struct{}
	timer    *time.Timer
	// events are the endpoint's consumers on events streams (its namespace's first, then its
	// source namespaces'); deliveries its consumer on the deliveries stream.
	events     []*pull.Source
	eventsFrom []string
	deliveries *pull.Source
	// held says events were held since the deliveries stream was last found drained: a PerKey
	// endpoint takes no event until every held one has come back from there (drained).
	held bool
}

// NewWorker returns the worker of endpoint name; Configure it, then Start it. A dispatcher
// keeps one for each endpoint, most of them idle: what only some endpoints or some moments
// need (the delivery log's index, the per-key queues, a rate limiter, the reader of a deleted
// endpoint's scheduled retries) is made when first needed.
func (f *Factory) NewWorker(name string, m *metrics.Endpoint) *Worker {
	names := f.Settings.Names
	f.parkStream()
	w := &Worker{
		name: name, f: f,
		logSubject: names.AttemptSubject(name),
		Metrics:    m,
	}
	w.limits.init()
	w.park.init(w, names.ParkSubject(name), true)
	return w
}

// changes is closed when the next configuration is installed.
func (w *Worker) changes() <-chan struct{} {
	for {
		if ch := w.reconfigured.Load(); ch != nil {
			return *ch
		}
		ch := make(chan struct{})
		if w.reconfigured.CompareAndSwap(nil, &ch) {
			return ch
		}
	}
}

// decidedIndex is the index of the endpoint's delivery log, made for the first redelivered
// message.
func (w *Worker) decidedIndex() *decided {
	if d := w.logged.Load(); d != nil {
		return d
	}
	w.logged.CompareAndSwap(nil, &decided{js: w.f.JS, stream: w.f.Settings.Names.AttemptsStream(), subject: w.logSubject})
	return w.logged.Load()
}

// scheduledRetries is the reader of the endpoint's scheduled retries (a deleted endpoint's
// holder dead-letters them), made when first used.
func (w *Worker) scheduledRetries() *parkReader {
	if r := w.sched.Load(); r != nil {
		return r
	}
	w.sched.CompareAndSwap(nil, newParkReader(w, w.f.Settings.Names.ScheduleFilter(w.name), false))
	return w.sched.Load()
}

// Name is the endpoint's name.
func (w *Worker) Name() string { return w.name }

// Config is the endpoint's current configuration.
func (w *Worker) Config() *endpoint.Config { return w.cfg.Load() }

// Configure installs a new configuration.
func (w *Worker) Configure(c *endpoint.Config) {
	if old := w.cfg.Swap(c); old != nil && (old.Lane != c.Lane || !slices.Equal(old.Draining, c.Draining)) {
		// Its pending count reads other sources now (its own consumers drained and deleted,
		// or a lane changed): the status says it again, though no delivery happened.
		w.dirty()
	}
	if ch := w.reconfigured.Swap(nil); ch != nil {
		close(*ch)
	}
	if h := w.client.Load(); h != nil && !h.fits(c) && w.client.CompareAndSwap(h, nil) {
		// The next attempt makes a client for c. Idle connections of the old transport are
		// closed once in-flight requests end.
		time.AfterFunc(c.Timeout+time.Second, h.c.CloseIdleConnections)
	}
	w.configureAuth(c)
	_, exact := w.f.Settings.Streams.For(w.f.Settings.Names.Namespace()).EventFilters(c.EventTypes)
	w.exact.Store(exact)
	w.applyLimits(c, w.f.Health.Snapshot(w.name))
	if c.Lane == streams.LaneShared && !c.Suspend && w.shareCap.Load() == 0 {
		// Until its first pass says otherwise, it takes what its limits allow: the intake
		// starts before every worker had a pass, and parking what a running endpoint would
		// take at once costs two writes each.
		w.shareCap.Store(2*int64(w.limits.slots.size()) + shareSlack)
	}
	w.in.mu.Lock()
	started := w.in.ctx != nil && !w.in.stopped
	w.in.mu.Unlock()
	if started {
		w.syncSources(c)
	}
	w.Wake()
}

// Wake makes the worker look at its configuration and state again.
func (w *Worker) Wake() { w.activate() }

// Start registers the worker's consumers with the puller and starts delivering.
func (w *Worker) Start(ctx context.Context) {
	w.in.mu.Lock()
	w.in.ctx, w.in.cancel = context.WithCancel(ctx)
	w.in.mu.Unlock()
	if c := w.cfg.Load(); c != nil {
		w.syncSources(c)
	}
	w.activate()
}

// syncSources makes the worker's consumers its own on the deliveries stream and on the events
// streams of its namespace and, where the installation allows it, of its source namespaces. A
// shared-lane endpoint has none of its own: only those an earlier version made, while they
// still exist (it drains them).
func (w *Worker) syncSources(c *endpoint.Config) {
	own := w.f.Settings.Names.Namespace()
	want := []string{own}
	if w.f.Settings.AllowSources {
		want = streams.SourceNamespaces(own, c.Sources)
	}
	consumer := streams.EndpointConsumerOf(own, w.name)
	shared := c.Lane == streams.LaneShared
	if shared {
		want = slices.DeleteFunc(want, func(ns string) bool { return !draining(c, w.f.Settings.Streams.For(ns).EventsStream(), consumer) })
	}
	ownDeliveries := !shared || draining(c, w.f.parks.name, w.f.Settings.Names.EndpointConsumer(w.name))
	w.in.mu.Lock()
	defer w.in.mu.Unlock()
	if w.in.stopped {
		return
	}
	switch {
	case ownDeliveries && w.in.deliveries == nil:
		w.in.deliveries = w.f.Sources.Source(w.f.parks.name, w.f.Settings.Names.EndpointConsumer(w.name), w)
	case !ownDeliveries && w.in.deliveries != nil:
		w.in.deliveries.Close()
		w.in.deliveries = nil
	}
	if slices.Equal(want, w.in.eventsFrom) {
		return
	}
	keep := map[string]*pull.Source{}
	for i, ns := range w.in.eventsFrom {
		keep[ns] = w.in.events[i]
	}
	var srcs []*pull.Source
	for _, ns := range want {
		s := keep[ns]
		if s == nil {
			s = w.f.Sources.Source(w.f.Settings.Streams.For(ns).EventsStream(), consumer, w)
		}
		delete(keep, ns)
		srcs = append(srcs, s)
	}
	for _, s := range keep {
		s.Close()
	}
	w.in.events, w.in.eventsFrom = srcs, want
}

// Stop stops taking messages: nothing more is requested, what is queued or arrives is handed
// back. Wait waits for the worker and its in-flight deliveries.
func (w *Worker) Stop() {
	w.in.mu.Lock()
	if w.in.stopped {
		w.in.mu.Unlock()
		return
	}
	w.in.stopped = true
	if w.in.cancel != nil {
		w.in.cancel()
	}
	srcs := append(slices.Clone(w.in.events), w.in.deliveries)
	if w.in.timer != nil {
		w.in.timer.Stop()
	}
	started := w.in.ctx != nil
	w.in.mu.Unlock()
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
	w.in.mu.Lock()
	if !w.in.finished {
		if w.in.done == nil {
			w.in.done = make(chan struct{})
		}
		done := w.in.done
		w.in.mu.Unlock()
		<-done
	} else {
		w.in.mu.Unlock()
	}
	w.inflight.Wait()
}

// Pulled takes a message from one of the worker's consumers (pull.Handler).
func (w *Worker) Pulled(pm *pull.Msg) { w.receive(received(pm)) }

// receive queues a message for the worker: its own consumers', a view of the shared lane's, or
// one read from its park.
func (w *Worker) receive(m *pulled) {
	w.in.mu.Lock()
	w.in.queue = append(w.in.queue, m)
	w.in.mu.Unlock()
	w.activate()
}

// SourceChanged is called when a consumer went missing or came back (pull.Handler).
func (w *Worker) SourceChanged() { w.activate() }

// activate runs a pass of the worker, on a runner, unless one runs: it will run again.
func (w *Worker) activate() {
	w.in.mu.Lock()
	if w.in.running {
		w.in.kick = true
		w.in.mu.Unlock()
		return
	}
	if w.in.ctx == nil {
		w.in.mu.Unlock()
		return
	}
	w.in.running = true
	w.in.mu.Unlock()
	w.f.Runners.Go(w.drive)
}

// drive runs passes until nothing more happened meanwhile.
func (w *Worker) drive() {
	for {
		w.pass()
		w.in.mu.Lock()
		if w.in.kick || len(w.in.queue) > 0 {
			w.in.kick = false
			w.in.mu.Unlock()
			continue
		}
		w.in.running = false
		stopped := w.in.stopped
		w.in.mu.Unlock()
		if stopped {
			w.closeDone()
		}
		return
	}
}

func (w *Worker) closeDone() {
	w.in.mu.Lock()
	defer w.in.mu.Unlock()
	if w.in.finished {
		return
	}
	w.in.finished = true
	if w.in.done != nil {
		close(w.in.done)
	}
}

// share is how many requests to the endpoint this replica may have in flight now, its
// maxInFlight across all replicas being the sum of the replicas' shares: all of it while it
// holds a single-active endpoint's partition and none while another replica does; for any
// other endpoint its part of maxInFlight (leases.ShareOf: the parts of the partitions it
// holds). Every consumer of the endpoint (its events consumers, its deliveries consumer) takes
// its requests from one semaphore of this size (limits.slots).
func (w *Worker) share(c *endpoint.Config) int {
	limit := max(c.MaxInFlight, 1)
	if c.SingleActive() {
		if w.f.Lease.Holds(w.name) {
			return limit
		}
		return 0
	}
	return w.f.Lease.Share(w.name, limit)
}

// leaseMoved says this replica may deliver nothing of the endpoint now: another replica holds
// the lease of a single-active endpoint, or every part of the endpoint's maxInFlight.
func (w *Worker) leaseMoved(c *endpoint.Config) bool {
	return c != nil && w.share(c) == 0
}

// Overcommitted reports whether the endpoint has more requests in flight here than this
// replica's share allows now (a partition was let go of): the partition's lease is kept until
// it has not, so its next holder never adds its part while this one's requests still run
// (leases.Partitions.Run's busy).
func (w *Worker) Overcommitted() bool {
	c := w.cfg.Load()
	return c != nil && w.limits.slots.inUse() > w.share(c)
}

// look computes what a pass knows of the worker, once, and when to look again; it brings the
// concurrency limit to this replica's share when that changed.
func (w *Worker) look(ctx context.Context) (decide.View, time.Duration) {
	c := w.cfg.Load()
	if c != nil {
		if s := w.share(c); s != w.limits.appliedShare() {
			w.limits.apply(c, s, w.f.Health.Snapshot(w.name), w.Metrics)
		}
	}
	m, recheck := w.mode(ctx)
	v := decide.View{Config: c, Mode: m, LeaseMoved: w.leaseMoved(c)}
	v.Hold = w.holding(v)
	w.in.mu.Lock()
	v.HeldBefore = w.in.held
	w.in.mu.Unlock()
	return v, recheck
}

// pass looks at the worker's mode, decides what to request from each consumer, and takes,
// holds or hands back what was pulled.
func (w *Worker) pass() {
	w.in.mu.Lock()
	ctx, queue := w.in.ctx, w.in.queue
	w.in.queue = nil
	w.in.mu.Unlock()
	if ctx.Err() != nil {
		releaseAll(queue)
		return
	}
	v, recheck := w.look(ctx)
	w.refill(v)
	for _, msg := range queue {
		w.handle(ctx, &v, msg)
	}
	if v.Config != nil && v.Config.Lane == streams.LaneShared {
		w.shareLane(ctx, v)
	}
	if w.drainCheck(ctx, v) {
		recheck = min(recheck, 200*time.Millisecond)
	}
	if v.Hold && w.f.Settle.HoldFull() {
		recheck = min(recheck, settle.RoomRetry)
	}
	w.arm(recheck)
}

// handle takes, holds or hands back one pulled message, as route decides.
func (w *Worker) handle(ctx context.Context, v *decide.View, msg *pulled) {
	fromEvents := msg.src != w.in.deliveries
	if msg.src == nil {
		// A view of the shared lane, or a parked delivery.
		md, _ := msg.Metadata()
		fromEvents = md != nil && md.Stream != w.f.parks.name
	} else if fromEvents && v.Config != nil && v.Config.Lane == streams.LaneShared {
		// An event of its own consumer that a shared-lane endpoint drains: what was stored
		// since it joined the shared lane is the shared lane's.
		switch md, err := msg.Metadata(); {
		case err == nil && v.Config.SharedSince.IsZero():
			w.finish(ctx, msg, decide.Release(time.Second))
			return
		case err == nil && !md.Timestamp.Before(v.Config.SharedSince):
			w.finish(ctx, msg, decide.Ack())
			return
		}
	}
	step, delay := decide.Route(*v, fromEvents, !fromEvents && strings.HasPrefix(msg.Subject(), w.f.Settings.Names.RetrySubject(w.name, "")))
	if step == decide.StepAdmit {
		if !w.admitEvent(ctx, v.Config, msg) {
			return
		}
		md, _ := msg.Metadata()
		endangered := !v.Config.Deleting && md != nil && w.f.Windows.Endangered(md.Stream, md.Sequence.Stream, md.Timestamp)
		step, delay = decide.RouteAdmitted(*v, true, md != nil && afterDeletion(v.Config, md), endangered)
		if endangered && step == decide.StepHold {
			w.lagging.Store(true)
			w.Wake()
		} else if step == decide.StepTake && !v.Config.Deleting {
			w.lagging.Store(false)
			w.Metrics.Routed()
		}
	}
	switch step {
	case decide.StepRelease:
		w.finish(ctx, msg, decide.Release(delay))
	case decide.StepAck:
		w.finish(ctx, msg, decide.Ack())
	case decide.StepHold:
		w.hold(ctx, v.Config, msg)
		// A PerKey endpoint takes no later event of this pass before the held one is back.
		v.HeldBefore = v.HeldBefore || v.Config.PerKey
	case decide.StepTake:
		w.take(ctx, msg)
	}
}

// admitEvent decides whether an event is the endpoint's (admit); one that is not is finished
// (acknowledged, or dead-lettered when its filter cannot decide), and false returned.
func (w *Worker) admitEvent(ctx context.Context, c *endpoint.Config, msg *pulled) bool {
	if msg.view == nil {
		// First of all, the operator's headers (Whk-*) its producer set are deleted: whatever
		// follows (holding it, delivering it, dead-lettering it) never takes a producer's
		// header for the operator's. (The intake did it for the shared lane's views, which
		// share one message: they only read it.)
		_, typ := streams.SplitEventSubject(msg.Subject(), w.f.Settings.Streams.EventsSubjectPrefix)
		records.StripOperatorHeaders(msg.Headers(), typ)
	}
	md, _ := msg.Metadata()
	v, ok, filtered := decide.Admit(ctx, c, decide.Admission{Subject: msg.Subject(), Prefix: w.f.Settings.Streams.EventsSubjectPrefix,
		Headers: msg.Headers(), Data: msg.Data(), MD: md, Own: w.f.Settings.Names.Namespace(), Name: w.name, Exact: w.exact.Load(),
		MaxEventBytes: w.f.Settings.MaxEventBytes})
	if filtered {
		w.Metrics.Filtered()
		if w.f.Watchers.Filtered != nil {
			w.f.Watchers.Filtered(w.name)
		}
	}
	if !ok {
		w.finishAside(ctx, msg, v)
	}
	return ok
}

// parkView parks a view of the shared lane the intake could not hand the worker, or that the
// worker handed back: an event is admitted first, as any event the worker takes is.
func (w *Worker) parkView(ctx context.Context, c *endpoint.Config, v *pulled) {
	if md, err := v.Metadata(); err == nil && md.Stream != w.f.parks.name && !w.admitEvent(ctx, c, v) {
		return
	}
	w.hold(ctx, c, v)
	w.park.noteParked()
}

// finishAside carries out a verdict that writes (a dead letter) on a runner, so the pass goes
// on meanwhile; others at once.
func (w *Worker) finishAside(ctx context.Context, msg jetstream.Msg, v decide.Verdict) {
	if v.Act != decide.ActDeadLetter {
		w.finish(ctx, msg, v)
		return
	}
	w.inflight.Add(1)
	w.f.Runners.Go(func() {
		defer w.inflight.Done()
		w.finish(ctx, msg, v)
	})
}

// afterDeletion reports whether an event was stored after its endpoint was deleted (the
// deletion timestamp has whole seconds: the second it names counts as before).
func afterDeletion(c *endpoint.Config, md *jetstream.MsgMetadata) bool {
	return c.Deleting && md.Timestamp.After(c.DeletedAt.Add(time.Second))
}

// refill sets how many messages each consumer should have requested: the endpoint's free
// concurrency while it runs (PerKey: a window of later deliveries), one while it probes, a
// window of events to hold while it holds, nothing while it is paused.
func (w *Worker) refill(v decide.View) {
	w.in.mu.Lock()
	events, deliveries, held := w.in.events, w.in.deliveries, w.in.held
	w.in.mu.Unlock()
	c, m := v.Config, v.Mode
	evWant, dlWant := 0, 0
	switch {
	case c == nil:
	case c.Deleting:
		// Any replica dead-letters what is left, as fast as its concurrency allows.
		evWant = w.free(c)
		dlWant = evWant
	case v.LeaseMoved:
	case v.Hold:
		evWant = perKeyBatch
		if w.f.Settle.HoldFull() {
			// No room to hold more: the events wait in the events stream.
			evWant = 0
		}
		if m == decide.ModeRun && !c.PerKey {
			dlWant = w.free(c)
		} else if m == decide.ModeRun {
			dlWant = perKeyBatch
		}
	case m == decide.ModeProbe:
		evWant, dlWant = 1, 1
	case m == decide.ModeRun && c.PerKey:
		evWant, dlWant = perKeyBatch, perKeyBatch
		if held {
			evWant = 0
		}
	case m == decide.ModeRun:
		evWant = w.free(c)
		dlWant = evWant
	}
	if c != nil && !c.Deleting && c.Lane == streams.LaneShared && c.SharedSince.IsZero() {
		// Not on the shared lane yet: a dispatcher of an earlier version still runs and
		// delivers its consumers' events, until status.sharedSince says where the lanes part.
		evWant = 0
	}
	if deliveries != nil {
		deliveries.SetWant(dlWant)
	}
	for _, s := range events {
		s.SetWant(evWant)
	}
}

// free is the endpoint's concurrency this replica does not use now: of its share, or (a
// deleting endpoint, dead-lettered without requests) of all its maxInFlight.
func (w *Worker) free(c *endpoint.Config) int {
	limit := max(c.MaxInFlight, 1)
	if !c.Deleting {
		limit = w.share(c)
	}
	return max(0, limit-int(w.inProcess.Load()))
}

// arm wakes the worker after d, when d is shorter than a minute (longer waits are ended by a
// change of configuration or state, which wakes the worker).
func (w *Worker) arm(d time.Duration) {
	if d <= 0 || d >= time.Minute {
		return
	}
	w.in.mu.Lock()
	defer w.in.mu.Unlock()
	if w.in.stopped {
		return
	}
	if w.in.timer == nil {
		w.in.timer = time.AfterFunc(d, w.activate)
	} else {
		w.in.timer.Reset(d)
	}
}

// take holds a pulled message in memory (within the byte budget, waiting for room) and starts
// its delivery, or queues it behind its key.
func (w *Worker) take(ctx context.Context, msg jetstream.Msg) {
	size := msgSize(msg)
	if !w.f.Memory.Acquire(ctx, size) {
		w.finish(ctx, msg, decide.Release(0))
		return
	}
	w.inProcess.Add(1)
	if c := w.cfg.Load(); c.PerKey && !c.Deleting {
		w.enqueueKeyed(ctx, msg, size)
		return
	}
	// The consumers' MaxAckPending and what refill requests bound how many are out at once.
	w.inflight.Add(1)
	w.f.Runners.Go(func() {
		defer w.inflight.Done()
		defer w.settled(size)
		w.runMsg(ctx, msg)
	})
}

// settled is the one way out of a message take started, whichever path it took (delivered at
// once, queued behind its key, without a key): it gives back what the message held (its bytes,
// its place in inProcess) and requests more where what is requested depends on it (free: a
// best-effort endpoint, or any endpoint being deleted).
func (w *Worker) settled(size int64) {
	w.f.Memory.Release(size)
	w.inProcess.Add(-1)
	if c := w.cfg.Load(); c != nil && (!c.PerKey || c.Deleting) {
		v, _ := w.look(w.in.ctx)
		w.refill(v)
	}
}

// dirty says the endpoint's counts or pending changed: the first time since the status
// writer cleared Dirty, the writer is told.
func (w *Worker) dirty() {
	if !w.Dirty.Swap(true) && w.f.Watchers.Dirtied != nil {
		w.f.Watchers.Dirtied(w.name)
	}
}

// msgSize is what a message holds in memory, roughly: payload and headers. A view of the
// shared lane holds nothing of its own (the intake counts the message once).
func msgSize(msg jetstream.Msg) int64 {
	if p, ok := msg.(*pulled); ok && p.view != nil {
		return 0
	}
	n := len(msg.Data())
	for k, vs := range msg.Headers() {
		for _, v := range vs {
			n += len(k) + len(v)
		}
	}
	return int64(n)
}

// draining reports whether a shared-lane endpoint still reads its own consumer on stream.
func draining(c *endpoint.Config, stream, consumer string) bool {
	return slices.Contains(c.Draining, stream+"/"+consumer)
}

// takesShared reports whether the worker takes one more view of the shared lane now, and
// counts it; false: the intake parks it.
func (w *Worker) takesShared() bool {
	limit := w.shareCap.Load()
	for {
		n := w.sharedOut.Load()
		if n >= limit {
			return false
		}
		if w.sharedOut.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// deletingRecheck is how often a deleted endpoint's holder reads its scheduled retries and its
// park again while they seem empty (parkReader.recheck), until the endpoint is gone.
const deletingRecheck = 2 * time.Second

// shareSlack is how many views a running shared-lane worker takes beyond its concurrency
// (queued while attempts are in flight) before the intake parks the next.
const shareSlack = 16

// shareLane sets how many views the intake may hand the worker now, and reads its park (and,
// once deleted, its scheduled retries) back when it has room: only the holder of its
// partition reads them.
func (w *Worker) shareLane(ctx context.Context, v decide.View) {
	c := v.Config
	conc := int64(w.limits.slots.size())
	var limit int64
	switch {
	case c.Deleting:
		limit = 1024
	case w.holdsBack(v) || v.Mode == decide.ModePaused:
		limit = 0
	case v.Mode == decide.ModeProbe:
		limit = 1
	case w.share(c) == 0:
		limit = 0 // other replicas hold every part of its maxInFlight (or its partition)
	default:
		limit = 2*conc + shareSlack
	}
	if int64(w.share(c)) != w.limits.share.Load() {
		w.applyLimits(c, w.f.Health.Snapshot(w.name))
	}
	w.shareCap.Store(limit)
	if limit > 0 && w.f.Intake != nil {
		w.f.Intake.Feed((*taking)(w)) // what waits for room, now that there may be more
	}
	if !w.f.Lease.Holds(w.name) {
		return
	}
	switch {
	case c.Deleting:
		// Its scheduled retries come to it, to be dead-lettered, and its park to its queue;
		// both are read again every deletingRecheck while they seem empty.
		sched := w.scheduledRetries()
		for _, r := range []*parkReader{sched, &w.park} {
			if d := r.recheck(deletingRecheck); d > 0 {
				w.arm(d)
			}
		}
		sched.read(ctx, perKeyBatch, false)
		w.park.read(ctx, perKeyBatch, false)
	case v.Mode == decide.ModeProbe && w.sharedOut.Load()+w.inProcess.Load() == 0:
		// The half-open probe (the holder's, see mode): one parked delivery, taken here.
		w.park.read(ctx, 1, true)
	case v.Mode == decide.ModeRun && !w.holdsBack(v) && w.park.waiting():
		// Lagging behind on the events stream parks the events taken, and still reads the park.
		// What every replica takes at once, about: the endpoint's maxInFlight twice over and
		// each replica's slack.
		w.park.read(ctx, 2*max(c.MaxInFlight, 1)+4*shareSlack, false)
	}
}

// applyLimits sets the worker's concurrency and rate for c and the ramp-up state st: this
// replica's share of the endpoint's maxInFlight (Worker.share).
func (w *Worker) applyLimits(c *endpoint.Config, st state.State) {
	w.limits.apply(c, w.share(c), st, w.Metrics)
}
