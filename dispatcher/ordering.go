package dispatcher

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// keyQueues serialises deliveries per ordering key: while a key has a delivery in flight or
// retrying, later deliveries of that key wait here, in arrival order; other keys flow.
type keyQueues struct {
	mu   sync.Mutex
	busy map[string][]jetstream.Msg
}

// enqueue returns true when the key was idle and msg should run now.
func (k *keyQueues) enqueue(key string, msg jetstream.Msg) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if q, ok := k.busy[key]; ok {
		k.busy[key] = append(q, msg)
		return false
	}
	k.busy[key] = nil
	return true
}

// next pops the key's next message, or marks the key idle.
func (k *keyQueues) next(key string) (jetstream.Msg, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	q := k.busy[key]
	if len(q) == 0 {
		delete(k.busy, key)
		return nil, false
	}
	m := q[0]
	q[0] = nil
	k.busy[key] = q[1:]
	return m, true
}

// orderingKey extracts a delivery's key from the event's header or JSON body. Deliveries
// without a key are not ordered against anything.
func orderingKey(c *endpointConfig, msg jetstream.Msg) (string, bool) {
	if c.KeyHeader != "" {
		v := msg.Headers().Get(c.KeyHeader)
		return v, v != ""
	}
	if len(c.KeyJSONPath) == 0 {
		return "", false
	}
	var doc any
	if err := json.Unmarshal(msg.Data(), &doc); err != nil {
		return "", false
	}
	for _, p := range c.KeyJSONPath {
		m, ok := doc.(map[string]any)
		if !ok {
			return "", false
		}
		doc = m[p]
	}
	switch v := doc.(type) {
	case string:
		return v, v != ""
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(v), true
	}
	return "", false
}

// enqueueKeyed starts msg now or queues it behind its key.
func (w *worker) enqueueKeyed(ctx context.Context, msg jetstream.Msg) {
	c := w.cfg.Load()
	key, ok := orderingKey(c, msg)
	if !ok {
		w.inflight.Add(1)
		w.d.runners.Go(func() {
			defer w.inflight.Done()
			w.runMsg(ctx, msg)
		})
		return
	}
	if !w.keys.enqueue(key, msg) {
		return
	}
	w.inflight.Add(1)
	w.d.runners.Go(func() {
		defer w.inflight.Done()
		for m := msg; m != nil; {
			w.runMsg(ctx, m)
			next, ok := w.keys.next(key)
			if !ok {
				return
			}
			m = next
		}
	})
}

// runMsg delivers one message, retrying in place while its retries are held here (short waits,
// and every retry of a PerKey endpoint so nothing of its key overtakes it). While it waits, the
// message is kept alive (in progress) and holds no concurrency slot. Each attempt waits for the
// endpoint's gate: running, or holding the one probe of a half-open circuit. A best-effort
// delivery held while the circuit opens is handed to a message schedule instead, so it does not
// occupy the consumer.
func (w *worker) runMsg(ctx context.Context, msg jetstream.Msg) {
	w.active.Add(1)
	defer w.active.Add(-1)
	var held *heldRetry
	for {
		probe, ok := w.gate(ctx, msg, held)
		if !ok {
			return
		}
		if !w.slots.acquire(ctx) {
			w.releaseProbe(probe)
			_ = msg.Nak()
			return
		}
		if err := w.waitToken(ctx, msg); err != nil {
			w.slots.release()
			w.releaseProbe(probe)
			_ = msg.Nak()
			return
		}
		held = w.deliver(ctx, msg, held)
		w.slots.release()
		w.releaseProbe(probe)
		if held == nil {
			return
		}
		if !w.holdFor(ctx, msg, held.wait) {
			_ = msg.Nak()
			return
		}
	}
}

// gate waits until msg may be attempted; probe says it holds the half-open probe. ok is false
// when the message was settled (scheduled) or released (shutdown) meanwhile.
func (w *worker) gate(ctx context.Context, msg jetstream.Msg, held *heldRetry) (probe, ok bool) {
	for {
		m, recheck := w.mode(ctx)
		switch {
		case m == modeRun:
			return false, true
		case m == modeProbe && w.probeBusy.CompareAndSwap(false, true):
			return true, true
		}
		if held != nil && !w.cfg.Load().PerKey {
			if err := w.scheduleRetry(ctx, msg, held.meta, time.Now()); err == nil {
				w.metrics.retries.Inc()
				w.d.health.addLocal(w.name, func(d *delta) { d.Scheduled++ })
				_ = msg.Ack()
				return false, false
			}
		}
		if c := w.cfg.Load(); c != nil && !c.Deleting && !c.Suspend && singleActive(c) && !w.d.isLeader() {
			// The lease moved to another replica, which delivers this endpoint from now on.
			// Hand the message back instead of holding it (nothing else would release it):
			// the server gives handed-back messages to the holder first, in the order they
			// were handed back, so a key's events keep their order when this replica still
			// reaches NATS. A PerKey retry held here starts again from its last recorded
			// attempt.
			_ = msg.Nak()
			return false, false
		}
		if !w.holdFor(ctx, msg, min(recheck, time.Second)) {
			_ = msg.Nak()
			return false, false
		}
	}
}

func (w *worker) releaseProbe(probe bool) {
	if probe {
		w.probeBusy.Store(false)
		w.wake()
	}
}

// waitToken waits for the rate limiter, keeping msg alive meanwhile.
func (w *worker) waitToken(ctx context.Context, msg jetstream.Msg) error {
	if w.unlimited.Load() {
		return nil
	}
	r := w.limiter.Reserve()
	if !r.OK() {
		return w.limiter.Wait(ctx)
	}
	if d := r.Delay(); d > 0 && !w.holdFor(ctx, msg, d) {
		r.Cancel()
		return ctx.Err()
	}
	return nil
}

// holdFor waits d, telling JetStream the message is still being worked on.
func (w *worker) holdFor(ctx context.Context, msg jetstream.Msg, d time.Duration) bool {
	c := w.cfg.Load()
	every := (c.Timeout + 15*time.Second) / 3
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return true
		}
		t := time.NewTimer(min(left, every))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
			_ = msg.InProgress()
		}
	}
}
