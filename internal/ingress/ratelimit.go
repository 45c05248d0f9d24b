package ingress

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxLimiters bounds the namespaces whose token buckets a replica keeps; an idle namespace's
// bucket (full again) is forgotten first.
const maxLimiters = 10000

// RateLimiter is one token bucket per namespace: Rate events per second, Burst at once. The
// buckets are this replica's: with n replicas behind a Service a namespace gets up to n times
// Rate (the ingress keeps no shared state, so it scales out as replicas).
type RateLimiter struct {
	Rate  float64
	Burst int
	// Namespace, when set, is a namespace's own rate and burst on this replica (its
	// WebhookQuota's share, quota.RateTable), in place of Rate and Burst; ok false leaves
	// the namespace to them.
	Namespace func(namespace string) (perSecond float64, burst int, ok bool)

	mu       sync.Mutex
	limiters map[string]*rate.Limiter
}

// Limits are namespace's rate and burst on this replica (a zero rate: unlimited).
func (l *RateLimiter) Limits(namespace string) (perSecond float64, burst int) {
	if l == nil {
		return 0, 1
	}
	if l.Namespace != nil {
		if r, b, ok := l.Namespace(namespace); ok {
			return r, max(b, 1)
		}
	}
	return l.Rate, max(l.Burst, 1)
}

// limiter is namespace's bucket, made or brought to its current rate and burst; nil when the
// namespace is not limited.
func (l *RateLimiter) limiter(namespace string, now time.Time) (lim *rate.Limiter, perSecond float64, burst int) {
	perSecond, burst = l.Limits(namespace)
	if perSecond <= 0 {
		return nil, 0, burst
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.limiters == nil {
		l.limiters = make(map[string]*rate.Limiter)
	}
	lim, found := l.limiters[namespace]
	if !found {
		if len(l.limiters) >= maxLimiters {
			l.forget(now, burst)
		}
		lim = rate.NewLimiter(rate.Limit(perSecond), burst)
		l.limiters[namespace] = lim
	} else if lim.Limit() != rate.Limit(perSecond) || lim.Burst() != burst {
		// The namespace's quota changed.
		lim.SetLimitAt(now, rate.Limit(perSecond))
		lim.SetBurstAt(now, burst)
	}
	return lim, perSecond, burst
}

// Ready says whether namespace's bucket holds a token now, taking nothing, or how long until
// it does: the ingress asks before it reads a request's body, so a namespace over its rate
// costs no read. A zero rate is always ready.
func (l *RateLimiter) Ready(namespace string, now time.Time) (ok bool, retryAfter time.Duration) {
	if l == nil {
		return true, 0
	}
	lim, perSecond, _ := l.limiter(namespace, now)
	if lim == nil {
		return true, 0
	}
	if tokens := lim.TokensAt(now); tokens < 1 {
		return false, time.Duration((1 - tokens) / perSecond * float64(time.Second))
	}
	return true, 0
}

// Reserve takes n events' tokens of namespace's bucket, or says how long to wait before
// trying again (taking nothing). A zero rate never limits. More events than the burst can
// never be taken at once: ok is false with no wait (the handler refuses such a batch first,
// saying the largest one allowed).
func (l *RateLimiter) Reserve(namespace string, n int, now time.Time) (ok bool, retryAfter time.Duration) {
	if l == nil {
		return true, 0
	}
	lim, _, burst := l.limiter(namespace, now)
	if lim == nil {
		return true, 0
	}
	if n > burst {
		return false, 0
	}
	r := lim.ReserveN(now, n)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// forget drops the buckets that are full again (idle namespaces), or, if none is, one.
func (l *RateLimiter) forget(now time.Time, burst int) {
	for ns, lim := range l.limiters {
		if lim.TokensAt(now) >= float64(burst) {
			delete(l.limiters, ns)
		}
	}
	for ns := range l.limiters {
		if len(l.limiters) < maxLimiters {
			return
		}
		delete(l.limiters, ns)
	}
}
