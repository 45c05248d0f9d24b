package controllers

import (
	"math/rand/v2"
	"sync"
	"time"
)

// backoff spaces the retries of a reconcile that is waiting for NATS: exponential from base up
// to max, with equal jitter (half fixed, half random) so a fleet of endpoints does not retry in
// lockstep, per key, forgotten on the first success.
type backoff struct {
	base, max time.Duration

	mu       sync.Mutex
	failures map[string]int
}

func newBackoff(base, max time.Duration) *backoff {
	return &backoff{base: base, max: max, failures: map[string]int{}}
}

// next records one more failure of key and returns how long to wait before trying again.
func (b *backoff) next(key string) time.Duration {
	b.mu.Lock()
	n := b.failures[key]
	b.failures[key] = n + 1
	b.mu.Unlock()
	d := b.base
	for i := 0; i < n && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	half := d / 2
	return half + rand.N(half+1)
}

// forget resets key after a success.
func (b *backoff) forget(key string) {
	b.mu.Lock()
	delete(b.failures, key)
	b.mu.Unlock()
}
