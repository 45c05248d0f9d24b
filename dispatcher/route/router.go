package route

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Holder bounds the bytes held in memory (the dispatcher's byte budget).
type Holder interface {
	Acquire(ctx context.Context, n int64) bool
	Release(n int64)
}

// Tally counts the events an endpoint's filter rejected, for its health (health.FilterTally).
type Tally interface {
	Filtered(ep string)
}

// Router consumes the events of a namespace (and of its endpoints' source namespaces) and
// writes one delivery per matching endpoint, or its dead letter when it cannot be delivered.
// An event is acknowledged once every write is stored, in arrival order.
type Router struct {
	JS jetstream.JetStream
	// Streams is the installation's layout; Names the dispatcher's own namespace's.
	Streams streams.Config
	Names   streams.NamespaceNames
	// Dedicated is the endpoint of a dedicated dispatcher, or empty.
	Dedicated string
	// Table is the current route table.
	Table func() *Table
	// Disabled says why an endpoint is disabled, or false.
	Disabled func(ep string) (string, bool)
	Metrics  *metrics.Metrics
	Budget   Holder
	// Tally counts filtered events; nil counts them in the metric only.
	Tally Tally
	// MaxEventBytes is the largest event delivered; MaxPayload the server's limit on one
	// message (payload and headers).
	MaxEventBytes int
	MaxPayload    int64
	// PullBytes bounds what one pull may hold.
	PullBytes int
	Log       logr.Logger

	settle chan *pendingEvent
}

// pendingEvent is an event whose writes await acknowledgement.
type pendingEvent struct {
	msg     jetstream.Msg
	futures []jetstream.PubAckFuture
	failed  bool
	held    int64
}

// Run routes until ctx ends: one feed per events stream read, started and stopped as the
// endpoints' source namespaces change.
func (r *Router) Run(ctx context.Context) error {
	r.settle = make(chan *pendingEvent, 4096)
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		r.settleLoop()
	}()
	var wg sync.WaitGroup
	feeds := map[string]context.CancelFunc{}
	update := func() {
		want := r.Table().namespaces
		if len(want) == 0 {
			want = []string{r.Names.Namespace()}
		}
		for ns, stop := range feeds {
			if !slices.Contains(want, ns) {
				stop()
				delete(feeds, ns)
			}
		}
		for _, ns := range want {
			if feeds[ns] == nil {
				fctx, cancel := context.WithCancel(ctx)
				feeds[ns] = cancel
				wg.Go(func() { r.consume(fctx, ns) })
			}
		}
	}
	update()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			close(r.settle)
			<-settled
			return nil
		case <-tick.C:
			update()
		}
	}
}

// consume routes the events of namespace src's events stream until ctx ends, through the
// router's consumer there (created by the controller).
func (r *Router) consume(ctx context.Context, src string) {
	name := streams.RouterConsumer(r.Names.Namespace(), r.Dedicated)
	stream := r.Streams.For(src).EventsStream()
	log := r.Log.WithValues("consumer", name, "stream", stream)
	var cons jetstream.Consumer
	for {
		var err error
		cons, err = r.JS.Consumer(ctx, stream, name)
		if err == nil {
			break
		}
		log.V(1).Info("waiting for the router consumer", "error", err.Error())
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
	}
	log.V(1).Info("router consuming")
	f := &feed{r: r}
	cc, err := cons.Consume(func(msg jetstream.Msg) { f.route(ctx, msg) },
		jetstream.PullMaxMessagesWithBytesLimit(2000, r.PullBytes), jetstream.PullExpiry(30*time.Second), jetstream.PullHeartbeat(2*time.Second),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			log.Info("router consume", "error", err.Error())
		}))
	if err != nil {
		log.Error(err, "router")
		return
	}
	<-ctx.Done()
	cc.Drain()
	<-cc.Closed()
}

// feed is the routing state of one events stream's consumer.
type feed struct {
	r   *Router
	buf []string
}

func (r *Router) settleLoop() {
	for p := range r.settle {
		ok := !p.failed
		for _, f := range p.futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				r.Log.V(1).Info("writing a delivery failed; the event will be routed again", "error", err.Error())
				ok = false
			}
		}
		if ok {
			_ = p.msg.Ack()
		} else {
			_ = p.msg.NakWithDelay(time.Second)
		}
		r.Budget.Release(p.held)
	}
}

// route handles one event (called by the consumer's single delivery goroutine, in order).
func (f *feed) route(ctx context.Context, msg jetstream.Msg) {
	r := f.r
	p := &pendingEvent{msg: msg, held: int64(len(msg.Data()) + records.HeaderSize(msg.Headers()))}
	if !r.Budget.Acquire(ctx, p.held) {
		_ = msg.Nak()
		return
	}
	defer func() {
		select {
		case r.settle <- p:
		case <-ctx.Done():
			_ = msg.Nak()
			r.Budget.Release(p.held)
		}
	}()
	ev, ok := parseEvent(msg, r.Streams.EventsSubjectPrefix)
	if !ok {
		return
	}
	r.Metrics.Routed(r.Names.Namespace()).Inc()
	table := r.Table()
	ix := table.byNamespace[ev.namespace]
	if ix == nil {
		return
	}
	f.buf = ix.Lookup(ev.eventType, f.buf[:0])
	now := time.Now().UTC()
	in := input{msg: msg, ev: ev}
	for _, ep := range f.buf {
		e, ok := table.endpoints[ep]
		if !ok || e.Config.Deleting || (ev.ops && !receivesOps(&ev, r.Names.Namespace(), ep, e.Config.EventTypes)) {
			continue
		}
		fs, err := r.deliver(ctx, msg, ev, &in, ep, e, now)
		p.futures = append(p.futures, fs...)
		if err != nil {
			p.failed = true
		}
	}
}

// input is an event's variables for filters, built on first use and shared by every
// endpoint's filter (the body is parsed once per event).
type input struct {
	msg jetstream.Msg
	ev  event
	in  *expr.Input
}

func (i *input) get() *expr.Input {
	if i.in == nil {
		i.in = expr.NewInput(&expr.Event{ID: i.ev.eventID, Type: i.ev.eventType, Namespace: i.ev.namespace, Time: i.ev.eventTime,
			Headers: i.msg.Headers(), Data: i.msg.Data()})
	}
	return i.in
}

// deliver writes the delivery of one event to one endpoint of a matching type unless its
// filter rejects the event: a rejected event is counted (metric and health) and leaves no
// trace in the streams; one the filter cannot decide on is dead-lettered as filter_failed.
func (r *Router) deliver(ctx context.Context, msg jetstream.Msg, ev event, in *input, ep string, e Endpoint, now time.Time) ([]jetstream.PubAckFuture, error) {
	var filterErr error
	if flt := e.Config.Filter; flt != nil && len(msg.Data()) <= r.MaxEventBytes {
		ok, err := flt.Match(ctx, in.get())
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err() // stopping: the event is routed again
		case err != nil:
			filterErr = err
		case !ok:
			e.Metrics.Filtered.Inc()
			if r.Tally != nil {
				r.Tally.Filtered(ep)
			}
			return nil, nil
		}
	}
	return r.write(msg, ev, ep, e, now, filterErr)
}

// write writes the delivery of one event to one endpoint, or its dead letter when it cannot
// be delivered (invalid, its filter failed, too large, endpoint disabled). Writing the same
// event to the same endpoint twice keeps one (the message id is the delivery id).
func (r *Router) write(msg jetstream.Msg, ev event, ep string, e Endpoint, now time.Time, filterErr error) ([]jetstream.PubAckFuture, error) {
	ns := r.Names.Namespace()
	// Event ids are unique per namespace: an event of a source namespace is told apart from
	// one of the same id in this namespace.
	idOf := ev.eventID
	if ev.namespace != ns {
		idOf = ev.namespace + "/" + ev.eventID
	}
	meta := records.DeliveryMeta{
		DeliveryID: records.DeliveryID(idOf, ns, ep), EventID: ev.eventID, EventType: ev.eventType,
		EventTime: ev.eventTime, EventSeq: ev.seq, Namespace: ns, Endpoint: ep, Created: now,
	}
	if ev.invalid != "" {
		// The event id itself may be what is wrong: name the delivery by where the event is.
		meta.DeliveryID = records.DeliveryIDAt(ev.stream, ev.seq, ep)
	}
	out := records.NewDelivery(r.Names.DeliverySubject(ep), msg.Headers(), msg.Data(), meta)

	reason, why := "", ""
	switch {
	case ev.invalid != "":
		reason, why = records.ReasonInvalidEvent, ev.invalid
	case filterErr != nil:
		reason, why = records.ReasonFilterFailed, records.Bound(filterErr.Error(), records.MaxErrorText)
	case len(msg.Data()) > r.MaxEventBytes:
		reason, why = records.ReasonPayloadTooLarge, fmt.Sprintf("the event is %d bytes; the installation delivers at most %d", len(msg.Data()), r.MaxEventBytes)
	case !records.Fits(out, r.MaxPayload):
		reason, why = records.ReasonPayloadTooLarge, records.TooLarge(records.MsgSize(out), r.MaxPayload)
	default:
		if disabled, ok := r.Disabled(ep); ok {
			reason, why = records.ReasonEndpointDisabled, disabled
		}
	}
	if reason == "" {
		// When too many writes await acknowledgement, wait (backpressure) rather than fail.
		f, err := r.JS.PublishMsgAsync(out, jetstream.WithStallWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		r.Metrics.Fanout(ns).Inc()
		e.Dirty.Store(true) // its pending count changed
		return []jetstream.PubAckFuture{f}, nil
	}
	return r.deadLetter(out, ev, ep, e, reason, why, now)
}

// deadLetter writes the dead letter of a delivery the router gives up, and its delivery-log
// record; the event is acknowledged once both are stored.
func (r *Router) deadLetter(out *nats.Msg, ev event, ep string, e Endpoint, reason, why string, now time.Time) ([]jetstream.PubAckFuture, error) {
	dl := records.NewDeadLetter(out.Header, reason, why, nil, now)
	f, err := r.JS.PublishMsgAsync(records.DeadLetterMessage(r.Names.DeadLetterSubject(ep, dl.DeliveryID), dl, out.Data, r.MaxPayload), jetstream.WithStallWait(5*time.Second))
	if err != nil {
		return nil, err
	}
	futures := []jetstream.PubAckFuture{f}
	rec := records.LogRecord{DeliveryID: dl.DeliveryID, EventID: ev.eventID, EventType: ev.eventType, EventSeq: ev.seq,
		Namespace: r.Names.Namespace(), Endpoint: ep, State: records.StateDeadLetter, Time: now, Reason: reason,
		DeadLetterReason: reason, Response: records.Response{Error: why}}
	f, err = r.JS.PublishMsgAsync(records.LogMessage(r.Names.AttemptSubject(ep), &rec, nil), jetstream.WithStallWait(5*time.Second))
	if err != nil {
		return futures, err
	}
	futures = append(futures, f)
	e.Metrics.DeadLettered(reason)
	e.Dirty.Store(true)
	return futures, nil
}
