package route

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/jsread"
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
// It reads stored events (direct gets by time, then by sequence) instead of creating a
// consumer: a tenant's bus identity may create none.
func (r *Router) backfillFrom(ctx context.Context, stream, ep string, e Endpoint, since time.Time) (routed int) {
	st, err := jsread.Open(ctx, r.JS.Conn(), r.JS, stream)
	if err != nil {
		r.Log.V(1).Info("backfill: events stream", "endpoint", ep, "stream", stream, "error", err.Error())
		return 0
	}
	st.MaxBytes = r.PullBytes // a read holds what a pull may
	last := st.LastSeq
	msgs, err := st.ForwardFrom(ctx, ">", since, backfillBatch)
	for err == nil && ctx.Err() == nil && len(msgs) > 0 {
		done := false
		var futures []jetstream.PubAckFuture
		for _, m := range msgs {
			msg := storedMsg{m: m, stream: stream}
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
		if done {
			break
		}
		msgs, err = st.Forward(ctx, ">", msgs[len(msgs)-1].Seq+1, backfillBatch)
	}
	if err != nil && !errors.Is(err, jsread.ErrNotFound) {
		r.Log.V(1).Info("backfill: reading events", "endpoint", ep, "stream", stream, "error", err.Error())
	}
	return routed
}

// backfillBatch is how many events one read returns at most.
const backfillBatch = 500

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
