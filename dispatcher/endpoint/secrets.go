package endpoint

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SecretCache reads Secrets by name (the dispatcher's Role allows get on named Secrets only,
// no list or watch) and keeps them until Invalidate (an endpoint's status.secretsVersion
// changed) or about TTL passes.
type SecretCache struct {
	reader    client.Reader
	namespace string
	ttl       time.Duration

	mu sync.Mutex
	m  map[string]cachedSecret
}

type cachedSecret struct {
	s   *corev1.Secret
	err error
	at  time.Time // when it expires
}

// NewSecretCache reads the Secrets of namespace through reader.
func NewSecretCache(reader client.Reader, namespace string, ttl time.Duration) *SecretCache {
	return &SecretCache{reader: reader, namespace: namespace, ttl: ttl, m: map[string]cachedSecret{}}
}

// Get reads one Secret, from the cache when it is fresh.
func (c *SecretCache) Get(ctx context.Context, name string) (*corev1.Secret, error) {
	c.mu.Lock()
	e, ok := c.m[name]
	c.mu.Unlock()
	if ok && time.Now().Before(e.at) {
		return e.s, e.err
	}
	var s corev1.Secret
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := c.reader.Get(gctx, types.NamespacedName{Namespace: c.namespace, Name: name}, &s)
	// Each entry expires after ttl, give or take a tenth, so entries read together are not
	// read again together.
	e = cachedSecret{at: time.Now().Add(c.ttl - c.ttl/10 + rand.N(c.ttl/5+1)), err: err}
	if err != nil {
		e.at = time.Now().Add(min(c.ttl, 30*time.Second)) // a missing Secret may come soon
	}
	if err == nil {
		s.ManagedFields = nil // kept for thousands of endpoints: only what Resolve reads
		e.s = &s
	}
	c.mu.Lock()
	c.m[name] = e
	c.mu.Unlock()
	return e.s, e.err
}

// Invalidate forgets every Secret read.
func (c *SecretCache) Invalidate() {
	c.mu.Lock()
	c.m = map[string]cachedSecret{}
	c.mu.Unlock()
}
