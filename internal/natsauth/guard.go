package natsauth

import (
	"crypto/sha256"
	"sync"
	"time"
)

// Defaults of the callout's bounds against floods of CONNECTs: each costs a TokenReview and a
// few SubjectAccessReviews, so one client host is held to a rate, and a token the API server
// refused is refused again for a while without asking.
const (
	DefaultRatePerHost  = 20
	DefaultBurstPerHost = 40
	DefaultRefusalTTL   = 10 * time.Second
	// maxTracked bounds the hosts and refused tokens remembered; beyond, the idle or expired
	// ones go first, then any.
	maxTracked = 8192
	// quietLog is how often refusals of one host over its rate are logged (with a count).
	quietLog = 10 * time.Second
)

// guard is the callout's memory of client hosts (a token bucket each) and of tokens the API
// server did not accept.
type guard struct {
	rate       float64
	burst      float64
	refusalTTL time.Duration

	mu      sync.Mutex
	hosts   map[string]*bucket
	refused map[[sha256.Size]byte]time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
	// unlogged counts refusals since lastLog.
	unlogged int
	lastLog  time.Time
}

func newGuard(rate float64, burst int, refusalTTL time.Duration) *guard {
	if rate <= 0 {
		rate = DefaultRatePerHost
	}
	if burst <= 0 {
		burst = DefaultBurstPerHost
	}
	if refusalTTL <= 0 {
		refusalTTL = DefaultRefusalTTL
	}
	return &guard{rate: rate, burst: float64(burst), refusalTTL: refusalTTL,
		hosts: map[string]*bucket{}, refused: map[[sha256.Size]byte]time.Time{}}
}

// admit takes one request of host from its bucket. When the bucket is empty it says so, and
// whether to log the refusal now (with how many went unlogged since the last time).
func (g *guard) admit(host string, now time.Time) (ok, log bool, unlogged int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.hosts[host]
	if b == nil {
		if len(g.hosts) >= maxTracked {
			g.pruneHosts(now)
		}
		b = &bucket{tokens: g.burst, last: now}
		g.hosts[host] = b
	}
	b.tokens = min(g.burst, b.tokens+now.Sub(b.last).Seconds()*g.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true, false, 0
	}
	b.unlogged++
	if now.Sub(b.lastLog) < quietLog {
		return false, false, 0
	}
	n := b.unlogged
	b.unlogged, b.lastLog = 0, now
	return false, true, n
}

// pruneHosts forgets hosts whose bucket has refilled (they lose nothing by it), then, if that
// is not enough, any half.
func (g *guard) pruneHosts(now time.Time) {
	full := time.Duration(g.burst / g.rate * float64(time.Second))
	for h, b := range g.hosts {
		if now.Sub(b.last) >= full {
			delete(g.hosts, h)
		}
	}
	for h := range g.hosts {
		if len(g.hosts) < maxTracked/2 {
			break
		}
		delete(g.hosts, h)
	}
}

// wasRefused reports whether token was refused by the API server within the refusal TTL.
func (g *guard) wasRefused(token string, now time.Time) bool {
	k := sha256.Sum256([]byte(token))
	g.mu.Lock()
	defer g.mu.Unlock()
	until, ok := g.refused[k]
	if ok && now.After(until) {
		delete(g.refused, k)
		return false
	}
	return ok
}

// refuse remembers that the API server did not accept token.
func (g *guard) refuse(token string, now time.Time) {
	k := sha256.Sum256([]byte(token))
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.refused) >= maxTracked {
		for t, until := range g.refused {
			if now.After(until) {
				delete(g.refused, t)
			}
		}
		for t := range g.refused {
			if len(g.refused) < maxTracked/2 {
				break
			}
			delete(g.refused, t)
		}
	}
	g.refused[k] = now.Add(g.refusalTTL)
}
