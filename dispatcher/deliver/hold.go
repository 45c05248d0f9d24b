package deliver

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/settle"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
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

// holding reports whether the worker holds its events now.
func (w *Worker) holding(v decide.View) bool {
	return w.lagging.Load() && v.Config != nil && !v.Config.Deleting && !v.LeaseMoved || w.holdsBack(v)
}

// holdsBack reports whether the endpoint delivers nothing now (suspended, circuit open), as
// opposed to holding only the events it lags behind on: on the shared lane its park and queue
// are read unless it holds back.
func (w *Worker) holdsBack(v decide.View) bool {
	c := v.Config
	if c == nil || c.Deleting || v.LeaseMoved {
		return false
	}
	if c.Suspend {
		return true
	}
	if disabled, needsSync := w.f.Health.Fast(w.name); disabled || !needsSync {
		// Disabled endpoints dead-letter what arrives; a closed circuit delivers.
		return false
	}
	st := w.f.Health.Snapshot(w.name)
	return st.CircuitState() == v1alpha1.CircuitOpen
}

// hold copies one event into the deliveries stream (finish stores the copy and acknowledges
// the event once it is stored); an event that cannot be copied is dead-lettered, one that
// cannot be read comes back.
func (w *Worker) hold(ctx context.Context, c *endpoint.Config, msg *pulled) {
	md, err := msg.Metadata()
	if err != nil {
		w.finish(ctx, msg, decide.Release(0))
		return
	}
	if w.lagging.Load() && !w.f.Windows.Endangered(md.Stream, md.Sequence.Stream, md.Timestamp) {
		w.lagging.Store(false)
	}
	if c.PerKey {
		w.setHeld()
	}
	names := w.f.Settings.Names
	var meta records.DeliveryMeta
	invalid := ""
	if md.Stream == w.f.parks.name {
		// A delivery of the shared lane's queue, parked as it is.
		meta, invalid = w.deliveryOf(msg, nil)
	} else {
		var ok bool
		meta, invalid, ok = records.EventDelivery(msg.Subject(), w.f.Settings.Streams.EventsSubjectPrefix, md.Stream, md.Sequence.Stream, md.Timestamp,
			msg.Headers(), names.Namespace(), w.name)
		if !ok {
			w.finish(ctx, msg, decide.Ack())
			return
		}
	}
	// A copy of a message delivered before (by its count, or by its place when the consumer's
	// state went back) says so, as does a copy of such a copy: its outcome may be logged.
	_, again := settle.Redelivered(msg)
	meta.Redelivered = meta.Redelivered || again
	size := msgSize(msg)
	if !w.f.Memory.Acquire(ctx, size) {
		w.finish(ctx, msg, decide.Release(0))
		return
	}
	w.inflight.Add(1)
	done := func() {
		w.f.Memory.Release(size)
		w.inflight.Done()
	}
	var out *nats.Msg
	if c.Lane == streams.LaneShared {
		// Parked: one copy per message parked (a delivery may be parked again after it came
		// back), so its message id names where it was parked from.
		out = records.NewDelivery(names.ParkSubject(w.name), msg.Headers(), msg.Data(), meta)
		out.Header.Set(records.HeaderMsgID, meta.DeliveryID+"/park/"+md.Stream+"/"+strconv.FormatUint(md.Sequence.Stream, 10))
	} else {
		out = records.NewDelivery(names.DeliverySubject(w.name), msg.Headers(), msg.Data(), meta)
	}
	v := decide.Verdict{Act: decide.ActHold, Out: out, Stored: done, Meta: meta}
	switch {
	case invalid != "":
		v = decide.DeadLetter(records.ReasonInvalidEvent, invalid).With(meta)
	case !records.Fits(out, w.f.Settle.MaxPayload()):
		v = decide.DeadLetter(records.ReasonPayloadTooLarge, records.TooLarge(records.MsgSize(out), w.f.Settle.MaxPayload())).With(meta)
	}
	if v.Act == decide.ActDeadLetter {
		w.f.Runners.Go(func() {
			defer done()
			w.finish(ctx, msg, v)
		})
		return
	}
	w.finish(ctx, msg, v)
}

func (w *Worker) setHeld() {
	w.in.mu.Lock()
	w.in.held = true
	w.in.mu.Unlock()
}

// drainCheck ends a PerKey endpoint's wait for its held deliveries once its deliveries
// consumer has none pending (every held one was taken, in order, behind its key). It reports
// whether the wait goes on.
func (w *Worker) drainCheck(ctx context.Context, v decide.View) bool {
	c := v.Config
	w.in.mu.Lock()
	held := w.in.held
	if c == nil || !c.PerKey {
		w.in.held = false
	}
	w.in.mu.Unlock()
	if c == nil || !c.PerKey || v.Hold || !held || v.LeaseMoved {
		return false
	}
	if pending, err := w.heldPending(ctx); err != nil || pending {
		return true
	}
	w.in.mu.Lock()
	w.in.held = false
	w.in.mu.Unlock()
	w.activate()
	return false
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

// heldPending reports whether the endpoint's consumer on the deliveries stream still has
// deliveries to bring (the ones it held, among others).
func (w *Worker) heldPending(ctx context.Context) (bool, error) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := w.f.JS.Consumer(ictx, w.f.parks.name, w.f.Settings.Names.EndpointConsumer(w.name))
	if err != nil {
		return true, err
	}
	return cons.CachedInfo().NumPending > 0, nil
}
