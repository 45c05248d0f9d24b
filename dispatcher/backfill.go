package dispatcher

import (
	"context"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/match"
)

// backfillHorizon bounds how far back a new endpoint's events are looked for. It is within the
// deliveries' de-duplication window, so an event both backfilled and routed live is one delivery.
const backfillHorizon = 5 * time.Minute

// backfill gives an endpoint that appeared while the dispatcher was running the events
// published since it was created: the router may have handled them before its informer
// reported the endpoint. Deliveries have deterministic ids, so an event the router also
// routes is written once.
func (d *Dispatcher) backfill(ctx context.Context, ep string, c *endpointConfig) {
	since := c.Created.Add(-2 * time.Second)
	if c.Created.IsZero() || time.Since(since) > backfillHorizon || !d.isLeader() {
		return
	}
	names := d.cfg.Streams.Names
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	st, err := d.js.Stream(ctx, names.EventsStream)
	if err != nil {
		d.log.V(1).Info("backfill: events stream", "endpoint", ep, "error", err.Error())
		return
	}
	last := st.CachedInfo().State.LastSeq
	filters := []string{names.EventsFilter(d.namespace)}
	if d.cfg.AllowCrossNamespaceSources {
		for _, src := range c.Sources {
			if src != d.namespace {
				filters = append(filters, names.EventsFilter(src))
			}
		}
	}
	oc, err := d.js.OrderedConsumer(ctx, names.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since})
	if err != nil {
		d.log.V(1).Info("backfill: consumer", "endpoint", ep, "error", err.Error())
		return
	}
	routed := 0
	for ctx.Err() == nil {
		batch, err := oc.Fetch(500, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return
		}
		n, done := 0, false
		var futures []jetstream.PubAckFuture
		for msg := range batch.Messages() {
			n++
			ev, ok := d.parseEvent(msg)
			if !ok {
				continue
			}
			if ev.seq > last {
				done = true
				continue
			}
			if !routes(c, d.namespace, ev) {
				continue
			}
			fs, err := d.writeDelivery(msg, ev, ep, c, time.Now().UTC())
			if err != nil {
				return
			}
			futures = append(futures, fs...)
			routed++
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case <-f.Err():
			case <-ctx.Done():
				return
			}
		}
		if n == 0 || done {
			break
		}
	}
	if routed > 0 {
		d.log.Info("backfilled events published before the endpoint was loaded", "endpoint", ep, "events", routed)
	}
}

// routes reports whether ev is for endpoint c.
func routes(c *endpointConfig, ownNamespace string, ev event) bool {
	if ev.namespace != ownNamespace && !slices.Contains(c.Sources, ev.namespace) {
		return false
	}
	for _, p := range c.EventTypes {
		if match.Match(p, ev.eventType) {
			return true
		}
	}
	return false
}
