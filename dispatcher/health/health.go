// Package health is a dispatcher's health stage, composed from its parts, each a package with
// one concern:
//
//	state/   each endpoint's shared state in the namespace's bucket (circuit, failure streak,
//	         disable, counts, the outbox of operational events), changed by compare-and-set;
//	         a change returns what it caused (state.Update), never carries it out.
//	leases/  the partitions and their leases: which replica does what only one may.
//	counts/  the fold of the delivery log into counts, the dead letters to announce, the
//	         tally of events the filters rejected.
//	report/  the status writer, the announcer of operational events, Kubernetes Events.
//	follow/  reading a bucket's keys without a consumer (the state's watch, the leases'
//	         members).
//
// Health is the shared state as the rest of the dispatcher uses it (deliver.Health,
// counts.FoldTarget, counts.TallyTarget, report.NewsStore): every change made through it, and
// every change of another replica it finds, is carried out in one place, carryOut.
package health

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/counts"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/report"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/internal/policy"
)

// Health is the endpoints' shared state (a state.Store, whose reads it offers as they are)
// with the consequences of every change carried out: Change, Refresh and Watch shadow the
// store's, which return the consequences instead.
type Health struct {
	*state.Store
	// policyOf is an endpoint's retry policy (its window and failure-rate trigger).
	policyOf  func(ep string) policy.Policy
	endpoints report.Endpoints
	status    *report.StatusWriter
	outboxes  *report.Outboxes
	events    report.Events
}

// New returns the shared state of store, whose changes wake the workers of endpoints and
// update their metrics, mark their status for the status writer, queue their outboxes for the
// announcer and record events. policyOf is an endpoint's retry policy.
func New(store *state.Store, policyOf func(ep string) policy.Policy, endpoints report.Endpoints, status *report.StatusWriter,
	outboxes *report.Outboxes, events report.Events) *Health {
	return &Health{Store: store, policyOf: policyOf, endpoints: endpoints, status: status, outboxes: outboxes, events: events}
}

// Change changes an endpoint's state by compare-and-set (state.Store.Change) and carries out
// what the change caused.
func (h *Health) Change(ctx context.Context, ep string, fn func(s *state.State, now time.Time) []state.Transition) (state.State, error) {
	u, err := h.Store.Change(ctx, ep, fn)
	h.carryOut(ep, u)
	return u.State, err
}

// Refresh reads an endpoint's state from the bucket now, and carries out another replica's
// change it finds.
func (h *Health) Refresh(ctx context.Context, ep string) error {
	seen, err := h.Store.Refresh(ctx, ep)
	h.carryOut(ep, state.Update{Seen: seen})
	return err
}

// Watch follows other replicas' changes until ctx ends, and carries them out.
func (h *Health) Watch(ctx context.Context, js jetstream.JetStream) error {
	return h.Store.Watch(ctx, js, func(ep string, seen state.Seen) { h.carryOut(ep, state.Update{Seen: seen}) })
}

// carryOut carries out what an update of ep's state means; it is the one place this is done.
// Another replica's change makes the endpoint's worker look at its state again and its status
// be written (at once for a transition). This replica's own change does so too, and sets the
// circuit and disabled metrics, has the operational events it queued published at once, and
// records an Event and a log line for each transition.
func (h *Health) carryOut(ep string, u state.Update) {
	if !u.Seen.Changed && !u.Made {
		return
	}
	sv, served := h.endpoints.Served(ep)
	if u.Seen.Changed {
		h.status.Mark(ep, u.Seen.Transition)
		if served {
			sv.Wake()
		}
	}
	if !u.Made {
		return
	}
	if served {
		sv.Wake()
		circuit := 0.0
		switch u.State.CircuitState() {
		case v1alpha1.CircuitOpen:
			circuit = 2
		case v1alpha1.CircuitHalfOpen:
			circuit = 1
		}
		sv.Metrics.State(circuit, u.State.Disabled())
	}
	h.status.Mark(ep, len(u.Transitions) > 0)
	if len(u.State.Outbox) > 0 {
		h.outboxes.Add(ep)
	}
	h.events.Record(ep, u.Transitions)
}

// FoldedThrough is the delivery-log sequence an endpoint's counts include (counts.FoldTarget).
func (h *Health) FoldedThrough(ctx context.Context, ep string) (uint64, error) {
	if err := h.Refresh(ctx, ep); err != nil {
		return 0, err
	}
	return h.Snapshot(ep).Folded, nil
}

// ApplyFold adds a fold's delta to an endpoint's counts, queues the dead letters to announce,
// and evaluates the failure-rate trigger when the delta ends a failed delivery
// (counts.FoldTarget).
func (h *Health) ApplyFold(ctx context.Context, ep string, d *counts.Delta) error {
	p := h.policyOf(ep)
	var overlap bool
	_, err := h.Change(ctx, ep, func(s *state.State, now time.Time) []state.Transition {
		if overlap = s.Folded >= d.From; overlap {
			return nil
		}
		s.ApplyFold(d, now, state.Window(p))
		h.TakeNews(ep, s, d.News, now)
		if d.FailedDeliveries() {
			return s.OnDeadLetter(p, now)
		}
		return nil
	})
	if err == nil && overlap {
		return counts.ErrFoldOverlap
	}
	return err
}

// AddFiltered adds n to an endpoint's count of filtered events (counts.TallyTarget).
func (h *Health) AddFiltered(ctx context.Context, ep string, n int64) error {
	_, err := h.Change(ctx, ep, func(s *state.State, _ time.Time) []state.Transition {
		s.Filtered += n
		return nil
	})
	return err
}
