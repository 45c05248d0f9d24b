package endpoint

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SecretCache reads Secrets by name (the dispatcher's Role allows get on named Secrets only,
// no list or watch) and keeps them until Invalidate (an endpoint's status.secretsVersion
// changed) or TTL passes.
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
	at  time.Time
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
	if ok && time.Since(e.at) < c.ttl {
		return e.s, e.err
	}
	var s corev1.Secret
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := c.reader.Get(gctx, types.NamespacedName{Namespace: c.namespace, Name: name}, &s)
	e = cachedSecret{at: time.Now(), err: err}
	if err == nil {
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
