package state

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
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Store keeps every endpoint's State in step with the key-value bucket: a polled watch (Watch)
// and every compare-and-set conflict bring other replicas' writes in, changes go out by
// compare-and-set (Change). Reads on the delivery path (Fast, Ramping) take no lock. What a
// change or another replica's write means (a status write, a worker's wake-up...) is returned
// to the caller (Update, Seen), never carried out here.
type Store struct {
	kv jetstream.KeyValue
	// namespace names the operational events every change queues in its outbox.
	namespace string
	// newsWindow is the least time between two delivery.dead_lettered events of an endpoint.
	newsWindow time.Duration
	log        logr.Logger

	mu      sync.RWMutex // guards entries (the map); each entry has its own lock
	entries map[string]*entry
}

// Seen says what reading an endpoint's state from the bucket found: another replica's change
// (Changed: in what the workers act on or in its counts), and whether its circuit or disabled
// state changed with it (Transition: a status to write at once).
type Seen struct{ Changed, Transition bool }

// An Update is what happened to an endpoint's state, for the caller to carry out: another
// replica's change found on the way (Seen) and, when Made, this replica's own change: the
// state it wrote and the transitions it caused (perhaps none).
type Update struct {
	Seen        Seen
	Made        bool
	State       State
	Transitions []Transition
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
	flagNews                  // operational events or dead-letter news wait (report.Announcer)
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

// NewStore keeps the states of the bucket kv. Every change queues its operational events in
// the state's outbox, as events of namespace: the transitions', and the dead letters' a fold
// reports (TakeNews), at most one event per newsWindow (DeadLetterNewsWindow when 0); log says
// when the outbox overflows.
func NewStore(kv jetstream.KeyValue, namespace string, newsWindow time.Duration, log logr.Logger) *Store {
	if newsWindow <= 0 {
		newsWindow = DeadLetterNewsWindow
	}
	return &Store{kv: kv, namespace: namespace, newsWindow: newsWindow, log: log, entries: map[string]*entry{}}
}

// NewsDue reports whether an endpoint's dead-letter news wait past their window.
func (h *Store) NewsDue(s *State, now time.Time) bool { return s.NewsDue(now, h.newsWindow) }

// HasNews reports, without locks, whether an endpoint's operational events wait.
func (h *Store) HasNews(ep string) bool {
	e := h.known(ep)
	return e != nil && e.flags.Load()&flagNews != 0
}

// known is an endpoint's entry, nil when none was made: reads take an endpoint without one
// for the zero State, so an idle endpoint whose state was never read or changed costs none.
func (h *Store) known(ep string) *entry {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.entries[ep]
}

// entry is an endpoint's entry, made when missing.
func (h *Store) entry(ep string) *entry {
	if e := h.known(ep); e != nil {
		return e
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.entries[ep]
	if e == nil {
		e = &entry{}
		h.entries[ep] = e
	}
	return e
}

// Snapshot returns the latest known state of an endpoint.
func (h *Store) Snapshot(ep string) State {
	e := h.known(ep)
	if e == nil {
		return State{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return cloneState(e.state)
}

// Fast reports, without locks, whether an endpoint is disabled and whether its successes must
// be written at once (a failure streak or a circuit that is not closed).
func (h *Store) Fast(ep string) (disabled, needsSync bool) {
	e := h.known(ep)
	if e == nil {
		return false, false
	}
	f := e.flags.Load()
	return f&flagDisabled != 0, f&flagNeedsSync != 0
}

// Ramping reports, without locks, whether the endpoint is still ramping up after its circuit
// closed.
func (h *Store) Ramping(ep string, p policy.Policy, now time.Time) bool {
	e := h.known(ep)
	if e == nil {
		return false
	}
	c := e.closedAt.Load()
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

// Change changes an endpoint's state by compare-and-set with fn and returns the Update: the
// state written, the transitions fn returned and another replica's change found on the way,
// which the caller carries out (health.Health). fn may run more than once (on a conflict it
// runs again on the newer state).
//
// Changes of one endpoint are group-committed: while one compare-and-set is in flight, others
// queue, and the next write applies them all, in order. A failing endpoint with a hundred
// deliveries in flight thus costs a few writes, not a hundred racing compare-and-sets. A
// commit outlives a caller whose ctx ends (it is bounded by commitTimeout), and the caller
// waits for it: what it returns must still be carried out.
func (h *Store) Change(ctx context.Context, ep string, fn func(s *State, now time.Time) []Transition) (Update, error) {
	e := h.entry(ep)
	o := &op{fn: fn, done: make(chan result, 1)}
	e.opsMu.Lock()
	e.ops = append(e.ops, o)
	if e.committing {
		e.opsMu.Unlock()
		r := <-o.done
		return r.update, r.err
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
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
		trs, st, seen, err := h.commit(cctx, ep, e, batch)
		cancel()
		for i, o := range batch {
			u := Update{Seen: seen, State: st}
			if err == nil {
				u.Made, u.Transitions = true, trs[i]
			}
			o.done <- result{update: u, err: err}
		}
	}
	r := <-o.done
	return r.update, r.err
}

// commitTimeout bounds one group commit, its retries included.
const commitTimeout = 10 * time.Second

// op is one queued change of an endpoint's state.
type op struct {
	fn   func(s *State, now time.Time) []Transition
	done chan result
}

type result struct {
	update Update
	err    error
}

// commit applies a batch of changes in one compare-and-set, retrying on conflicts.
// seen says what the re-reads after a conflict found of other replicas' changes.
func (h *Store) commit(ctx context.Context, ep string, e *entry, batch []*op) (trs [][]Transition, s State, seen Seen, err error) {
	key := streams.HealthKey(ep)
	for try := 0; ; try++ {
		e.mu.Lock()
		rev := e.rev
		s = cloneState(e.state)
		e.mu.Unlock()

		now := time.Now()
		trs = make([][]Transition, len(batch))
		for i, o := range batch {
			trs[i] = o.fn(&s, now)
			h.queueTransitions(ep, &s, trs[i], now)
		}
		b, err := json.Marshal(&s)
		if err != nil {
			return nil, s, seen, err
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
			return trs, s, seen, nil
		}
		if try >= 20 || ctx.Err() != nil {
			return nil, s, seen, fmt.Errorf("updating health of %s: %w", ep, err)
		}
		// Someone else wrote first (or the key exists already): read the latest and retry.
		found, err := h.Refresh(ctx, ep)
		seen.Changed, seen.Transition = seen.Changed || found.Changed, seen.Transition || found.Transition
		if err != nil {
			return nil, s, seen, err
		}
	}
}

// Refresh reads an endpoint's state from the bucket; Seen says whether another replica had
// changed it (before the watch brings the change).
func (h *Store) Refresh(ctx context.Context, ep string) (Seen, error) {
	entry, err := h.kv.Get(ctx, streams.HealthKey(ep))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		e := h.entry(ep)
		e.mu.Lock()
		e.setState(0, State{})
		e.mu.Unlock()
		return Seen{}, nil
	}
	if err != nil {
		return Seen{}, err
	}
	return h.set(ep, entry.Revision(), entry.Value()), nil
}

// set installs a state read from the bucket, newer than the one known, and says how it
// differs.
func (h *Store) set(ep string, rev uint64, value []byte) (seen Seen) {
	var s State
	if err := json.Unmarshal(value, &s); err != nil {
		return Seen{}
	}
	e := h.entry(ep)
	e.mu.Lock()
	if rev > e.rev {
		old := e.state
		e.setState(rev, s)
		seen.Transition = old.CircuitState() != s.CircuitState() || old.DisabledSince != s.DisabledSince
		// Counts folded by another replica change the status too.
		seen.Changed = seen.Transition || old.Circuit != s.Circuit || old.ProbeOwner != s.ProbeOwner || old.Consecutive != s.Consecutive ||
			old.Folded != s.Folded
	}
	e.mu.Unlock()
	return seen
}

// watchPoll is how often Watch reads the bucket for other replicas' changes.
const watchPoll = 250 * time.Millisecond

// Watch follows the bucket's health keys until ctx ends (follow.Keys: polled direct gets, no
// consumer); seen is told of every other replica's change it brings.
func (h *Store) Watch(ctx context.Context, js jetstream.JetStream, seen func(ep string, s Seen)) error {
	return follow.Keys(ctx, js, h.kv.Bucket(), streams.HealthKeyPrefix, watchPoll, func(key string, m streamread.Msg, deleted bool) {
		if deleted {
			return
		}
		ep := streams.EndpointName(key)
		if s := h.set(ep, m.Seq, m.Data); s.Changed {
			seen(ep, s)
		}
	}, func() {})
}

// Forget drops an endpoint's state (it was deleted).
func (h *Store) Forget(ep string) {
	h.mu.Lock()
	delete(h.entries, ep)
	h.mu.Unlock()
}

// queueTransitions queues the operational events of transitions trs in s's outbox.
func (h *Store) queueTransitions(ep string, s *State, trs []Transition, now time.Time) {
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

// TakeNews queues in s's outbox the delivery.dead_lettered event of the dead letters waiting
// (with n, perhaps nil) when its window has ended. It is called within a change (fn of Change).
func (h *Store) TakeNews(ep string, s *State, n *counts.DeadLetterNews, now time.Time) {
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
