package deliver

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// An endpoint takes its events straight from the events stream, which keeps them within its
// limits (age and bytes) and drops the oldest beyond them. An endpoint that cannot deliver for
// a while must not lose its events that way, so it holds them: it copies each event it pulls
// into the deliveries stream, as one delivery (the id it would have had), and acknowledges it
// on the events stream once the copy is stored. What is held there waits as long as it must,
// and comes back through the endpoint's deliveries consumer. The deliveries stream is bounded,
// so holding stops at its hold threshold (Room): the events an endpoint would hold beyond it
// stay in the events stream, not acknowledged, until there is room or it delivers again. An
// endpoint holds while it is suspended, while its circuit is open, and while the events it
// pulls are among those the events stream's limits drop next (it lags).
//
// A PerKey endpoint keeps its keys in order across a hold: once it stops holding, it takes
// events again only when every held delivery has come back from the deliveries stream (its
// consumer there has none pending); until then what still arrives is held too.

// roomRetry is when an event that found no room in the deliveries stream comes back.
const roomRetry = 5 * time.Second

// holding reports whether the worker holds its events now.
func (w *Worker) holding(c *endpoint.Config, m mode) bool {
	if c == nil || c.Deleting || (c.SingleActive() && !w.env.Holds(w.name)) {
		return false
	}
	if c.Suspend || w.lagging.Load() {
		return true
	}
	if disabled, needsSync := w.env.Health.Fast(w.name); disabled || !needsSync {
		// Disabled endpoints dead-letter what arrives; a closed circuit delivers.
		return false
	}
	st := w.env.Health.Snapshot(w.name)
	return st.CircuitState() == v1alpha1.CircuitOpen
}

// hold copies one event into the deliveries stream and acknowledges it once the copy is
// stored (an event that cannot be copied is dead-lettered, one whose copy failed comes back).
// Copies are published in the order events arrive, so they keep it in the deliveries stream.
func (w *Worker) hold(ctx context.Context, c *endpoint.Config, msg *pulled) {
	md, err := msg.Metadata()
	if err != nil {
		_ = msg.Nak()
		return
	}
	if w.lagging.Load() && !w.env.Windows.Endangered(md.Stream, md.Sequence.Stream, md.Timestamp) {
		w.lagging.Store(false)
	}
	if c.PerKey {
		w.setHeld()
	}
	meta, invalid, ok := records.EventDelivery(msg.Subject(), w.env.Streams.EventsSubjectPrefix, md.Stream, md.Sequence.Stream, md.Timestamp,
		msg.Headers(), w.env.Names.Namespace(), w.name)
	if !ok {
		_ = msg.Ack()
		return
	}
	meta.Redelivered = md.NumDelivered > 1
	size := msgSize(msg)
	if !w.env.Budget.Acquire(ctx, size) {
		_ = msg.Nak()
		return
	}
	w.inflight.Add(1)
	done := func() {
		w.env.Budget.Release(size)
		w.inflight.Done()
	}
	out := records.NewDelivery(w.env.Names.DeliverySubject(w.name), msg.Headers(), msg.Data(), meta)
	reason, why := "", ""
	switch {
	case invalid != "":
		reason, why = records.ReasonInvalidEvent, invalid
	case !records.Fits(out, w.env.MaxPayload):
		reason, why = records.ReasonPayloadTooLarge, records.TooLarge(records.MsgSize(out), w.env.MaxPayload)
	}
	if reason != "" {
		w.env.Runners.Go(func() {
			defer done()
			w.deadLetter(ctx, msg, meta, reason, why, nil, nil)
		})
		return
	}
	copySize := records.MsgSize(out)
	if !w.env.Room.Reserve(ctx, copySize) {
		// The deliveries stream is at its hold threshold: the event stays in the events
		// stream, not acknowledged, and is held (or delivered) when it comes back.
		_ = msg.NakWithDelay(roomRetry)
		done()
		return
	}
	f, err := w.env.JS.PublishMsgAsync(out, jetstream.WithStallWait(5*time.Second))
	if err != nil {
		w.env.Room.Released(copySize)
		w.env.Log.V(1).Info("holding an event failed; it comes back", "endpoint", w.name, "error", err.Error())
		_ = msg.NakWithDelay(time.Second)
		done()
		return
	}
	w.Metrics.Held()
	w.dirty() // its pending changed
	w.env.Runners.Go(func() {
		defer done()
		select {
		case <-f.Ok():
			w.env.Room.Stored(copySize)
			_ = msg.Ack()
		case err := <-f.Err():
			w.env.Room.Released(copySize)
			w.env.Log.V(1).Info("holding an event failed; it comes back", "endpoint", w.name, "error", err.Error())
			_ = msg.NakWithDelay(time.Second)
		}
	})
}

func (w *Worker) setHeld() {
	w.mu.Lock()
	w.held = true
	w.mu.Unlock()
}

func (w *Worker) heldBefore() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.held
}

// drainCheck ends a PerKey endpoint's wait for its held deliveries once its deliveries
// consumer has none pending (every held one was taken, in order, behind its key). It reports
// whether the wait goes on.
func (w *Worker) drainCheck(ctx context.Context, c *endpoint.Config, hold bool) bool {
	w.mu.Lock()
	held := w.held
	if c == nil || !c.PerKey {
		w.held = false
	}
	w.mu.Unlock()
	if c == nil || !c.PerKey || hold || !held || !w.env.Holds(w.name) {
		return false
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := w.env.JS.Consumer(ictx, w.env.Names.DeliveriesStream(), w.env.Names.EndpointConsumer(w.name))
	if err != nil || cons.CachedInfo().NumPending > 0 {
		return true
	}
	w.mu.Lock()
	w.held = false
	w.mu.Unlock()
	w.activate()
	return false
}

// endangered reports whether an event pulled from an events stream is among those its limits
// drop next.
func (w *Worker) endangered(msg *pulled) bool {
	md, err := msg.Metadata()
	return err == nil && w.env.Windows.Endangered(md.Stream, md.Sequence.Stream, md.Timestamp)
}

// eventNamespaceType splits an event subject <prefix>.<namespace>.<type>.
func eventNamespaceType(subject, prefix string) (ns, typ string) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return "", ""
	}
	ns, typ, ok = strings.Cut(rest, ".")
	if !ok || typ == "" {
		return "", ""
	}
	return ns, typ
}

// Windows knows, for each events stream a dispatcher reads, which events its limits drop
// next. It reads a stream's state at most every windowRefresh, in the background.
type Windows struct {
	js jetstream.JetStream
	mu sync.Mutex
	m  map[string]*window
}

type window struct {
	first, last     uint64
	bytes, maxBytes int64
	msgs, maxMsgs   int64
	maxAge          time.Duration
	at              time.Time
	fetching        bool
}

const windowRefresh = 5 * time.Second

// NewWindows reads streams through js.
func NewWindows(js jetstream.JetStream) *Windows {
	return &Windows{js: js, m: map[string]*window{}}
}

// Endangered reports whether the event at seq of stream, stored at stored, is among those the
// stream drops next: older than half its MaxAge, or in the older half of a stream more than
// half full (bytes or messages). Until the stream's state is known, nothing is.
func (ws *Windows) Endangered(stream string, seq uint64, stored time.Time) bool {
	ws.mu.Lock()
	w := ws.m[stream]
	if w == nil {
		w = &window{}
		ws.m[stream] = w
	}
	if time.Since(w.at) > windowRefresh && !w.fetching {
		w.fetching = true
		go ws.fetch(stream)
	}
	cp := *w
	ws.mu.Unlock()
	if cp.at.IsZero() {
		return false
	}
	if cp.maxAge > 0 && time.Since(stored) > cp.maxAge/2 {
		return true
	}
	full := cp.maxBytes > 0 && cp.bytes > cp.maxBytes/2 || cp.maxMsgs > 0 && cp.msgs > cp.maxMsgs/2
	return full && cp.last > cp.first && seq < cp.first+(cp.last-cp.first)/2
}

func (ws *Windows) fetch(stream string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var info *jetstream.StreamInfo
	if st, err := ws.js.Stream(ctx, stream); err == nil {
		info = st.CachedInfo()
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.m[stream]
	w.fetching = false
	if info == nil {
		return
	}
	w.first, w.last, w.bytes, w.msgs = info.State.FirstSeq, info.State.LastSeq, int64(info.State.Bytes), int64(info.State.Msgs)
	w.maxBytes, w.maxMsgs, w.maxAge, w.at = info.Config.MaxBytes, info.Config.MaxMsgs, info.Config.MaxAge, time.Now()
}
