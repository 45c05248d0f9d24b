// Package intake is a shared dispatcher's shared lane (streams.LaneShared): it pulls the
// namespace's intake consumers (one per events stream its endpoints read: its own
// namespace's and the source namespaces') and its queue consumer (the due deliveries of its
// shared-lane endpoints), and hands each message to the workers (Takers) it is for, as one
// View per worker. A message is acknowledged once every view of it is settled.
//
// A worker takes a view only while it has room for it (Taker.Reserve: its share of the
// endpoint's concurrency, a little more queued); otherwise the view waits a moment for room
// (give: shareWait at most), and is then parked: copied onto the endpoint's park subject,
// which no consumer reads, and settled (Taker.Park). A worker that takes nothing now (paused)
// has its views parked at once. A view the worker hands back (its endpoint paused meanwhile,
// a retry it will not wait out) is parked the same way. So whatever an endpoint cannot
// deliver soon costs it storage, never a slot of the shared consumers, and a dead or slow
// endpoint backs up only itself. The holder of the endpoint's partition reads its park back
// (dispatcher/deliver's parkReader) once it delivers again.
//
// Every replica of the dispatcher runs an intake on the same consumers: each message goes to
// one of them.
package intake

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/match"
	"github.com/webhook-operator/webhook-operator/internal/pull"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Intake is the shared lane of one dispatcher (see the package).
type Intake struct {
	set    Settings
	puller *pull.Puller
	js     jetstream.JetStream
	memory Memory
	run    func(func())
	log    logr.Logger

	routes atomic.Pointer[routes]
	// counts are the last reading of every endpoint's park and queue (watchParks).
	counts atomic.Pointer[laneCounts]
	// parkedHere says this replica parked something since the last reading.
	parkedHere atomic.Bool
	// counted says a reading was made: every endpoint routed then knows its park's count.
	counted atomic.Bool

	mu      sync.Mutex
	ctx     context.Context
	sources map[string]*pull.Source // events stream -> its intake consumer
	queue   *pull.Source
	// wantNS are the namespaces whose events the routes read (its own always).
	wantNS map[string]bool
	// open are the shared messages with views outstanding; openBy how many per source.
	open     map[*shared]struct{}
	openBy   map[*pull.Source]int
	avgSize  atomic.Int64
	stopping atomic.Bool
	parking  sync.WaitGroup

	// waiting are the views workers had no room for, waiting a moment (see give).
	waitMu  sync.Mutex
	waiting map[Taker]*waitingViews
	// waitingN is how many views wait, in all workers.
	waitingN atomic.Int64
	// began wakes watchWaiting when a view begins to wait: while none waits, nothing is swept.
	began chan struct{}

	// dispatchMu orders the dispatch of events (Pulled) with a change of routes: the events
	// dispatched before a new endpoint was routed are in recent, and caught up for it.
	dispatchMu sync.Mutex
	recent     recentEvents
}

// Intake windows: how many messages one replica keeps out of each intake consumer and of the
// queue consumer, at most (the byte budget may allow fewer).
const (
	intakeWindow = 2048
	queueWindow  = 1024
	// progressEvery is how often a message still being worked on is reported in progress.
	progressEvery = streams.SharedAckWait / 3
	// unknownTries is how many times a queued delivery for an endpoint this dispatcher does
	// not serve comes back before it is dropped (with a log line): the endpoint is gone.
	unknownTries = 10
)

// Settings are what the intake reads of the dispatcher's configuration.
type Settings struct {
	// Streams is the installation's stream layout, Names the dispatcher namespace's.
	Streams streams.Config
	Names   streams.NamespaceNames
	// AllowSources says whether endpoints may read other namespaces' events.
	AllowSources bool
}

// Memory is the byte budget the views' messages are held in (shared with the workers): the
// intake forces what arrived (its windows bound it) and releases it once settled. A budget
// that says its Limit and what it Holds lets the intake pull no more than half the limit.
type Memory interface {
	Force(n int64)
	Release(n int64)
}

// Parts are what the intake is made of: the dispatcher's settings, puller, JetStream context,
// byte budget and the runner of its short tasks (parking a view).
type Parts struct {
	Settings Settings
	Puller   *pull.Puller
	JS       jetstream.JetStream
	Memory   Memory
	Run      func(func())
	Log      logr.Logger
}

// New builds the shared lane of a dispatcher; Start it once the workers are known
// (SetRoutes).
func New(p Parts) *Intake {
	in := &Intake{set: p.Settings, puller: p.Puller, js: p.JS, memory: p.Memory, run: p.Run, log: p.Log.WithName("intake"),
		sources: map[string]*pull.Source{}, wantNS: map[string]bool{p.Settings.Names.Namespace(): true}, open: map[*shared]struct{}{}, openBy: map[*pull.Source]int{},
		began: make(chan struct{}, 1)}
	in.routes.Store(&routes{byName: map[string]Taker{}})
	in.counts.Store(&laneCounts{})
	in.avgSize.Store(1 << 10)
	return in
}

// routes are the shared-lane workers: by name, and by the namespace whose events they read
// and their event-type patterns.
type routes struct {
	byName map[string]Taker
	byNS   map[string]*match.Index[Taker]
}

// lookup returns the workers reading namespace ns whose patterns match typ.
func (r *routes) lookup(ns, typ string, dst []Taker) []Taker {
	ix := r.byNS[ns]
	if ix == nil {
		return dst
	}
	return ix.Lookup(typ, dst)
}

// SetRoutes installs the shared-lane workers (configured), and pulls the events streams
// they read. An endpoint new to the routes gets the events this replica dispatched before
// (since the endpoint was created) from the events streams again (catchUp): the informer may
// bring a new endpoint a moment after the events published right after it was created.
func (in *Intake) SetRoutes(ws []Taker) {
	own := in.set.Names.Namespace()
	r := &routes{byName: map[string]Taker{}, byNS: map[string]*match.Index[Taker]{}}
	want := map[string]bool{own: true}
	for _, w := range ws {
		c := w.Config()
		if c == nil || c.Lane != streams.LaneShared || c.SharedSince.IsZero() {
			continue
		}
		r.byName[w.Name()] = w
		nss := []string{own}
		if in.set.AllowSources {
			nss = streams.SourceNamespaces(own, c.Sources)
		}
		for _, ns := range nss {
			want[ns] = true
			ix := r.byNS[ns]
			if ix == nil {
				ix = match.NewIndex[Taker]()
				r.byNS[ns] = ix
			}
			for _, p := range c.EventTypes {
				ix.Add(p, w)
			}
		}
	}
	in.dispatchMu.Lock()
	old := in.routes.Swap(r)
	var missed []recentEvent
	var added []Taker
	for name, w := range r.byName {
		if old.byName[name] == w {
			continue
		}
		added = append(added, w)
	}
	if len(added) > 0 {
		missed = in.recent.since(oldestShared(added))
	}
	in.dispatchMu.Unlock()
	for _, w := range added {
		in.catchUp(w, r, missed)
	}
	in.mu.Lock()
	in.wantNS = want
	in.mu.Unlock()
	in.syncSources()
}

// oldestShared is when the first of ws joined the shared lane.
func oldestShared(ws []Taker) time.Time {
	var t time.Time
	for _, w := range ws {
		if c := w.Config(); c != nil && (t.IsZero() || c.SharedSince.Before(t)) {
			t = c.SharedSince
		}
	}
	return t
}

// catchUp hands worker w (new to routes r) the events among missed that are its: dispatched by
// this replica before w was routed, stored since its endpoint joined the shared lane, matching
// it. Each
// is read again from its stream and handed as a view of its own (acknowledging nothing: the
// event was settled already).
func (in *Intake) catchUp(w Taker, r *routes, missed []recentEvent) {
	c := w.Config()
	if c == nil || len(missed) == 0 || in.ctx == nil {
		return
	}
	var mine []recentEvent
	for _, e := range missed {
		if e.stored.Before(c.SharedSince) {
			continue
		}
		ns, typ := streams.SplitEventSubject(e.subject, in.set.Streams.EventsSubjectPrefix)
		if slices.Contains(r.lookup(ns, typ, nil), w) {
			mine = append(mine, e)
		}
	}
	if len(mine) == 0 {
		return
	}
	in.parking.Add(1)
	go func() {
		defer in.parking.Done()
		ctx, cancel := context.WithTimeout(in.ctx, time.Minute)
		defer cancel()
		readers := map[string]*streamread.Stream{}
		for _, e := range mine {
			st := readers[e.stream]
			if st == nil {
				var err error
				if st, err = streamread.Open(ctx, in.js.Conn(), in.js, e.stream); err != nil {
					in.log.Error(err, "catching up a new endpoint's events", "endpoint", w.Name())
					return
				}
				readers[e.stream] = st
			}
			msgs, err := st.Forward(ctx, e.subject, e.seq, 1)
			if err != nil || len(msgs) == 0 || msgs[0].Seq != e.seq {
				continue // gone from the stream meanwhile
			}
			m := msgs[0]
			msg := &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}
			_, typ := streams.SplitEventSubject(m.Subject, in.set.Streams.EventsSubjectPrefix)
			records.StripOperatorHeaders(msg.Header, typ)
			md := &jetstream.MsgMetadata{Stream: e.stream, Sequence: jetstream.SequencePair{Stream: e.seq}, NumDelivered: 1, Timestamp: m.Time}
			// It counts as redelivered: this replica may have taken it, with no route for the
			// endpoint yet, as a redelivery whose outcome an earlier holder logged (a crash
			// between the log write and the acknowledgement), so the worker reads the log first.
			sh := &shared{in: in, msg: msg, md: md, size: int64(len(m.Data)), at: time.Now(), catchUp: true, stamp: pull.Resent()}
			in.hand(sh, []Taker{w})
		}
		in.log.V(1).Info("caught up a new endpoint's events", "endpoint", w.Name(), "events", len(mine))
	}()
}

// recentEvents are the events this replica dispatched lately (at most recentMax, none older
// than recentFor), for catchUp. It holds nothing while the namespace is idle.
type recentEvents struct {
	q    []recentEvent
	head int
}

type recentEvent struct {
	stream, subject string
	seq             uint64
	stored, seen    time.Time
}

const (
	recentMax = 1 << 16
	recentFor = 5 * time.Minute
)

func (r *recentEvents) add(e recentEvent) {
	e.seen = time.Now()
	limit := e.seen.Add(-recentFor)
	for r.head < len(r.q) && (len(r.q)-r.head >= recentMax || r.q[r.head].seen.Before(limit)) {
		r.q[r.head] = recentEvent{}
		r.head++
	}
	if r.head > len(r.q)/2 {
		// Compact: what was dropped is given back.
		r.q = append(r.q[:0:0], r.q[r.head:]...)
		r.head = 0
	}
	r.q = append(r.q, e)
}

// since returns the events stored at or after t (and seen within recentFor).
func (r *recentEvents) since(t time.Time) []recentEvent {
	limit := time.Now().Add(-recentFor)
	var out []recentEvent
	for _, e := range r.q[r.head:] {
		if !e.stored.Before(t) && !e.seen.Before(limit) {
			out = append(out, e)
		}
	}
	return out
}

// Start pulls the intake and queue consumers until Stop.
func (in *Intake) Start(ctx context.Context) {
	in.mu.Lock()
	in.ctx = ctx
	in.queue = in.puller.Source(in.set.Names.DeliveriesStream(), in.set.Names.QueueConsumer(), in)
	in.mu.Unlock()
	in.syncSources()
	go in.keepAlive(ctx)
	go in.watchParks(ctx)
	go in.watchWaiting(ctx)
}

// syncSources pulls the intake consumers of the namespaces the routes read (its own always).
func (in *Intake) syncSources() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.ctx == nil || in.stopping.Load() {
		return
	}
	own := in.set.Names.Namespace()
	streamsWanted := map[string]bool{}
	for ns := range in.wantNS {
		stream := in.set.Streams.For(ns).EventsStream()
		streamsWanted[stream] = true
		if in.sources[stream] == nil {
			in.sources[stream] = in.puller.Source(stream, streams.IntakeConsumer(own), in)
		}
	}
	for stream, s := range in.sources {
		if !streamsWanted[stream] {
			s.Close()
			delete(in.sources, stream)
		}
	}
	in.refillLocked()
}

// Stop stops pulling; views still held are handed back (the messages come again).
func (in *Intake) Stop() {
	in.stopping.Store(true)
	in.mu.Lock()
	srcs := []*pull.Source{in.queue}
	for _, s := range in.sources {
		srcs = append(srcs, s)
	}
	in.mu.Unlock()
	for _, s := range srcs {
		if s != nil {
			s.Close()
		}
	}
	in.dropWaiting()
}

// Wait waits for the parks in flight.
func (in *Intake) Wait() { in.parking.Wait() }

// refillLocked asks each source for what its window and the byte budget allow.
func (in *Intake) refillLocked() {
	if in.stopping.Load() {
		return
	}
	room := int64(1 << 30)
	if b, ok := in.memory.(interface {
		Limit() int64
		Held() int64
	}); ok && b.Limit() > 0 {
		room = max(0, (b.Limit()/2-b.Held())/max(in.avgSize.Load(), 256))
	}
	// Views waiting for room (give) take places too: the intake pulls what its workers have
	// room for, and a little more, not what its window has room for.
	room = min(room, max(0, waitBudget-in.waitingN.Load()))
	for _, s := range in.sources {
		s.SetWant(int(max(0, min(int64(intakeWindow-in.openBy[s]), room))))
	}
	if in.queue != nil {
		in.queue.SetWant(int(max(0, min(int64(queueWindow-in.openBy[in.queue]), room))))
	}
}

// SourceChanged implements pull.Handler.
func (in *Intake) SourceChanged() {}

// Pulled takes a message of an intake or queue consumer (pull.Handler): it is handed to the
// workers it is for. It runs on the puller's goroutine and does not block.
func (in *Intake) Pulled(pm *pull.Msg) {
	md := pull.JetStreamMeta(pm.Meta)
	size := int64(len(pm.Msg.Data))
	for k, vs := range pm.Msg.Header {
		for _, v := range vs {
			size += int64(len(k) + len(v))
		}
	}
	in.avgSize.Store((in.avgSize.Load()*15 + size) / 16)
	sh := &shared{in: in, msg: pm.Msg, md: md, src: pm.Source, stamp: pm.Stamp, size: size, at: time.Now()}
	if md.Stream == in.set.Names.DeliveriesStream() {
		in.queued(sh)
		return
	}
	in.event(sh)
}

// event fans one event out to the shared-lane workers it is for.
func (in *Intake) event(sh *shared) {
	subject := sh.msg.Subject
	ns, typ := streams.SplitEventSubject(subject, in.set.Streams.EventsSubjectPrefix)
	if ns == "" {
		_ = sh.msg.Ack()
		return
	}
	// The operator's headers (Whk-*) its producer set are deleted once, before any view sees
	// the event.
	records.StripOperatorHeaders(sh.msg.Header, typ)
	in.dispatchMu.Lock()
	in.recent.add(recentEvent{stream: sh.md.Stream, subject: subject, seq: sh.md.Sequence.Stream, stored: sh.md.Timestamp})
	targets := in.routes.Load().lookup(ns, typ, nil)
	in.dispatchMu.Unlock()
	n := 0
	for _, w := range targets {
		if c := w.Config(); c != nil && !sh.md.Timestamp.Before(c.SharedSince) {
			targets[n] = w
			n++
		}
	}
	targets = targets[:n]
	if len(targets) == 0 {
		// No endpoint of this dispatcher takes it (or none was on the shared lane when it was
		// stored).
		_ = sh.msg.Ack()
		return
	}
	in.hand(sh, targets)
}

// queued hands a due delivery of the queue consumer to its endpoint's worker.
func (in *Intake) queued(sh *shared) {
	tok, ok := strings.CutPrefix(sh.msg.Subject, strings.TrimSuffix(in.set.Names.QueueFilter(), ">"))
	if !ok || tok == "" || strings.Contains(tok, ".") {
		_ = sh.msg.Ack() // not a queue subject of this namespace: nothing can take it
		return
	}
	w := in.routes.Load().byName[streams.EndpointName(tok)]
	if w == nil {
		if sh.md.NumDelivered >= unknownTries {
			in.log.Info("dropping a queued delivery for an endpoint this dispatcher does not serve", "subject", sh.msg.Subject,
				"delivery", sh.msg.Header.Get(records.HeaderMsgID))
			_ = sh.msg.Ack()
			return
		}
		// Not known yet (being created), or no longer on the shared lane: comes again.
		_ = sh.msg.NakWithDelay(30 * time.Second)
		return
	}
	in.hand(sh, []Taker{w})
}

// hand gives one view of sh to each of workers, or parks it for those that have no room.
func (in *Intake) hand(sh *shared, workers []Taker) {
	sh.views = len(workers)
	in.memory.Force(sh.size)
	in.mu.Lock()
	in.open[sh] = struct{}{}
	in.openBy[sh.src]++
	in.mu.Unlock()
	for _, w := range workers {
		in.give(w, &View{Msg: sh.msg, Meta: sh.md, Stamp: sh.stamp, share: sh, owner: w})
	}
}

// park copies view v onto its endpoint's park subject, then settles it (Taker.Park); a view
// that cannot be parked is handed back to the server with its message.
func (in *Intake) park(v *View) {
	v.parking = true
	in.parkedHere.Store(true)
	in.parking.Add(1)
	in.run(func() {
		defer in.parking.Done()
		w := v.owner
		c := w.Config()
		if c == nil {
			v.share.settled(v, true, time.Second)
			return
		}
		w.Park(in.ctx, c, v)
	})
}

// release forgets a settled shared message and asks for more.
func (in *Intake) release(sh *shared) {
	in.memory.Release(sh.size)
	in.mu.Lock()
	delete(in.open, sh)
	if in.openBy[sh.src]--; in.openBy[sh.src] <= 0 {
		delete(in.openBy, sh.src)
	}
	in.refillLocked()
	in.mu.Unlock()
}

// keepAlive reports the shared messages still worked on in progress, so no attempt (up to two
// minutes) outlasts the consumers' ack wait.
func (in *Intake) keepAlive(ctx context.Context) {
	for sleep(ctx, progressEvery) {
		now := time.Now()
		in.mu.Lock()
		var old []*shared
		for sh := range in.open {
			if now.Sub(sh.at) >= progressEvery {
				old = append(old, sh)
			}
		}
		in.mu.Unlock()
		for _, sh := range old {
			sh.progress()
		}
	}
}

// shared is one message of a shared consumer and the views of it the workers hold.
type shared struct {
	in    *Intake
	msg   *nats.Msg
	md    *jetstream.MsgMetadata
	src   *pull.Source
	stamp pull.Stamp
	size  int64
	at    time.Time

	// catchUp says the message was read again for a new endpoint: there is nothing to
	// acknowledge.
	catchUp bool

	mu         sync.Mutex
	views      int
	nak        bool
	delay      time.Duration
	progressed time.Time
}

// settled ends view v: acknowledged, or (nak) to be handed back with its message after delay.
// The message is settled with its last view.
func (sh *shared) settled(v *View, nak bool, delay time.Duration) {
	if v.handed {
		v.handed = false
		v.owner.Returned()
		sh.in.Feed(v.owner)
	}
	sh.mu.Lock()
	sh.views--
	if nak {
		sh.nak = true
		sh.delay = max(sh.delay, delay)
	}
	last, again, d := sh.views == 0, sh.nak, sh.delay
	sh.mu.Unlock()
	if !last {
		return
	}
	switch {
	case sh.catchUp && again:
		sh.in.log.Info("a caught-up event could not be parked for its new endpoint; it is not delivered to it",
			"stream", sh.md.Stream, "sequence", sh.md.Sequence.Stream)
	case sh.catchUp:
	case again:
		// Every view comes again: those settled already are found in their endpoint's
		// delivery log (the message is redelivered) and not sent twice.
		if d > 0 {
			_ = sh.msg.NakWithDelay(d)
		} else {
			_ = sh.msg.Nak()
		}
	default:
		_ = sh.msg.Ack()
	}
	sh.in.release(sh)
}

// handedBack parks view v for its endpoint (the worker did not deliver it now); a view whose
// park failed, or any view while the dispatcher stops, goes back with its message.
func (sh *shared) handedBack(v *View, delay time.Duration) {
	if v.parking || sh.in.stopping.Load() {
		sh.settled(v, true, max(delay, time.Second))
		return
	}
	if v.handed {
		v.handed = false
		v.owner.Returned()
	}
	sh.in.park(v)
}

// progress tells the server the message is still worked on, at most every few seconds.
func (sh *shared) progress() {
	sh.mu.Lock()
	now := time.Now()
	if now.Sub(sh.progressed) < time.Second {
		sh.mu.Unlock()
		return
	}
	sh.progressed = now
	sh.mu.Unlock()
	_ = sh.msg.InProgress()
}

// laneCounts are how many deliveries each shared-lane endpoint has parked and queued, as the
// deliveries stream said at one reading.
type laneCounts struct {
	parked, queued map[string]uint64
	at             time.Time
}

// Counted says the parks were counted once since the intake started: every endpoint routed
// then knows its park's count (Taker.Parked).
func (in *Intake) Counted() bool { return in.counted.Load() }

// Waiting is how many deliveries of endpoint ep wait in the deliveries stream on the shared
// lane at the last reading: parked and queued (its scheduled retries are counted apart).
func (in *Intake) Waiting(ep string) int64 {
	if in == nil {
		return 0
	}
	c := in.counts.Load()
	tok := streams.EndpointToken(ep)
	return int64(c.parked[tok] + c.queued[tok])
}

// Park watching: how often the namespace's parks and queues are counted.
const (
	watchBusy = time.Second
	watchIdle = 5 * time.Second
)

// watchParks counts, now and then, what every shared-lane endpoint has parked and queued (one
// request each for the whole namespace: the stream's per-subject counts), tells each worker
// what its park holds (its partition's holder then reads it back) and keeps the counts for the
// status's pending.
func (in *Intake) watchParks(ctx context.Context) {
	var st jetstream.Stream
	wait := time.Duration(0)
	for sleep(ctx, wait) {
		wait = watchIdle
		if st == nil {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			s, err := in.js.Stream(sctx, in.set.Names.DeliveriesStream())
			cancel()
			if err != nil {
				wait = watchBusy
				continue
			}
			st = s
		}
		in.parkedHere.Store(false)
		parked, err1 := subjectCounts(ctx, st, in.set.Names.ParkFilter())
		queued, err2 := subjectCounts(ctx, st, in.set.Names.QueueFilter())
		if err1 != nil || err2 != nil {
			wait = watchBusy
			continue
		}
		last := in.counts.Swap(&laneCounts{parked: parked, queued: queued, at: time.Now()})
		for name, w := range in.routes.Load().byName {
			tok := streams.EndpointToken(name)
			w.Parked(int64(parked[tok]))
			if parked[tok]+queued[tok] != last.parked[tok]+last.queued[tok] {
				w.Changed() // its pending changed: the status says so
			}
		}
		in.counted.Store(true)
		if len(parked) > 0 || len(queued) > 0 || in.parkedHere.Load() {
			wait = watchBusy
		}
	}
}

// subjectCounts reads how many messages each subject matching filter holds, keyed by the
// subject's last token (an endpoint's).
func subjectCounts(ctx context.Context, st jetstream.Stream, filter string) (map[string]uint64, error) {
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	info, err := st.Info(ictx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(info.State.Subjects))
	for subj, n := range info.State.Subjects {
		if i := strings.LastIndexByte(subj, '.'); i >= 0 {
			out[subj[i+1:]] += n
		}
	}
	return out, nil
}

// sleep waits d; false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
