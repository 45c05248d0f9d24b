package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/counts"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/follow"
	"github.com/webhook-operator/webhook-operator/internal/jsread"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Store keeps every endpoint's State in step with the key-value bucket: a polled watch (Watch)
// and every compare-and-set conflict feed other replicas' writes in, changes go out by compare-and-set (Change). Reads on the delivery path
// (Fast, Ramping) take no lock.
type Store struct {
	kv jetstream.KeyValue
	// policyOf is an endpoint's retry policy (its window and failure-rate trigger).
	policyOf func(ep string) policy.Policy
	// report is called after this replica changed an endpoint's state, with the transitions
	// the change caused (perhaps none).
	report func(ep string, trs []Transition, st State)
	// remote is called when the watch, or a compare-and-set that lost, saw another replica
	// change an endpoint's state; transition says its circuit or disabled state changed.
	remote func(ep string, transition bool)
	// namespace, when set, makes every change queue its operational events (Announce).
	namespace string
	// newsWindow is the least time between two delivery.dead_lettered events of an endpoint.
	newsWindow time.Duration
	log        logr.Logger

	mu      sync.RWMutex // guards entries (the map); each entry has its own lock
	entries map[string]*entry
}

type entry struct {
	mu    sync.Mutex
	rev   uint64
	state State
	// flags mirrors state for lock-free reads on the delivery path, closedAt the time the
	// circuit last closed (unix nanoseconds).
	flags    atomic.Uint32
	closedAt atomic.Int64

	// opsMu guards the queue of changes waiting for the next group commit.
	opsMu      sync.Mutex
	ops        []*op
	committing bool
}

const (
	flagDisabled  = 1 << iota // the endpoint is disabled
	flagNeedsSync             // a failure streak or a non-closed circuit: successes must be written at once
	flagNews                  // operational events or dead-letter news wait (Announcer)
)

func (e *entry) setState(rev uint64, s State) {
	e.rev, e.state = rev, s
	var f uint32
	if s.Disabled() {
		f |= flagDisabled
	}
	if s.Consecutive > 0 || s.CircuitState() != v1alpha1.CircuitClosed {
		f |= flagNeedsSync
	}
	if len(s.Outbox) > 0 || s.DeadLetterNews != nil {
		f |= flagNews
	}
	e.flags.Store(f)
	if s.ClosedAt.IsZero() {
		e.closedAt.Store(0)
	} else {
		e.closedAt.Store(s.ClosedAt.UnixNano())
	}
}

// NewStore keeps the states of the bucket kv. report and remote say what changed (see Store).
func NewStore(kv jetstream.KeyValue, policyOf func(string) policy.Policy, report func(string, []Transition, State), remote func(string, bool)) *Store {
	return &Store{kv: kv, policyOf: policyOf, report: report, remote: remote, entries: map[string]*entry{}}
}

// Announce makes every change of an endpoint's state queue its operational events (the
// transitions', and the dead letters' a fold reports, at most one event per newsWindow,
// DeadLetterNewsWindow when 0) in the state's outbox, as events of namespace; log says when
// the outbox overflows.
func (h *Store) Announce(namespace string, newsWindow time.Duration, log logr.Logger) *Store {
	if newsWindow <= 0 {
		newsWindow = DeadLetterNewsWindow
	}
	h.namespace, h.newsWindow, h.log = namespace, newsWindow, log
	return h
}

// NewsDue reports whether an endpoint's dead-letter news wait past their window.
func (h *Store) NewsDue(s *State, now time.Time) bool { return s.NewsDue(now, h.newsWindow) }

// HasNews reports, without locks, whether an endpoint's operational events wait.
func (h *Store) HasNews(ep string) bool { return h.entry(ep).flags.Load()&flagNews != 0 }

func (h *Store) entry(ep string) *entry {
	h.mu.RLock()
	e := h.entries[ep]
	h.mu.RUnlock()
	if e != nil {
		return e
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if e = h.entries[ep]; e == nil {
		e = &entry{}
		h.entries[ep] = e
	}
	return e
}

// Snapshot returns the latest known state of an endpoint.
func (h *Store) Snapshot(ep string) State {
	e := h.entry(ep)
	e.mu.Lock()
	defer e.mu.Unlock()
	return cloneState(e.state)
}

// Fast reports, without locks, whether an endpoint is disabled and whether its successes must
// be written at once (a failure streak or a circuit that is not closed).
func (h *Store) Fast(ep string) (disabled, needsSync bool) {
	f := h.entry(ep).flags.Load()
	return f&flagDisabled != 0, f&flagNeedsSync != 0
}

// Ramping reports, without locks, whether the endpoint is still ramping up after its circuit
// closed.
func (h *Store) Ramping(ep string, p policy.Policy, now time.Time) bool {
	c := h.entry(ep).closedAt.Load()
	return c != 0 && p.Circuit.RampUp > 0 && now.UnixNano()-c < int64(p.Circuit.RampUp)
}

// DisabledReason says why an endpoint is disabled, and since when, or false.
func (h *Store) DisabledReason(ep string) (string, bool) {
	if disabled, _ := h.Fast(ep); !disabled {
		return "", false
	}
	st := h.Snapshot(ep)
	return fmt.Sprintf("the endpoint is disabled since %s: %s", st.DisabledSince.UTC().Format(time.RFC3339), st.DisabledReason), true
}

// Change changes an endpoint's state by compare-and-set, then reports the change and the
// transitions fn returned: the one place a state change and its consequences (an Event, the
// metrics, an immediate status write, the worker's wake-up) meet. fn may run more than once
// (on a conflict it runs again on the newer state).
//
// Changes of one endpoint are group-committed: while one compare-and-set is in flight, others
// queue, and the next write applies them all, in order. A failing endpoint with a hundred
// deliveries in flight thus costs a few writes, not a hundred racing compare-and-sets.
func (h *Store) Change(ctx context.Context, ep string, fn func(s *State, now time.Time) []Transition) (State, error) {
	e := h.entry(ep)
	o := &op{fn: fn, done: make(chan result, 1)}
	e.opsMu.Lock()
	e.ops = append(e.ops, o)
	if e.committing {
		e.opsMu.Unlock()
		select {
		case r := <-o.done:
			return r.state, r.err
		case <-ctx.Done():
			return State{}, ctx.Err()
		}
	}
	e.committing = true
	e.opsMu.Unlock()
	for {
		e.opsMu.Lock()
		batch := e.ops
		e.ops = nil
		if len(batch) == 0 {
			e.committing = false
			e.opsMu.Unlock()
			break
		}
		e.opsMu.Unlock()
		// The commit outlives a caller that gives up: others wait on it.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		trs, st, err := h.commit(cctx, ep, e, batch)
		cancel()
		if err == nil && h.report != nil {
			var all []Transition
			for _, t := range trs {
				all = append(all, t...)
			}
			h.report(ep, all, st)
		}
		for _, o := range batch {
			o.done <- result{state: st, err: err}
		}
	}
	r := <-o.done
	return r.state, r.err
}

// op is one queued change of an endpoint's state.
type op struct {
	fn   func(s *State, now time.Time) []Transition
	done chan result
}

type result struct {
	state State
	err   error
}

// commit applies a batch of changes in one compare-and-set, retrying on conflicts.
func (h *Store) commit(ctx context.Context, ep string, e *entry, batch []*op) ([][]Transition, State, error) {
	key := streams.HealthKey(ep)
	for try := 0; ; try++ {
		e.mu.Lock()
		rev := e.rev
		s := cloneState(e.state)
		e.mu.Unlock()

		now := time.Now()
		trs := make([][]Transition, len(batch))
		for i, o := range batch {
			trs[i] = o.fn(&s, now)
			h.queueTransitions(ep, &s, trs[i], now)
		}
		b, err := json.Marshal(&s)
		if err != nil {
			return nil, s, err
		}
		var newRev uint64
		if rev == 0 {
			newRev, err = h.kv.Create(ctx, key, b)
		} else {
			newRev, err = h.kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			e.mu.Lock()
			if newRev > e.rev {
				e.setState(newRev, s)
			}
			e.mu.Unlock()
			return trs, s, nil
		}
		if try >= 20 || ctx.Err() != nil {
			return nil, s, fmt.Errorf("updating health of %s: %w", ep, err)
		}
		// Someone else wrote first (or the key exists already): read the latest and retry.
		if err := h.Refresh(ctx, ep); err != nil {
			return nil, s, err
		}
	}
}

// Refresh reads an endpoint's state from the bucket.
func (h *Store) Refresh(ctx context.Context, ep string) error {
	entry, err := h.kv.Get(ctx, streams.HealthKey(ep))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		e := h.entry(ep)
		e.mu.Lock()
		e.setState(0, State{})
		e.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	// Another replica's change found here (before the watch brings it) wakes the workers too.
	if changed, transition := h.set(ep, entry.Revision(), entry.Value()); changed && h.remote != nil {
		h.remote(ep, transition)
	}
	return nil
}

// set installs a state read from the bucket. changed says it differs in what the workers
// act on or in its counts, transition that its circuit or disabled state differs (a status to
// write at once).
func (h *Store) set(ep string, rev uint64, value []byte) (changed, transition bool) {
	var s State
	if err := json.Unmarshal(value, &s); err != nil {
		return false, false
	}
	e := h.entry(ep)
	e.mu.Lock()
	if rev > e.rev {
		old := e.state
		e.setState(rev, s)
		transition = old.CircuitState() != s.CircuitState() || old.DisabledSince != s.DisabledSince
		// Counts folded by another replica change the status too.
		changed = transition || old.Circuit != s.Circuit || old.ProbeOwner != s.ProbeOwner || old.Consecutive != s.Consecutive ||
			old.Folded != s.Folded
	}
	e.mu.Unlock()
	return changed, transition
}

// watchPoll is how often Watch reads the bucket for other replicas' changes.
const watchPoll = 250 * time.Millisecond

// Watch follows the bucket's health keys until ctx ends (follow.Keys: polled direct gets, no
// consumer).
func (h *Store) Watch(ctx context.Context, js jetstream.JetStream) error {
	return follow.Keys(ctx, js, h.kv.Bucket(), streams.HealthKeyPrefix, watchPoll, func(key string, m jsread.Msg, deleted bool) {
		if deleted {
			return
		}
		ep := streams.EndpointName(key)
		if changed, transition := h.set(ep, m.Seq, m.Data); changed && h.remote != nil {
			h.remote(ep, transition)
		}
	}, func() {})
}

// Forget drops an endpoint's state (it was deleted).
func (h *Store) Forget(ep string) {
	h.mu.Lock()
	delete(h.entries, ep)
	h.mu.Unlock()
}

// FoldedThrough is the delivery-log sequence an endpoint's counts include (FoldTarget).
func (h *Store) FoldedThrough(ctx context.Context, ep string) (uint64, error) {
	if err := h.Refresh(ctx, ep); err != nil {
		return 0, err
	}
	return h.Snapshot(ep).Folded, nil
}

// ApplyFold adds a fold's delta to an endpoint's counts, and evaluates the failure-rate
// trigger when the delta ends a failed delivery (FoldTarget).
func (h *Store) ApplyFold(ctx context.Context, ep string, d *counts.Delta) error {
	p := h.policyOf(ep)
	var overlap bool
	_, err := h.Change(ctx, ep, func(s *State, now time.Time) []Transition {
		if overlap = s.Folded >= d.From; overlap {
			return nil
		}
		s.ApplyFold(d, now, Window(p))
		h.takeNews(ep, s, d.News, now)
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

// queueTransitions queues the operational events of transitions trs in s's outbox.
func (h *Store) queueTransitions(ep string, s *State, trs []Transition, now time.Time) {
	if h.namespace == "" {
		return
	}
	for _, t := range trs {
		if ev, ok := transitionEvent(h.namespace, ep, t, now); ok {
			h.queue(s, ev)
		}
	}
}

func (h *Store) queue(s *State, ev records.OpsEvent) {
	for _, d := range s.queue(ev) {
		h.log.Error(nil, "too many operational events wait to be published: the oldest is dropped (its Kubernetes Event and metrics remain)",
			"endpoint", d.Endpoint, "type", d.Type, "id", d.ID)
	}
}

// takeNews queues the delivery.dead_lettered event of the dead letters waiting (with n) when
// its window has ended.
func (h *Store) takeNews(ep string, s *State, n *counts.DeadLetterNews, now time.Time) {
	if h.namespace == "" {
		return
	}
	if news := s.TakeDeadLetterNews(n, now, h.newsWindow); news != nil {
		h.queue(s, deadLetterEvent(h.namespace, ep, news, now, h.newsWindow))
	}
}

func cloneState(s State) State {
	s.Buckets = append([]bucket(nil), s.Buckets...)
	s.Outbox = append([]records.OpsEvent(nil), s.Outbox...)
	if s.DeadLetterNews != nil {
		n := *s.DeadLetterNews
		n.Sample = append([]counts.DeadLetterRef(nil), n.Sample...)
		n.Reasons = maps.Clone(n.Reasons)
		s.DeadLetterNews = &n
	}
	return s
}

// AddFiltered adds n to an endpoint's count of filtered events (counts.TallyTarget).
func (h *Store) AddFiltered(ctx context.Context, ep string, n int64) error {
	_, err := h.Change(ctx, ep, func(s *State, _ time.Time) []Transition {
		s.Filtered += n
		return nil
	})
	return err
}
