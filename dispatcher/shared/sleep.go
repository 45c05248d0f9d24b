package shared

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Idle namespaces sleep. A namespace's dispatcher that had nothing to do for IdleAfter stops
// asking for messages and, once its pull requests ran out (quietWithin: a request outlives its
// connection on a cluster, see dispatcher.Pause), is stopped as a pod's would be (it drains,
// lets go of its partitions), and started again when something arrives; meanwhile the
// namespace costs one NATS connection under its own identity with a pull request waiting on
// each of its two consumers, its two token files, and nothing else on the servers or here.
//
// Idle: nothing unread or unacknowledged on its intake and queue consumers, no delivery parked
// (parked deliveries wait for what its dispatcher decides: a circuit closing, room freed), and
// neither they nor its pool entry changed for IdleAfter (so the delivery log was folded and the
// status written after the last delivery). Retries waiting on the server's schedules do not
// keep it awake: the server publishes them onto its queue when due, which wakes it. The pool
// entry says a namespace may not sleep (Entry.Awake) when one of its endpoints reads other
// namespaces' events or rides a lane of its own, which this does not watch.
//
// What wakes it: a message on its intake consumer (an event: producers, the ingress) or its
// queue consumer (a replay, a test delivery, a retry due), told by the pull requests taken
// before its dispatcher stopped, so nothing stored after the last look is missed; a change of
// its pool entry (an endpoint came, went, or changed what its dispatcher acts on:
// wake.Digest). A delivery parked while it stopped starts it again at once.

// Sleep states, as webhook_shared_dispatcher_namespaces counts them.
const (
	stateGone = iota
	stateAwake
	stateAsleep
)

// gauges count the namespaces awake and asleep, and the wakes by reason.
type gauges struct {
	mu     sync.Mutex
	of     map[string]int
	counts *prometheus.GaugeVec
	wakes  *prometheus.CounterVec
}

func newGauges(reg prometheus.Registerer) (*gauges, error) {
	g := &gauges{of: map[string]int{},
		counts: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "webhook_shared_dispatcher_namespaces",
			Help: "Namespaces a shared dispatcher serves, by state: awake (their dispatcher runs) or asleep (stopped while idle, woken by what arrives)."}, []string{"state"}),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "webhook_shared_dispatcher_wakes_total",
			Help: "Sleeping namespaces a shared dispatcher woke, by reason: event (on its intake consumer), delivery (a replay, test delivery or due retry on its queue consumer), change (its endpoints changed), work (found once its dispatcher stopped) or watch (what tells it of arrivals was refused or ended by the server)."}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{g.counts, g.wakes} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			// Another shared dispatcher of this process (tests) registered them: count there.
			switch c.(type) {
			case *prometheus.GaugeVec:
				g.counts = are.ExistingCollector.(*prometheus.GaugeVec)
			default:
				g.wakes = are.ExistingCollector.(*prometheus.CounterVec)
			}
		}
	}
	return g, nil
}

// set records namespace ns's state.
func (g *gauges) set(ns string, state int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := map[int]string{stateAwake: "awake", stateAsleep: "asleep"}
	if old, ok := g.of[ns]; ok {
		g.counts.WithLabelValues(names[old]).Dec()
		delete(g.of, ns)
	}
	if state != stateGone {
		g.of[ns] = state
		g.counts.WithLabelValues(names[state]).Inc()
	}
}

// runSleeping runs namespace ns's dispatcher with o, stopping it while the namespace is idle
// and starting it again when something arrives, until ctx ends or it fails.
func (s *Shared) runSleeping(ctx context.Context, ns string, sv *served, o dispatcher.Options, log logr.Logger) error {
	w, err := watch(ns, o, log)
	if err != nil {
		return fmt.Errorf("the namespace's idle watch: %w", err)
	}
	defer w.close()
	defer s.gauges.set(ns, stateGone)
	pause := &dispatcher.Pause{}
	o.Pause = pause
	if o.PullExpiry <= 0 {
		// Its requests run out within this once it is quiet: a namespace sleeps this long
		// after it was idle for IdleAfter.
		o.PullExpiry = quietWithin
	}
	for {
		s.setAsleep(ns, sv, false)
		runCtx, stop := context.WithCancel(ctx)
		r := &running{done: make(chan struct{})}
		go func() {
			defer close(r.done)
			r.err = dispatcher.Run(runCtx, o)
		}()
		var version uint64
		for {
			var idle bool
			version, idle = s.untilIdle(runCtx, w, sv, r.done)
			if !idle {
				// It ended by itself, or ctx ended.
				stop()
				<-r.done
				return r.err
			}
			// No pull request of it may outlive it (dispatcher.Pause): it stops asking, and
			// sleeps once what it asked for ran out, unless something came meanwhile.
			if pause.Quiesce(runCtx) {
				break
			}
		}
		// Whatever is published from now on wakes it.
		sub, err := w.subscribe()
		if err != nil {
			log.Error(err, "cannot be told what arrives while the namespace would sleep; its dispatcher keeps running")
			pause.Resume()
			<-r.done
			stop()
			return r.err
		}
		stop()
		<-r.done
		if r.err != nil || ctx.Err() != nil {
			sub.close()
			return r.err
		}
		if busy, err := w.look(ctx); err != nil || busy.parked {
			sub.close()
			s.gauges.wakes.WithLabelValues("work").Inc()
			continue
		}
		s.setAsleep(ns, sv, true)
		log.Info("sleeping: nothing to do", "for", s.o.IdleAfter.String())
		reason := s.sleep(ctx, sv, sub, version)
		sub.close()
		if ctx.Err() != nil {
			return nil
		}
		s.gauges.wakes.WithLabelValues(reason).Inc()
		log.Info("waking", "reason", reason)
	}
}

// quietWithin is how long the pull requests of a shared dispatcher's namespace last while it
// is idle (dispatcher.Options.PullExpiry, unless set).
const quietWithin = 30 * time.Second

// running is a namespace's dispatcher: done is closed when it ended, with err.
type running struct {
	done chan struct{}
	err  error
}

// setAsleep records whether namespace ns sleeps.
func (s *Shared) setAsleep(ns string, sv *served, asleep bool) {
	s.mu.Lock()
	sv.asleep = asleep
	s.mu.Unlock()
	s.gauges.set(ns, map[bool]int{false: stateAwake, true: stateAsleep}[asleep])
}

// entry is sv's pool entry and how often it changed.
func (s *Shared) entry(sv *served) (Entry, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sv.entry, sv.version
}

// untilIdle looks at the namespace every quarter of IdleAfter while its dispatcher runs, and
// returns true once it was idle for IdleAfter, with its entry's version then; false when the
// dispatcher ended (ran is closed) or ctx ended.
func (s *Shared) untilIdle(ctx context.Context, w *watcher, sv *served, ran <-chan struct{}) (uint64, bool) {
	every := max(s.o.IdleAfter/4, 100*time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last state
	var since time.Time
	for {
		select {
		case <-ctx.Done():
			return 0, false
		case <-ran:
			return 0, false
		case <-tick.C:
		}
		now, err := w.look(ctx)
		entry, version := s.entry(sv)
		now.version = version
		switch {
		case err != nil || now.work() || entry.Awake:
			since = time.Time{}
		case since.IsZero() || now != last:
			since = time.Now()
		case time.Since(since) >= s.o.IdleAfter:
			return version, true
		}
		last = now
	}
}

// state is what a look at a namespace saw.
type state struct {
	// pending and unacked on the intake and queue consumers, and the last stream sequence each
	// delivered.
	pending, unacked uint64
	delivered        [2]uint64
	// parked: a delivery is parked on the deliveries stream.
	parked bool
	// version of the namespace's pool entry.
	version uint64
}

// work says whether something waits for the namespace's dispatcher that would not wake it.
func (st state) work() bool { return st.pending > 0 || st.unacked > 0 || st.parked }

// sleep waits until something arrives for the namespace (told by sub, or a change of its pool
// entry since version) or ctx ends, and says what woke it.
func (s *Shared) sleep(ctx context.Context, sv *served, sub *wakeSub, version uint64) string {
	for {
		if _, v := s.entry(sv); v != version {
			return "change"
		}
		select {
		case <-ctx.Done():
			return ""
		case reason := <-sub.c:
			return reason
		case <-sv.changed:
		}
	}
}

// watcher is a namespace's connection, under its dispatcher's identity, that looks at its
// consumers and deliveries stream and asks to be told of what wakes it.
type watcher struct {
	nc    *nats.Conn
	js    jetstream.JetStream
	names streams.NamespaceNames
	// denied counts the permission violations the server reported on the connection, and
	// refused tells of each (a refusal reported late wakes a sleeping namespace).
	denied  atomic.Uint64
	refused chan struct{}
	// reconnected tells of every new connection: pull requests made before are lost.
	reconnected chan struct{}
}

func watch(ns string, o dispatcher.Options, log logr.Logger) (*watcher, error) {
	w := &watcher{names: o.Config.Streams.Names.For(ns), refused: make(chan struct{}, 1), reconnected: make(chan struct{}, 1)}
	name := "webhook-dispatcher " + ns + " watch"
	nc, js, err := o.Config.Connect(name, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			w.denied.Add(1)
			select {
			case w.refused <- struct{}{}:
			default:
			}
		}
		log.Info("NATS error on the idle watch", "error", err.Error())
	}), nats.ReconnectHandler(func(*nats.Conn) {
		select {
		case w.reconnected <- struct{}{}:
		default:
		}
	}))
	if err != nil {
		return nil, err
	}
	w.nc, w.js = nc, js
	return w, nil
}

func (w *watcher) close() { w.nc.Close() }

// consumers are the namespace's shared-lane consumers: its intake consumer on its events
// stream, its queue consumer on its deliveries stream (replays, test deliveries, and retries
// the server's schedules publish when due), with what a message there wakes it for.
func (w *watcher) consumers() [2][3]string {
	return [2][3]string{
		{w.names.EventsStream(), streams.IntakeConsumer(w.names.Namespace()), "event"},
		{w.names.DeliveriesStream(), w.names.QueueConsumer(), "delivery"},
	}
}

// look reads the namespace's consumers and whether a delivery is parked (four requests); a
// stream or consumer that does not exist has nothing.
func (w *watcher) look(ctx context.Context) (state, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var st state
	for i, c := range w.consumers() {
		con, err := w.js.Consumer(ctx, c[0], c[1])
		switch {
		case err == nil:
			info := con.CachedInfo()
			st.pending += info.NumPending
			st.unacked += uint64(info.NumAckPending)
			st.delivered[i] = info.Delivered.Stream
		case !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound):
			return st, err
		}
	}
	str, err := w.js.Stream(ctx, w.names.DeliveriesStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	// Parked deliveries wait for what the dispatcher decides (a circuit closing, room freed),
	// which nothing published tells.
	_, err = str.GetLastMsgForSubject(ctx, w.names.ParkFilter())
	switch {
	case err == nil:
		st.parked = true
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		return st, err
	}
	return st, nil
}

// How a sleeping namespace is told that a message arrived: a pull request for at most one
// byte waits on each of its consumers. The server answers it "409 Message Size Exceeds
// MaxBytes" as soon as a message is there, without delivering it (no delivery is counted, no
// acknowledgement awaited): the message stays for the dispatcher, which is started. The
// request lasts wakeExpires and is asked again then; its heartbeats show it is still held (a
// server restarted or a consumer leader moved may have lost it: it is asked again).
const (
	wakeExpires   = 5 * time.Minute
	wakeHeartbeat = 30 * time.Second
)

// wakeSub is what tells a sleeping namespace that something arrived: c says why, once.
type wakeSub struct {
	sub  *nats.Subscription
	c    chan string
	stop chan struct{}
	done chan struct{}
}

// subscribe asks each of the namespace's consumers to tell when a message is there.
func (w *watcher) subscribe() (*wakeSub, error) {
	inbox := w.nc.NewInbox()
	msgs := make(chan *nats.Msg, 16)
	sub, err := w.nc.ChanSubscribe(inbox+".*", msgs)
	if err != nil {
		return nil, err
	}
	targets := w.consumers()
	arm := func(i int) error {
		req := fmt.Sprintf(`{"batch":1,"max_bytes":1,"expires":%d,"idle_heartbeat":%d}`, wakeExpires, wakeHeartbeat)
		return w.nc.PublishRequest(jetstreamAPI+"CONSUMER.MSG.NEXT."+targets[i][0]+"."+targets[i][1], inbox+"."+strconv.Itoa(i), []byte(req))
	}
	denied := w.denied.Load()
	select {
	case <-w.refused: // an earlier refusal, counted in denied
	default:
	}
	select {
	case <-w.reconnected: // an earlier reconnection: the requests below are made after it
	default:
	}
	for i := range targets {
		err = errors.Join(err, arm(i))
	}
	// The server has them (or refused them) before the dispatcher stops.
	if err == nil {
		err = w.nc.FlushTimeout(5 * time.Second)
	}
	if err == nil && w.denied.Load() != denied {
		err = errors.New("the server refused a pull request or the inbox's subscription")
	}
	if err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	ws := &wakeSub{sub: sub, c: make(chan string, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(ws.done)
		var heard [2]time.Time
		for i := range heard {
			heard[i] = time.Now()
		}
		tick := time.NewTicker(wakeHeartbeat)
		defer tick.Stop()
		wake := func(reason string) {
			select {
			case ws.c <- reason:
			default:
			}
		}
		for {
			select {
			case <-ws.stop:
				return
			case <-w.refused:
				wake("watch")
			case <-w.reconnected:
				// Asked again on the new connection (a server restarted or went away).
				for i := range heard {
					heard[i] = time.Now()
					if err := arm(i); err != nil {
						wake("watch")
					}
				}
			case <-tick.C:
				for i := range heard {
					if time.Since(heard[i]) > 2*wakeHeartbeat+wakeHeartbeat/2 {
						// Lost with its server: asked again.
						heard[i] = time.Now()
						if err := arm(i); err != nil {
							wake("watch")
						}
					}
				}
			case m := <-msgs:
				i, err := strconv.Atoi(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:])
				if err != nil || i < 0 || i >= len(targets) {
					continue
				}
				heard[i] = time.Now()
				status, desc := m.Header.Get("Status"), strings.ToLower(m.Header.Get("Description"))
				switch {
				case status == "100":
				case status == "408":
					// Expired: asked again (once every wakeExpires).
					if err := arm(i); err != nil {
						wake("watch")
					}
				case status == "409" && strings.Contains(desc, "maxbytes"):
					// A message is there.
					wake(targets[i][2])
				default:
					// Any other end (a leader change, a limit, the consumer gone): the
					// dispatcher looks, and the namespace sleeps again once idle. Never asked
					// again at once, which an answer that repeats would turn into a loop.
					wake("watch")
				}
			}
		}
	}()
	return ws, nil
}

// jetstreamAPI prefixes the JetStream API's subjects.
const jetstreamAPI = "$JS.API."

func (ws *wakeSub) close() {
	close(ws.stop)
	<-ws.done
	_ = ws.sub.Unsubscribe()
}
