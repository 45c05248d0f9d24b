package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// healthStore keeps every endpoint's sharedState in step with the key-value bucket: a watch
// feeds other replicas' writes in, changes go out by compare-and-set, and counts that need no
// coordination (successes on a healthy endpoint) are batched locally and flushed periodically,
// so a healthy endpoint costs no key-value write per delivery.
type healthStore struct {
	kv        jetstream.KeyValue
	namespace string
	// onChange is called (without locks held) when an endpoint's shared state changed.
	onChange func(endpoint string)

	mu      sync.Mutex
	entries map[string]*healthEntry
}

type healthEntry struct {
	rev   uint64
	state sharedState
	local delta
}

func newHealthStore(kv jetstream.KeyValue, namespace string, onChange func(string)) *healthStore {
	return &healthStore{kv: kv, namespace: namespace, onChange: onChange, entries: map[string]*healthEntry{}}
}

func (h *healthStore) entry(ep string) *healthEntry {
	e := h.entries[ep]
	if e == nil {
		e = &healthEntry{}
		h.entries[ep] = e
	}
	return e
}

// snapshot returns the latest known shared state of an endpoint, local counts included.
func (h *healthStore) snapshot(ep string, p policy.Policy, now time.Time) sharedState {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.entry(ep)
	s := cloneState(e.state)
	s.apply(e.local, now, healthWindow(p))
	return s
}

// addLocal records counts that need no coordination; they reach the bucket at the next flush.
func (h *healthStore) addLocal(ep string, fn func(d *delta)) {
	h.mu.Lock()
	fn(&h.entry(ep).local)
	h.mu.Unlock()
}

// update changes an endpoint's shared state by compare-and-set, folding in the local counts,
// and returns the transitions fn reported and the new state.
func (h *healthStore) update(ctx context.Context, ep string, p policy.Policy, fn func(s *sharedState, now time.Time) []transition) ([]transition, sharedState, error) {
	key := streams.HealthKey(h.namespace, ep)
	window := healthWindow(p)
	for try := 0; ; try++ {
		h.mu.Lock()
		e := h.entry(ep)
		rev := e.rev
		s := cloneState(e.state)
		local := e.local
		h.mu.Unlock()

		now := time.Now()
		s.apply(local, now, window)
		var tr []transition
		if fn != nil {
			tr = fn(&s, now)
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
			h.mu.Lock()
			e := h.entry(ep)
			if newRev > e.rev {
				e.rev, e.state = newRev, s
			}
			e.local = subtractDelta(e.local, local)
			h.mu.Unlock()
			if len(tr) > 0 && h.onChange != nil {
				h.onChange(ep)
			}
			return tr, s, nil
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
	entry, err := h.kv.Get(ctx, streams.HealthKey(h.namespace, ep))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		h.mu.Lock()
		e := h.entry(ep)
		e.rev, e.state = 0, sharedState{}
		h.mu.Unlock()
		return nil
	}
	if err != nil {
		return err
	}
	h.set(ep, entry.Revision(), entry.Value())
	return nil
}

func (h *healthStore) set(ep string, rev uint64, value []byte) bool {
	var s sharedState
	if err := json.Unmarshal(value, &s); err != nil {
		return false
	}
	h.mu.Lock()
	e := h.entry(ep)
	changed := rev > e.rev
	if changed {
		old := e.state
		e.rev, e.state = rev, s
		changed = old.Circuit != s.Circuit || old.DisabledSince != s.DisabledSince || old.ProbeOwner != s.ProbeOwner || old.Consecutive != s.Consecutive
	}
	h.mu.Unlock()
	return changed
}

// watch follows the bucket's health keys of the namespace until ctx ends.
func (h *healthStore) watch(ctx context.Context) error {
	prefix := "health." + h.namespace + "."
	full, err := h.kv.Watch(ctx, prefix+">")
	if err != nil {
		return err
	}
	defer full.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-full.Updates():
			if !ok {
				return nil
			}
			if u == nil || u.Operation() != jetstream.KeyValuePut {
				continue
			}
			ep := streams.EndpointName(strings.TrimPrefix(u.Key(), prefix))
			if h.set(ep, u.Revision(), u.Value()) && h.onChange != nil {
				h.onChange(ep)
			}
		}
	}
}

// flush writes every endpoint's pending local counts.
func (h *healthStore) flush(ctx context.Context, policyOf func(ep string) (policy.Policy, bool)) {
	h.mu.Lock()
	var eps []string
	for ep, e := range h.entries {
		if !e.local.empty() {
			eps = append(eps, ep)
		}
	}
	h.mu.Unlock()
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
