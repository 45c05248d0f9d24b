package deliver

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// refreshEvery bounds how often a worker whose endpoint is in a failure streak reads its
// state from the bucket (mode).
const refreshEvery = 50 * time.Millisecond

// probeTimeout is how long a half-open probe may stay with a silent replica before another
// replica takes it over.
func probeTimeout(c *endpoint.Config) time.Duration { return c.Timeout + 10*time.Second }

// mode decides what the worker may do now, and when to look again.
func (w *Worker) mode(ctx context.Context) (decide.Mode, time.Duration) {
	c := w.cfg.Load()
	if c == nil || c.Suspend && !c.Deleting {
		return decide.ModePaused, time.Minute
	}
	if c.Deleting {
		return decide.ModeRun, time.Minute // dead-letter what is still queued for it (retire)
	}
	if w.leaseMoved(c) {
		return decide.ModePaused, time.Minute // a lease change wakes the worker
	}
	now := time.Now()
	if disabled, needsSync := w.f.Health.Fast(w.name); disabled {
		return decide.ModeRun, time.Minute // dead-letter what arrives, quickly
	} else if !needsSync && !w.f.Health.Ramping(w.name, *c.Policy, now) {
		if w.limits.ramped.Load() {
			w.applyLimits(c, w.f.Health.Snapshot(w.name)) // the ramp is over: full speed
		}
		return decide.ModeRun, time.Minute // closed circuit, no failure streak: the common case, lock-free
	}
	// A failure streak or a circuit that is not closed: what another replica changed matters
	// at once (it may have opened the circuit), and the polled watch may not have brought it.
	// Read it, at most every refreshEvery (a failing endpoint's attempts do not each cost a
	// read).
	if now.UnixNano()-w.refreshed.Load() >= int64(refreshEvery) {
		if err := w.f.Health.Refresh(ctx, w.name); err != nil {
			return decide.ModePaused, time.Second
		}
		w.refreshed.Store(now.UnixNano())
	}
	st := w.f.Health.Snapshot(w.name)
	// On the shared lane the holder of the endpoint's partition probes: its park is read
	// there (shareLane).
	prober := c.Lane != streams.LaneShared || w.f.Lease.Holds(w.name)
	switch st.CircuitState() {
	case v1alpha1.CircuitOpen:
		due := st.OpenedAt.Add(c.Policy.Circuit.OpenDuration)
		if now.Before(due) {
			return decide.ModePaused, due.Sub(now)
		}
		if !prober {
			return decide.ModePaused, time.Second
		}
		st2, err := w.f.Health.Change(ctx, w.name, func(s *state.State, now time.Time) []state.Transition {
			return s.TryHalfOpen(*c.Policy, w.f.Settings.Identity, now, probeTimeout(c))
		})
		if err != nil {
			return decide.ModePaused, time.Second
		}
		if st2.CircuitState() == v1alpha1.CircuitHalfOpen && st2.ProbeOwner == w.f.Settings.Identity {
			return decide.ModeProbe, 0
		}
		return decide.ModePaused, time.Second
	case v1alpha1.CircuitHalfOpen:
		if st.ProbeOwner == w.f.Settings.Identity {
			return decide.ModeProbe, 0
		}
		if prober && now.After(st.ProbeAt.Add(probeTimeout(c))) {
			st2, err := w.f.Health.Change(ctx, w.name, func(s *state.State, now time.Time) []state.Transition {
				return s.TryHalfOpen(*c.Policy, w.f.Settings.Identity, now, probeTimeout(c))
			})
			if err == nil && st2.ProbeOwner == w.f.Settings.Identity {
				return decide.ModeProbe, 0
			}
		}
		return decide.ModePaused, time.Second
	}
	if state.RampFactor(&st, *c.Policy, now) < 1 {
		w.applyLimits(c, st)
		return decide.ModeRun, 500 * time.Millisecond
	}
	if w.limits.ramped.Load() {
		w.applyLimits(c, st)
	}
	return decide.ModeRun, time.Minute
}

// runMsg delivers one message, retrying in place while its retries are held here (short waits,
// and every retry of a PerKey endpoint so nothing of its key overtakes it). While it waits, the
// message is kept alive (in progress) and holds no concurrency slot. Each attempt waits for the
// endpoint's gate: running, or holding the one probe of a half-open circuit. A best-effort
// delivery held while the circuit opens is handed to a message schedule instead, so it does not
// occupy the consumer.
func (w *Worker) runMsg(ctx context.Context, msg jetstream.Msg) {
	var held *heldRetry
	for {
		if c := w.cfg.Load(); c != nil && c.Deleting {
			// Dead-lettered without a request (a retry held here with its attempts so far):
			// nothing waits for a slot, a token or the lease.
			w.attempt(ctx, msg, held)
			return
		}
		probe, ok := w.gate(ctx, msg, held)
		if !ok {
			return
		}
		if !w.limits.acquireSlot(ctx, w.aliveEvery(), func() { _ = msg.InProgress() }) {
			w.releaseProbe(probe)
			w.finish(ctx, msg, decide.Release(0))
			return
		}
		if err := w.limits.waitToken(ctx, func(d time.Duration) bool { return w.holdFor(ctx, msg, d) }); err != nil ||
			w.leaseMoved(w.cfg.Load()) {
			// Stopping, or the partition moved while this waited for a slot or a token: its
			// new holder sends it (one token bucket, one request per key), not this replica.
			w.limits.slots.release()
			w.releaseProbe(probe)
			w.finish(ctx, msg, decide.Release(0))
			return
		}
		held = w.attempt(ctx, msg, held)
		w.limits.slots.release()
		w.releaseProbe(probe)
		if held == nil {
			return
		}
		if !w.holdFor(ctx, msg, held.wait) {
			w.finish(ctx, msg, decide.Release(0))
			return
		}
	}
}

// gate waits until msg may be attempted; probe says it holds the half-open probe. ok is false
// when the message was finished (scheduled, handed back) meanwhile, as paused decides.
func (w *Worker) gate(ctx context.Context, msg jetstream.Msg, held *heldRetry) (probe, ok bool) {
	for {
		m, recheck := w.mode(ctx)
		switch {
		case m == decide.ModeRun:
			return false, true
		case m == decide.ModeProbe && w.limits.probeBusy.CompareAndSwap(false, true):
			return true, true
		}
		c := w.cfg.Load()
		var delivery *records.DeliveryMeta
		if held != nil {
			delivery = &held.meta
		}
		if v, wait := decide.Paused(c, m, delivery, w.leaseMoved(c)); !wait {
			w.finish(ctx, msg, v)
			return false, false
		}
		if !w.holdFor(ctx, msg, min(recheck, time.Second)) {
			w.finish(ctx, msg, decide.Release(0))
			return false, false
		}
	}
}

func (w *Worker) releaseProbe(probe bool) {
	if probe {
		w.limits.probeBusy.Store(false)
		w.Wake()
	}
}

// aliveEvery is how often a message waiting here is reported in progress, well within the
// consumer's AckWait.
func (w *Worker) aliveEvery() time.Duration {
	return (w.cfg.Load().Timeout + 15*time.Second) / 3
}

// holdFor waits d, telling JetStream the message is still being worked on. The wait ends early
// (true) once the endpoint is being deleted: what is left for it is dead-lettered at once, not
// after a retry's wait of hours. It returns false when ctx ended.
func (w *Worker) holdFor(ctx context.Context, msg jetstream.Msg, d time.Duration) bool {
	every := w.aliveEvery()
	deadline := time.Now().Add(d)
	changed := w.changes()
	for {
		if c := w.cfg.Load(); c != nil && c.Deleting {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return true
		}
		t := time.NewTimer(min(left, every))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-changed:
			t.Stop()
			changed = w.changes()
		case <-t.C:
			_ = msg.InProgress()
		}
	}
}
