package dispatcher

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/match"
	"github.com/webhook-operator/webhook-operator/internal/plugin/jsread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
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
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	namespaces := []string{d.namespace}
	if d.cfg.AllowCrossNamespaceSources {
		namespaces = streams.SourceNamespaces(d.namespace, c.Sources)
	}
	routed := 0
	for _, ns := range namespaces {
		routed += d.backfillFrom(ctx, d.cfg.Streams.For(ns).EventsStream(), ep, c, since)
	}
	if routed > 0 {
		d.log.Info("backfilled events published before the endpoint was loaded", "endpoint", ep, "events", routed)
	}
}

// backfillFrom writes ep's deliveries of the events of one events stream published since.
// It reads stored events (direct gets by time, then by sequence) instead of creating a
// consumer: a tenant's bus identity may create none.
func (d *Dispatcher) backfillFrom(ctx context.Context, stream, ep string, c *endpointConfig, since time.Time) (routed int) {
	st, err := jsread.Open(ctx, d.nc, d.js, stream)
	if err != nil {
		d.log.V(1).Info("backfill: events stream", "endpoint", ep, "stream", stream, "error", err.Error())
		return 0
	}
	last := st.LastSeq
	msgs, err := st.ForwardFrom(ctx, ">", since, backfillBatch)
	for err == nil && ctx.Err() == nil && len(msgs) > 0 {
		done := false
		var futures []jetstream.PubAckFuture
		for _, m := range msgs {
			msg := storedMsg{m: m, stream: stream}
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
				return routed
			}
			futures = append(futures, fs...)
			routed++
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case <-f.Err():
			case <-ctx.Done():
				return routed
			}
		}
		if done {
			break
		}
		msgs, err = st.Forward(ctx, ">", msgs[len(msgs)-1].Seq+1, backfillBatch)
	}
	if err != nil && !errors.Is(err, jsread.ErrNotFound) {
		d.log.V(1).Info("backfill: reading events", "endpoint", ep, "stream", stream, "error", err.Error())
	}
	return routed
}

// backfillBatch is how many events one read returns at most.
const backfillBatch = 500

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
