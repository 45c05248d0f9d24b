package deliver

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
)

// refreshEvery bounds how often a worker whose endpoint is in a failure streak reads its
// state from the bucket (mode).
const refreshEvery = 50 * time.Millisecond

// probeTimeout is how long a half-open probe may stay with a silent replica before another
// replica takes it over.
func probeTimeout(c *endpoint.Config) time.Duration { return c.Timeout + 10*time.Second }

// mode decides what the worker may do now, and when to look again.
func (w *Worker) mode(ctx context.Context) (mode, time.Duration) {
	c := w.cfg.Load()
	if c == nil || c.Suspend && !c.Deleting {
		return modePaused, time.Minute
	}
	if c.Deleting {
		return modeRun, time.Minute // dead-letter what is still queued for it (retire)
	}
	if c.SingleActive() && !w.env.Holds(w.name) {
		return modePaused, time.Minute // a lease change wakes the worker
	}
	now := time.Now()
	if disabled, needsSync := w.env.Health.Fast(w.name); disabled {
		return modeRun, time.Minute // dead-letter what arrives, quickly
	} else if !needsSync && !w.env.Health.Ramping(w.name, c.Policy, now) {
		if w.ramped.Load() {
			w.applyLimits(c, w.env.Health.Snapshot(w.name)) // the ramp is over: full speed
		}
		return modeRun, time.Minute // closed circuit, no failure streak: the common case, lock-free
	}
	// A failure streak or a circuit that is not closed: what another replica changed matters
	// at once (it may have opened the circuit), and the polled watch may not have brought it.
	// Read it, at most every refreshEvery (a failing endpoint's attempts do not each cost a
	// read).
	if now.UnixNano()-w.refreshed.Load() >= int64(refreshEvery) {
		if err := w.env.Health.Refresh(ctx, w.name); err != nil {
			return modePaused, time.Second
		}
		w.refreshed.Store(now.UnixNano())
	}
	st := w.env.Health.Snapshot(w.name)
	switch st.CircuitState() {
	case v1alpha1.CircuitOpen:
		due := st.OpenedAt.Add(c.Policy.Circuit.OpenDuration)
		if now.Before(due) {
			return modePaused, due.Sub(now)
		}
		st2, err := w.env.Health.Change(ctx, w.name, func(s *state.State, now time.Time) []state.Transition {
			return s.TryHalfOpen(c.Policy, w.env.Identity, now, probeTimeout(c))
		})
		if err != nil {
			return modePaused, time.Second
		}
		if st2.CircuitState() == v1alpha1.CircuitHalfOpen && st2.ProbeOwner == w.env.Identity {
			return modeProbe, 0
		}
		return modePaused, time.Second
	case v1alpha1.CircuitHalfOpen:
		if st.ProbeOwner == w.env.Identity {
			return modeProbe, 0
		}
		if now.After(st.ProbeAt.Add(probeTimeout(c))) {
			st2, err := w.env.Health.Change(ctx, w.name, func(s *state.State, now time.Time) []state.Transition {
				return s.TryHalfOpen(c.Policy, w.env.Identity, now, probeTimeout(c))
			})
			if err == nil && st2.ProbeOwner == w.env.Identity {
				return modeProbe, 0
			}
		}
		return modePaused, time.Second
	}
	if state.RampFactor(&st, c.Policy, now) < 1 {
		w.applyLimits(c, st)
		return modeRun, 500 * time.Millisecond
	}
	if w.ramped.Load() {
		w.applyLimits(c, st)
	}
	return modeRun, time.Minute
}

// runMsg delivers one message, retrying in place while its retries are held here (short waits,
// and every retry of a PerKey endpoint so nothing of its key overtakes it). While it waits, the
// message is kept alive (in progress) and holds no concurrency slot. Each attempt waits for the
// endpoint's gate: running, or holding the one probe of a half-open circuit. A best-effort
// delivery held while the circuit opens is handed to a message schedule instead, so it does not
// occupy the consumer.
func (w *Worker) runMsg(ctx context.Context, msg jetstream.Msg) {
	w.active.Add(1)
	defer w.active.Add(-1)
	var held *heldRetry
	if c := w.cfg.Load(); c != nil && c.Deleting {
		// Dead-lettered without a request: nothing waits for a slot, a token or the lease.
		w.attempt(ctx, msg, nil)
		return
	}
	for {
		probe, ok := w.gate(ctx, msg, held)
		if !ok {
			return
		}
		if !w.acquireSlot(ctx, msg) {
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
		if c := w.cfg.Load(); c != nil && c.SingleActive() && !w.env.Holds(w.name) {
			// The partition moved while this waited for a slot or a token: its new holder
			// sends it (one token bucket, one request per key), not this replica.
			w.slots.release()
			w.releaseProbe(probe)
			_ = msg.Nak()
			return
		}
		held = w.attempt(ctx, msg, held)
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
func (w *Worker) gate(ctx context.Context, msg jetstream.Msg, held *heldRetry) (probe, ok bool) {
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
				w.Metrics.Retried()
				_ = msg.Ack()
				return false, false
			}
		}
		c := w.cfg.Load()
		if held == nil && m == modePaused && (c == nil || !c.PerKey) {
			// Not attempted here yet and nothing to keep in order: hand it back rather than
			// hold it (and the consumer's MaxAckPending with it) while the circuit is open,
			// another replica probes or the endpoint is suspended. It comes back to whoever
			// takes it next: a probe, a holding worker, or this one resuming.
			_ = msg.NakWithDelay(time.Second)
			return false, false
		}
		if c != nil && !c.Deleting && !c.Suspend && c.SingleActive() && !w.env.Holds(w.name) {
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

func (w *Worker) releaseProbe(probe bool) {
	if probe {
		w.probeBusy.Store(false)
		w.Wake()
	}
}

// waitToken waits for the rate limiter, keeping msg alive meanwhile.
func (w *Worker) waitToken(ctx context.Context, msg jetstream.Msg) error {
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

// acquireSlot waits for a concurrency slot, telling JetStream meanwhile that the message is
// still being worked on; false when ctx ended first.
func (w *Worker) acquireSlot(ctx context.Context, msg jetstream.Msg) bool {
	if w.slots.tryAcquire() {
		return true
	}
	every := (w.cfg.Load().Timeout + 15*time.Second) / 3
	for {
		wctx, cancel := context.WithTimeout(ctx, every)
		ok := w.slots.acquire(wctx)
		cancel()
		if ok {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		_ = msg.InProgress()
	}
}

// holdFor waits d, telling JetStream the message is still being worked on.
func (w *Worker) holdFor(ctx context.Context, msg jetstream.Msg, d time.Duration) bool {
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

// slots is a semaphore whose size can change while held.
type slots struct {
	mu    sync.Mutex
	cond  *sync.Cond
	limit int
	used  int
}

func newSlots(limit int) *slots {
	s := &slots{limit: limit}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *slots) setLimit(n int) {
	s.mu.Lock()
	s.limit = n
	s.mu.Unlock()
	s.cond.Broadcast()
}

// tryAcquire takes a slot if one is free.
func (s *slots) tryAcquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used < s.limit {
		s.used++
		return true
	}
	return false
}

// acquire waits for a slot; false when ctx ended first.
func (s *slots) acquire(ctx context.Context) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used < s.limit {
		s.used++
		return true
	}
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	for s.used >= s.limit {
		if ctx.Err() != nil {
			return false
		}
		s.cond.Wait()
	}
	s.used++
	return true
}

func (s *slots) release() {
	s.mu.Lock()
	s.used--
	s.mu.Unlock()
	s.cond.Signal()
}
