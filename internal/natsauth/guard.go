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
	// quietEvery is how often refusals of one host of one kind are logged (with a count).
	quietEvery = 10 * time.Second
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
	// rate and pending are the logging of the host's refusals over its rate and beyond the
	// bounds of pending requests.
	rate, pending quietLog
}

// quietLog is the logging of one kind of refusal of a host: unlogged counts refusals since
// last.
type quietLog struct {
	unlogged int
	last     time.Time
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
	b := g.bucketLocked(host, now)
	if b.tokens >= 1 {
		b.tokens--
		return true, false, 0
	}
	log, unlogged = b.rate.count(now)
	return false, log, unlogged
}

// quiet counts a refusal of host for another reason (too many pending requests) and says
// whether to log it now, as admit does.
func (g *guard) quiet(host string, now time.Time) (log bool, unlogged int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.bucketLocked(host, now).pending.count(now)
}

// bucketLocked is host's bucket, refilled up to now.
func (g *guard) bucketLocked(host string, now time.Time) *bucket {
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
	return b
}

// count counts a refusal and says whether to log it now (at most every quietEvery), with how
// many went unlogged since the last time.
func (q *quietLog) count(now time.Time) (log bool, unlogged int) {
	q.unlogged++
	if now.Sub(q.last) < quietEvery {
		return false, 0
	}
	n := q.unlogged
	q.unlogged, q.last = 0, now
	return true, n
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

// Defaults of the bounds on authorization requests waiting for a decision or in one.
const (
	// DefaultConcurrency is how many decisions are made at once.
	DefaultConcurrency = 16
	// DefaultMaxPending bounds the requests waiting or in a decision in all.
	DefaultMaxPending = 1024
	// DefaultMaxPendingPerHost and DefaultMaxPendingPerNamespace bound those of one client
	// host and of one namespace asked for: half the decisions at most, so that no host and no
	// namespace takes every one.
	DefaultMaxPendingPerHost      = DefaultConcurrency / 2
	DefaultMaxPendingPerNamespace = DefaultConcurrency / 2
	// DefaultMaxPendingPerToken bounds those of one bearer token.
	DefaultMaxPendingPerToken = 4
)

// pendingKeys are what a request counts against.
type pendingKeys struct {
	host, namespace string
	token           [sha256.Size]byte
}

// pending counts the requests waiting for a decision or in one, in all and per host,
// namespace and token. A key is remembered only while it has pending requests, so it holds at
// most three keys per pending request.
type pending struct {
	maxTotal, maxHost, maxNamespace, maxToken int

	mu         sync.Mutex
	total      int
	hosts      map[string]int
	namespaces map[string]int
	tokens     map[[sha256.Size]byte]int
}

func newPending(total, host, namespace, token int) *pending {
	def := func(v, d int) int {
		if v <= 0 {
			return d
		}
		return v
	}
	return &pending{maxTotal: def(total, DefaultMaxPending), maxHost: def(host, DefaultMaxPendingPerHost),
		maxNamespace: def(namespace, DefaultMaxPendingPerNamespace), maxToken: def(token, DefaultMaxPendingPerToken),
		hosts: map[string]int{}, namespaces: map[string]int{}, tokens: map[[sha256.Size]byte]int{}}
}

// acquire counts a request against its keys, or refuses it (nothing counted) when one of them
// is at its bound, saying which.
func (p *pending) acquire(k pendingKeys) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.total >= p.maxTotal:
		return refuse("the auth callout has %d connection requests waiting or in a decision, its bound: try again later", p.total)
	case p.hosts[k.host] >= p.maxHost:
		return refuse("%d connection requests from %s are waiting or in a decision, the bound per client host: try again later", p.hosts[k.host], k.host)
	case p.namespaces[k.namespace] >= p.maxNamespace:
		return refuse("%d connection requests for namespace %.70q are waiting or in a decision, the bound per namespace: try again later", p.namespaces[k.namespace], k.namespace)
	case p.tokens[k.token] >= p.maxToken:
		return refuse("%d connection requests with this token are waiting or in a decision, the bound per token: try again later", p.tokens[k.token])
	}
	p.total++
	p.hosts[k.host]++
	p.namespaces[k.namespace]++
	p.tokens[k.token]++
	return nil
}

// release forgets a request acquire counted.
func (p *pending) release(k pendingKeys) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total--
	dec(p.hosts, k.host)
	dec(p.namespaces, k.namespace)
	dec(p.tokens, k.token)
}

func dec[K comparable](m map[K]int, k K) {
	if m[k] <= 1 {
		delete(m, k)
		return
	}
	m[k]--
}
