package deliver

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
)

// limits pace a worker's attempts: its concurrency (slots, this replica's share of the
// endpoint's maxInFlight, for every consumer of the endpoint), its rate (a token bucket), the
// one probe of a half-open circuit, and the ramp-up after the circuit closed.
type limits struct {
	slots slots
	// share is the share of maxInFlight the slots were last sized for.
	share atomic.Int64
	// limiter is made when a rate is first set (most endpoints have none).
	limiter atomic.Pointer[rate.Limiter]
	// ramped says the limits are below the configuration: ramping up after the circuit closed.
	ramped atomic.Bool
	// unlimited says the limiter allows any rate, so deliveries need not reserve a token.
	unlimited atomic.Bool
	// probeBusy is the half-open probe token.
	probeBusy atomic.Bool
}

// init readies limits held in place (a worker's, in its struct: thousands of idle endpoints
// make no allocation of their own for them).
func (l *limits) init() {
	l.slots.init(1)
	l.unlimited.Store(true)
}

// apply sets concurrency and rate for configuration c, this replica's share of its
// maxInFlight, and the ramp-up state st describes. A share of 0 leaves one slot: the worker
// delivers nothing meanwhile (leaseMoved), and what waits for a slot gets one and is handed
// back.
func (l *limits) apply(c *endpoint.Config, share int, st state.State, m *metrics.Endpoint) {
	f := state.RampFactor(&st, *c.Policy, time.Now())
	// While limited, the worker's mode keeps calling here, so the full limits come back when
	// the ramp ends.
	l.ramped.Store(f < 1)
	l.share.Store(int64(share))
	conc := max(1, int(math.Ceil(float64(share)*f)))
	l.slots.setLimit(conc)
	m.ConcLimit(float64(min(conc, share)))
	limit, burst := rate.Inf, 1
	if c.RateLimit > 0 {
		// Rate-limited endpoints are delivered by one replica at a time (the holder of the
		// endpoint's partition), so its token bucket is the endpoint's.
		limit, burst = rate.Limit(c.RateLimit), max(1, c.Burst)
	}
	if f < 1 {
		// Slow start after the circuit closes: from 1/s doubling up to ~1000/s over the ramp.
		ramp := rate.Limit(math.Pow(2, 10*f))
		if limit == rate.Inf || ramp < limit {
			limit, burst = ramp, 1
		}
	}
	lim := l.limiter.Load()
	if lim == nil && limit != rate.Inf {
		// Made as it always was (unlimited, then set below), so it starts with one token.
		l.limiter.CompareAndSwap(nil, rate.NewLimiter(rate.Inf, 1))
		lim = l.limiter.Load()
	}
	if limit != rate.Inf {
		l.unlimited.Store(false)
	}
	if lim != nil && (lim.Limit() != limit || lim.Burst() != burst) {
		lim.SetLimit(limit)
		lim.SetBurst(burst)
	}
	l.unlimited.Store(limit == rate.Inf)
	if limit == rate.Inf {
		m.RateLimit(math.Inf(1))
	} else {
		m.RateLimit(float64(limit))
	}
}

// appliedShare is the share the slots were last sized for.
func (l *limits) appliedShare() int { return int(l.share.Load()) }

// waitToken waits for the rate limiter; wait waits a delay (keeping the message alive) and
// reports whether it was not interrupted.
func (l *limits) waitToken(ctx context.Context, wait func(time.Duration) bool) error {
	if l.unlimited.Load() {
		return nil
	}
	lim := l.limiter.Load() // stored before unlimited was first cleared
	if lim == nil {
		return nil
	}
	r := lim.Reserve()
	if !r.OK() {
		return lim.Wait(ctx)
	}
	if d := r.Delay(); d > 0 && !wait(d) {
		r.Cancel()
		return ctx.Err()
	}
	return nil
}

// acquireSlot waits for a concurrency slot, calling alive every so often meanwhile; false when
// ctx ended first.
func (l *limits) acquireSlot(ctx context.Context, every time.Duration, alive func()) bool {
	if l.slots.tryAcquire() {
		return true
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, every)
		ok := l.slots.acquire(wctx)
		cancel()
		if ok {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		alive()
	}
}

// slots is a semaphore whose size can change while held.
type slots struct {
	mu    sync.Mutex
	cond  sync.Cond
	limit int
	used  int
}

// init readies s, held in place, with limit slots.
func (s *slots) init(limit int) {
	s.limit = limit
	s.cond.L = &s.mu
}

// size is the semaphore's size.
func (s *slots) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
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

// inUse is how many slots are taken.
func (s *slots) inUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

func (s *slots) release() {
	s.mu.Lock()
	s.used--
	s.mu.Unlock()
	s.cond.Signal()
}
