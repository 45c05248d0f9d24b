package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/match"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// routeTable maps an event's namespace and type to the endpoints that receive it. It is built
// on every configuration change and read without locks.
type routeTable struct {
	byNamespace map[string]*match.Index[string]
	// namespaces whose events streams the router reads: its own first, then its sources.
	namespaces []string
	configs    map[string]*endpointConfig
	workers    map[string]*worker
}

func buildRoutes(configs map[string]*endpointConfig, ownNamespace string, allowSources bool) *routeTable {
	t := &routeTable{byNamespace: map[string]*match.Index[string]{}, configs: configs}
	add := func(ns, pattern, ep string) {
		ix := t.byNamespace[ns]
		if ix == nil {
			ix = match.NewIndex[string]()
			t.byNamespace[ns] = ix
		}
		ix.Add(pattern, ep)
	}
	for name, c := range configs {
		if c.Deleting {
			continue
		}
		for _, p := range c.EventTypes {
			add(ownNamespace, p, name)
			if allowSources {
				for _, src := range c.Sources {
					if src != ownNamespace {
						add(src, p, name)
					}
				}
			}
		}
	}
	others := make([]string, 0, len(t.byNamespace))
	for ns := range t.byNamespace {
		others = append(others, ns)
	}
	t.namespaces = streams.SourceNamespaces(ownNamespace, others)
	return t
}

// pendingEvent is an event whose deliveries are being written; it is acknowledged once every
// write is confirmed, in arrival order.
type pendingEvent struct {
	msg     jetstream.Msg
	futures []jetstream.PubAckFuture
	failed  bool
}

// router consumes the events of the namespace (and of its endpoints' source namespaces) and
// writes one delivery per matching endpoint.
type router struct {
	d      *Dispatcher
	settle chan *pendingEvent
}

// run routes until ctx ends: one feed per events stream read, started and stopped as the
// endpoints' source namespaces change.
func (r *router) run(ctx context.Context) error {
	r.settle = make(chan *pendingEvent, 4096)
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		r.settleLoop()
	}()
	var wg sync.WaitGroup
	feeds := map[string]context.CancelFunc{}
	update := func() {
		want := r.d.routes.Load().namespaces
		if len(want) == 0 {
			want = []string{r.d.namespace}
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
func (r *router) consume(ctx context.Context, src string) {
	name := streams.RouterConsumer(r.d.namespace, r.d.dedicated)
	stream := r.d.cfg.Streams.For(src).EventsStream()
	log := r.d.log.WithValues("consumer", name, "stream", stream)
	var cons jetstream.Consumer
	for {
		var err error
		cons, err = r.d.js.Consumer(ctx, stream, name)
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
		jetstream.PullMaxMessages(2000), jetstream.PullExpiry(30*time.Second), jetstream.PullHeartbeat(2*time.Second),
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
	r   *router
	buf []string
}

func (r *router) settleLoop() {
	for p := range r.settle {
		ok := !p.failed
		for _, f := range p.futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				r.d.log.V(1).Info("writing a delivery failed; the event will be routed again", "error", err.Error())
				ok = false
			}
		}
		if ok {
			_ = p.msg.Ack()
		} else {
			_ = p.msg.NakWithDelay(time.Second)
		}
	}
}

// route handles one event (called by the consumer's single delivery goroutine, in order).
func (f *feed) route(ctx context.Context, msg jetstream.Msg) {
	r := f.r
	p := &pendingEvent{msg: msg}
	defer func() {
		select {
		case r.settle <- p:
		case <-ctx.Done():
			_ = msg.Nak()
		}
	}()
	ev, ok := r.d.parseEvent(msg)
	if !ok {
		return
	}
	r.d.metrics.routed.WithLabelValues(r.d.namespace).Inc()
	table := r.d.routes.Load()
	ix := table.byNamespace[ev.namespace]
	if ix == nil {
		return
	}
	f.buf = ix.Lookup(ev.eventType, f.buf[:0])
	now := time.Now().UTC()
	for _, ep := range f.buf {
		c := table.configs[ep]
		if c == nil || c.Deleting {
			continue
		}
		fs, err := r.d.writeDelivery(msg, ev, ep, c, now)
		p.futures = append(p.futures, fs...)
		if err != nil {
			p.failed = true
		}
	}
}

// event is what the router reads from a published event.
type event struct {
	namespace, eventType, eventID string
	// invalid says why the event cannot be delivered, if it cannot.
	invalid   string
	eventTime time.Time
	seq       uint64
}

// parseEvent reads an event's namespace, type, id and time from its subject and headers.
func (d *Dispatcher) parseEvent(msg jetstream.Msg) (event, bool) {
	rest, ok := strings.CutPrefix(msg.Subject(), d.cfg.Streams.EventsSubjectPrefix+".")
	if !ok {
		return event{}, false
	}
	ns, eventType, ok := strings.Cut(rest, ".")
	if !ok || eventType == "" {
		return event{}, false
	}
	md, err := msg.Metadata()
	if err != nil {
		return event{}, false
	}
	ev := event{namespace: ns, eventType: eventType, eventTime: md.Timestamp, seq: md.Sequence.Stream}
	h := msg.Headers()
	ev.eventID = h.Get(records.HeaderMsgID)
	if ev.eventID == "" {
		ev.eventID = fmt.Sprintf("evt_%s_%d", strings.ToLower(md.Stream), md.Sequence.Stream)
	} else {
		ev.invalid = invalidEventID(ev.eventID)
	}
	if v := h.Get(records.HeaderEventTime); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			ev.eventTime = t
		}
	}
	return ev, true
}

// writeDelivery writes the delivery of one event to one endpoint, or its dead letter when it
// cannot be delivered (invalid, too large, endpoint disabled). Writing the same event to the
// same endpoint twice keeps one (the message id is the delivery id).
func (d *Dispatcher) writeDelivery(msg jetstream.Msg, ev event, ep string, c *endpointConfig, now time.Time) ([]jetstream.PubAckFuture, error) {
	names := d.names
	// Event ids are unique per namespace: an event of a source namespace is told apart from
	// one of the same id in this namespace.
	idOf := ev.eventID
	if ev.namespace != d.namespace {
		idOf = ev.namespace + "/" + ev.eventID
	}
	meta := records.DeliveryMeta{
		DeliveryID: records.DeliveryID(idOf, d.namespace, ep), EventID: ev.eventID, EventType: ev.eventType,
		EventTime: ev.eventTime, EventSeq: ev.seq, Namespace: d.namespace, Endpoint: ep, Created: now,
	}
	in := msg.Headers()
	out := &nats.Msg{Subject: names.DeliverySubject(ep), Header: make(nats.Header, len(in)+12)}
	for k, v := range in {
		// Nats-* are JetStream's; Whk-* are the operator's, which a producer may never set
		// (a forged Whk-Test or Whk-Replay-Of would change how the delivery is treated).
		if len(k) > 4 && (strings.EqualFold(k[:5], "nats-") || strings.EqualFold(k[:4], "whk-")) {
			continue
		}
		out.Header[k] = v
	}
	records.SetDeliveryMeta(out.Header, meta)
	out.Data = msg.Data()

	reason, why := "", ""
	switch {
	case ev.invalid != "":
		reason, why = records.ReasonInvalidEvent, ev.invalid
	case len(msg.Data()) > d.cfg.MaxEventBytes:
		reason, why = records.ReasonPayloadTooLarge, fmt.Sprintf("the event is %d bytes; the installation delivers at most %d", len(msg.Data()), d.cfg.MaxEventBytes)
	default:
		if disabled, _ := d.health.fast(ep); disabled {
			st := d.health.snapshot(ep, c.Policy, now)
			reason, why = records.ReasonEndpointDisabled, fmt.Sprintf("the endpoint is disabled since %s: %s", st.DisabledSince.UTC().Format(time.RFC3339), st.DisabledReason)
		}
	}
	if reason == "" {
		out.Header.Set(records.HeaderMsgID, meta.DeliveryID)
		// When too many writes await acknowledgement, wait (backpressure) rather than fail.
		f, err := d.js.PublishMsgAsync(out, jetstream.WithStallWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		d.metrics.fanout.WithLabelValues(d.namespace).Inc()
		if w := d.routes.Load().workers[ep]; w != nil {
			w.dirty.Store(true) // its pending count changed
		}
		return []jetstream.PubAckFuture{f}, nil
	}
	if ev.invalid != "" {
		meta.DeliveryID = records.DeliveryID("invalid:"+strconv.FormatUint(ev.seq, 10), d.namespace, ep)
		records.SetDeliveryMeta(out.Header, meta)
	}
	dl := records.NewDeadLetter(out.Header, reason, why, nil, now)
	f, err := d.js.PublishMsgAsync(records.DeadLetterMsg(names.DeadLetterSubject(ep, meta.DeliveryID), dl, msg.Data()), jetstream.WithStallWait(5*time.Second))
	if err != nil {
		return nil, err
	}
	futures := []jetstream.PubAckFuture{f}
	rec, _ := json.Marshal(records.LogRecord{DeliveryID: meta.DeliveryID, EventID: ev.eventID, EventType: ev.eventType,
		Namespace: d.namespace, Endpoint: ep, State: records.StateDeadLetter, Time: now, Reason: reason,
		DeadLetterReason: reason, Response: records.Response{Error: why}})
	if f, err := d.js.PublishAsync(names.AttemptSubject(ep), rec); err == nil {
		futures = append(futures, f)
	}
	if w := d.worker(ep); w != nil {
		w.metrics.deadLetterReason(reason)
	}
	d.health.addLocal(ep, func(dl *delta) { dl.DeadLettered++ })
	d.markActive(ep)
	return futures, nil
}

// invalidEventID says why an event id cannot be sent as the webhook-id header, or "".
func invalidEventID(id string) string {
	if len(id) > 256 {
		return fmt.Sprintf("the event id is %d characters; at most 256 are allowed", len(id))
	}
	for _, c := range id {
		if c <= ' ' || c > '~' {
			return "the event id must be printable ASCII without spaces"
		}
	}
	return ""
}
