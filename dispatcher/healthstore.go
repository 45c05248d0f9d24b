package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"

	"github.com/webhook-operator/webhook-operator/internal/plugin/jsread"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// healthStore keeps every endpoint's sharedState in step with the key-value bucket: a watch
// feeds other replicas' writes in, changes go out by compare-and-set, and counts that need no
// coordination (successes on a healthy endpoint) are batched locally and flushed periodically,
// so a healthy endpoint costs no key-value write per delivery.
type healthStore struct {
	kv jetstream.KeyValue
	// onChange is called (without locks held) when an endpoint's shared state changed;
	// transition says its circuit or its disabled state changed.
	onChange func(endpoint string, transition bool)

	mu      sync.RWMutex // guards entries (the map); each entry has its own lock
	entries map[string]*healthEntry
}

type healthEntry struct {
	mu    sync.Mutex
	rev   uint64
	state sharedState
	local delta
	// flags mirrors state for lock-free reads on the delivery path, closedAt the time the
	// circuit last closed (unix nanoseconds).
	flags    atomic.Uint32
	closedAt atomic.Int64

	// opsMu guards the queue of changes waiting for the next group commit.
	opsMu      sync.Mutex
	ops        []*healthOp
	committing bool
}

const (
	flagDisabled  = 1 << iota // the endpoint is disabled
	flagNeedsSync             // a failure streak or a non-closed circuit: successes must be written at once
)

func (e *healthEntry) setState(rev uint64, s sharedState) {
	e.rev, e.state = rev, s
	var f uint32
	if s.disabled() {
		f |= flagDisabled
	}
	if s.Consecutive > 0 || s.circuit() != v1alpha1.CircuitClosed {
		f |= flagNeedsSync
	}
	e.flags.Store(f)
	if s.ClosedAt.IsZero() {
		e.closedAt.Store(0)
	} else {
		e.closedAt.Store(s.ClosedAt.UnixNano())
	}
}

func newHealthStore(kv jetstream.KeyValue, onChange func(string, bool)) *healthStore {
	return &healthStore{kv: kv, onChange: onChange, entries: map[string]*healthEntry{}}
}

func (h *healthStore) entry(ep string) *healthEntry {
	h.mu.RLock()
	e := h.entries[ep]
	h.mu.RUnlock()
	if e != nil {
		return e
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if e = h.entries[ep]; e == nil {
		e = &healthEntry{}
		h.entries[ep] = e
	}
	return e
}

// snapshot returns the latest known shared state of an endpoint, local counts included.
func (h *healthStore) snapshot(ep string, p policy.Policy, now time.Time) sharedState {
	e := h.entry(ep)
	e.mu.Lock()
	s := cloneState(e.state)
	local := e.local
	e.mu.Unlock()
	s.apply(local, now, healthWindow(p))
	return s
}

// fast reports, without locks, whether an endpoint is disabled and whether its successes must
// be written at once (a failure streak or a circuit that is not closed).
func (h *healthStore) fast(ep string) (disabled, needsSync bool) {
	f := h.entry(ep).flags.Load()
	return f&flagDisabled != 0, f&flagNeedsSync != 0
}

// ramping reports, without locks, whether the endpoint is still ramping up after its circuit
// closed.
func (h *healthStore) ramping(ep string, p policy.Policy, now time.Time) bool {
	c := h.entry(ep).closedAt.Load()
	return c != 0 && p.Circuit.RampUp > 0 && now.UnixNano()-c < int64(p.Circuit.RampUp)
}

// addLocal records counts that need no coordination; they reach the bucket at the next flush.
func (h *healthStore) addLocal(ep string, fn func(d *delta)) {
	e := h.entry(ep)
	e.mu.Lock()
	fn(&e.local)
	e.mu.Unlock()
}

// update changes an endpoint's shared state by compare-and-set, folding in the local counts,
// and returns the transitions fn reported and the new state.
//
// Updates of one endpoint are group-committed: while one compare-and-set is in flight, others
// queue, and the next write applies them all, in order. A failing endpoint with a hundred
// deliveries in flight thus costs a few writes, not a hundred racing compare-and-sets.
func (h *healthStore) update(ctx context.Context, ep string, p policy.Policy, fn func(s *sharedState, now time.Time) []transition) ([]transition, sharedState, error) {
	e := h.entry(ep)
	op := &healthOp{fn: fn, policy: p, done: make(chan healthResult, 1)}
	e.opsMu.Lock()
	e.ops = append(e.ops, op)
	if e.committing {
		e.opsMu.Unlock()
		select {
		case r := <-op.done:
			return r.tr, r.state, r.err
		case <-ctx.Done():
			return nil, sharedState{}, ctx.Err()
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
		for i, o := range batch {
			r := healthResult{state: st, err: err}
			if err == nil {
				r.tr = trs[i]
			}
			o.done <- r
		}
	}
	r := <-op.done
	return r.tr, r.state, r.err
}

// healthOp is one queued change of an endpoint's shared state.
type healthOp struct {
	fn     func(s *sharedState, now time.Time) []transition
	policy policy.Policy
	done   chan healthResult
}

type healthResult struct {
	tr    []transition
	state sharedState
	err   error
}

// commit applies a batch of changes in one compare-and-set, retrying on conflicts.
func (h *healthStore) commit(ctx context.Context, ep string, e *healthEntry, batch []*healthOp) ([][]transition, sharedState, error) {
	key := streams.HealthKey(ep)
	window := healthWindow(batch[len(batch)-1].policy)
	for try := 0; ; try++ {
		e.mu.Lock()
		rev := e.rev
		s := cloneState(e.state)
		local := e.local
		e.mu.Unlock()

		now := time.Now()
		s.apply(local, now, window)
		trs := make([][]transition, len(batch))
		changed := false
		for i, o := range batch {
			if o.fn != nil {
				trs[i] = o.fn(&s, now)
				changed = changed || len(trs[i]) > 0
			}
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
			e.local = subtractDelta(e.local, local)
			e.mu.Unlock()
			if changed && h.onChange != nil {
				h.onChange(ep, true)
			}
			return trs, s, nil
		}
		if try >= 20 || ctx.Err() != nil {
			return nil, s, fmt.Errorf("updating health of %s: %w", ep, err)
		}
		// Someone else wrote first (or the key exists already): read the latest and retry.
		if err := h.refresh(ctx, ep); err != nil {
			return nil, s, err
		}
	}
}

// refresh reads an endpoint's state from the bucket.
func (h *healthStore) refresh(ctx context.Context, ep string) error {
	entry, err := h.kv.Get(ctx, streams.HealthKey(ep))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		e := h.entry(ep)
		e.mu.Lock()
		e.setState(0, sharedState{})
		e.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	// Another replica's change found here (before the watch brings it) wakes the workers too.
	if changed, transition := h.set(ep, entry.Revision(), entry.Value()); changed && h.onChange != nil {
		h.onChange(ep, transition)
	}
	return nil
}

// set installs a state read from the bucket. changed says it differs in what the workers
// act on, transition that its circuit or disabled state differs (a status to write at once).
func (h *healthStore) set(ep string, rev uint64, value []byte) (changed, transition bool) {
	var s sharedState
	if err := json.Unmarshal(value, &s); err != nil {
		return false, false
	}
	e := h.entry(ep)
	e.mu.Lock()
	if rev > e.rev {
		old := e.state
		e.setState(rev, s)
		transition = old.circuit() != s.circuit() || old.DisabledSince != s.DisabledSince
		changed = transition || old.Circuit != s.Circuit || old.ProbeOwner != s.ProbeOwner || old.Consecutive != s.Consecutive
	}
	e.mu.Unlock()
	return changed, transition
}

// healthPoll is how often watch reads the bucket for other replicas' changes.
const healthPoll = 250 * time.Millisecond

// watch follows the bucket's health keys until ctx ends. It reads the bucket's stream from
// where it left off (direct gets, every healthPoll) rather than watching the bucket: a watch
// creates a push consumer, which a tenant's bus identity may not (its deliver subject could
// name anything in the account).
func (h *healthStore) watch(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
	bucket := h.kv.Bucket()
	st, err := jsread.Open(ctx, nc, js, "KV_"+bucket)
	if err != nil {
		return err
	}
	keys := "$KV." + bucket + "."
	filter := keys + streams.HealthKeyPrefix + ">"
	next := uint64(1)
	for {
		msgs, err := st.Forward(ctx, filter, next, 256)
		if err != nil && ctx.Err() == nil {
			return err
		}
		for _, m := range msgs {
			next = m.Seq + 1
			if m.Header.Get(kvOperationHeader) != "" {
				continue // a delete or purge
			}
			ep := streams.EndpointName(strings.TrimPrefix(m.Subject, keys+streams.HealthKeyPrefix))
			if changed, transition := h.set(ep, m.Seq, m.Data); changed && h.onChange != nil {
				h.onChange(ep, transition)
			}
		}
		if len(msgs) == 256 {
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(healthPoll):
		}
	}
}

// kvOperationHeader marks a key-value delete or purge.
const kvOperationHeader = "KV-Operation"

// flush writes every endpoint's pending local counts.
func (h *healthStore) flush(ctx context.Context, policyOf func(ep string) (policy.Policy, bool)) {
	h.mu.RLock()
	var eps []string
	for ep, e := range h.entries {
		e.mu.Lock()
		if !e.local.empty() {
			eps = append(eps, ep)
		}
		e.mu.Unlock()
	}
	h.mu.RUnlock()
	for _, ep := range eps {
		p, ok := policyOf(ep)
		if !ok {
			p = policy.Default()
		}
		_, _, _ = h.update(ctx, ep, p, nil)
	}
}

// forget drops an endpoint's local state (it was deleted).
func (h *healthStore) forget(ep string) {
	h.mu.Lock()
	delete(h.entries, ep)
	h.mu.Unlock()
}

func subtractDelta(a, b delta) delta {
	a.Attempts -= b.Attempts
	a.Failures -= b.Failures
	a.Completed -= b.Completed
	a.Failed -= b.Failed
	a.Delivered -= b.Delivered
	a.DeadLettered -= b.DeadLettered
	a.Scheduled -= b.Scheduled
	if !a.LastSuccess.After(b.LastSuccess) {
		a.LastSuccess = time.Time{}
	}
	if a.LastFailure == b.LastFailure {
		a.LastFailure = nil
	}
	return a
}

func cloneState(s sharedState) sharedState {
	s.Buckets = append([]bucket(nil), s.Buckets...)
	return s
}
