package report

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/health/counts"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Announcer publishes the operational events waiting in endpoints' outboxes (state.State.Outbox)
// to the namespace's events stream, each with its id as the message id, and then removes them
// from the outbox by compare-and-set. The replica that made a change publishes its events at
// once (Outboxes); the holder of partition 0 also sweeps the served endpoints every Interval,
// publishing what a replica that crashed left behind (a duplicate of what it did publish is
// dropped by JetStream's de-duplication) and the dead-letter news whose window ended.
type Announcer struct {
	JS    jetstream.JetStream
	Names streams.NamespaceNames
	Store NewsStore
	// Outboxes are the endpoints to publish at once.
	Outboxes *Outboxes
	// Endpoints are swept; Leader says whether this replica sweeps.
	Endpoints Endpoints
	Leader    func() bool
	// Interval between sweeps (default 5s).
	Interval time.Duration
	Log      logr.Logger
}

// NewsStore is what the Announcer needs of the endpoints' shared state (health.Health): their
// outboxes and dead-letter news, and Change, whose consequences are carried out.
type NewsStore interface {
	Snapshot(ep string) state.State
	HasNews(ep string) bool
	NewsDue(s *state.State, now time.Time) bool
	TakeNews(ep string, s *state.State, n *counts.DeadLetterNews, now time.Time)
	Change(ctx context.Context, ep string, fn func(s *state.State, now time.Time) []state.Transition) (state.State, error)
}

// Outboxes are the endpoints whose outboxes are to be published at once: a change that leaves
// operational events in an endpoint's outbox adds it (health.Health), the Announcer takes them.
type Outboxes struct {
	wake    chan struct{}
	mu      sync.Mutex
	pending map[string]bool
}

// NewOutboxes returns an empty set.
func NewOutboxes() *Outboxes { return &Outboxes{wake: make(chan struct{}, 1)} }

// Add asks for ep's outbox to be published soon.
func (o *Outboxes) Add(ep string) {
	o.mu.Lock()
	if o.pending == nil {
		o.pending = map[string]bool{}
	}
	o.pending[ep] = true
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// take empties the set and returns what it held.
func (o *Outboxes) take() map[string]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	eps := o.pending
	o.pending = nil
	return eps
}

// Run publishes until ctx ends.
func (a *Announcer) Run(ctx context.Context) {
	interval := a.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.Outboxes.wake:
			for ep := range a.Outboxes.take() {
				a.flush(ctx, ep)
			}
		case <-tick.C:
			if a.Leader != nil && !a.Leader() {
				continue
			}
			for _, ep := range a.Endpoints.Names() {
				if a.Store.HasNews(ep) {
					a.flush(ctx, ep)
				}
			}
		}
	}
}

// flush queues ep's dead-letter news whose window ended, publishes its outbox and removes
// what was stored; what could not be is published again by a later flush.
func (a *Announcer) flush(ctx context.Context, ep string) {
	st := a.Store.Snapshot(ep)
	if a.Store.NewsDue(&st, time.Now()) {
		var err error
		st, err = a.Store.Change(ctx, ep, func(s *state.State, now time.Time) []state.Transition {
			a.Store.TakeNews(ep, s, nil, now)
			return nil
		})
		if err != nil {
			a.Log.V(1).Info("queueing dead-letter news", "endpoint", ep, "error", err.Error())
			return
		}
	}
	if len(st.Outbox) == 0 {
		return
	}
	published := map[string]bool{}
	for _, ev := range st.Outbox {
		msg, err := records.OpsEventMessage(a.Names.EventSubject(ev.Type), ev)
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = a.JS.PublishMsg(pctx, msg)
			cancel()
		}
		if err != nil {
			a.Log.Info("publishing an operational event failed; it stays queued", "endpoint", ep, "type", ev.Type, "id", ev.ID, "error", err.Error())
			break
		}
		published[ev.ID] = true
	}
	if len(published) == 0 {
		return
	}
	if _, err := a.Store.Change(ctx, ep, func(s *state.State, _ time.Time) []state.Transition {
		s.Published(published)
		return nil
	}); err != nil {
		a.Log.V(1).Info("removing published operational events; they will be published again (and de-duplicated)", "endpoint", ep, "error", err.Error())
	}
}
