package route

import (
	"context"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/match"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// backfillHorizon bounds how far back a new endpoint's events are looked for. It is within the
// deliveries' de-duplication window, so an event both backfilled and routed live is one delivery.
const backfillHorizon = 5 * time.Minute

// Backfill gives an endpoint that appeared while the dispatcher was running the events
// published since it was created: the router may have handled them before its informer
// reported the endpoint. Deliveries have deterministic ids, so an event the router also
// routes is written once.
//
// allowSources says whether the installation lets endpoints receive other namespaces' events.
func (r *Router) Backfill(ctx context.Context, ep string, e Endpoint, allowSources bool) {
	c := e.Config
	since := c.Created.Add(-2 * time.Second)
	if c.Created.IsZero() || time.Since(since) > backfillHorizon {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	own := r.Names.Namespace()
	namespaces := []string{own}
	if allowSources {
		namespaces = streams.SourceNamespaces(own, c.Sources)
	}
	routed := 0
	for _, ns := range namespaces {
		routed += r.backfillFrom(ctx, r.Streams.For(ns).EventsStream(), ep, e, since)
	}
	if routed > 0 {
		r.Log.Info("backfilled events published before the endpoint was loaded", "endpoint", ep, "events", routed)
	}
}

// backfillFrom writes ep's deliveries of the events of one events stream published since.
func (r *Router) backfillFrom(ctx context.Context, stream, ep string, e Endpoint, since time.Time) (routed int) {
	st, err := r.JS.Stream(ctx, stream)
	if err != nil {
		r.Log.V(1).Info("backfill: events stream", "endpoint", ep, "stream", stream, "error", err.Error())
		return 0
	}
	last := st.CachedInfo().State.LastSeq
	oc, err := r.JS.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since})
	if err != nil {
		r.Log.V(1).Info("backfill: consumer", "endpoint", ep, "stream", stream, "error", err.Error())
		return 0
	}
	for ctx.Err() == nil {
		batch, err := oc.FetchBytes(r.PullBytes, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return routed
		}
		n, done := 0, false
		var futures []jetstream.PubAckFuture
		for msg := range batch.Messages() {
			n++
			ev, ok := parseEvent(msg, r.Streams.EventsSubjectPrefix)
			if !ok {
				continue
			}
			if ev.seq > last {
				done = true
				continue
			}
			if !routes(e.Config, r.Names.Namespace(), ev) {
				continue
			}
			fs, err := r.deliver(ctx, msg, ev, &input{msg: msg, ev: ev}, ep, e, time.Now().UTC())
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
		if n == 0 || done {
			break
		}
	}
	return routed
}

// routes reports whether ev is for endpoint c.
func routes(c *endpoint.Config, ownNamespace string, ev event) bool {
	if ev.namespace != ownNamespace && !slices.Contains(c.Sources, ev.namespace) {
		return false
	}
	if ev.ops && !receivesOps(&ev, ownNamespace, c.Name, c.EventTypes) {
		return false
	}
	for _, p := range c.EventTypes {
		if match.Match(p, ev.eventType) {
			return true
		}
	}
	return false
}
