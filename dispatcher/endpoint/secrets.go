package endpoint

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/consent"
)

// SecretCache reads Secrets by name (the dispatcher's Role allows get on named Secrets only,
// no list or watch) and keeps them for about TTL, unless read again before (Read: an
// endpoint's status.secretsVersion changed).
type SecretCache struct {
	reader    client.Reader
	namespace string
	ttl       time.Duration

	mu sync.Mutex
	m  map[string]cachedSecret
}

type cachedSecret struct {
	s   *keptSecret
	err error
	at  time.Time // when it expires
}

// keptSecret is what the cache keeps of a Secret, for thousands of endpoints: its data and, of
// its metadata, what consent decides with and the resourceVersion (consent.SecretMetadata);
// in slices, not maps (a map holding one entry costs some 300 bytes).
type keptSecret struct {
	name, namespace, resourceVersion string
	uid                              types.UID
	owners                           []metav1.OwnerReference
	// annotations and labels are key, value, key, value...
	annotations, labels []string
	keys                []string
	values              [][]byte
}

func keep(s *corev1.Secret) *keptSecret {
	meta := consent.SecretMetadata(s.ObjectMeta)
	k := &keptSecret{name: meta.Name, namespace: meta.Namespace, resourceVersion: meta.ResourceVersion, uid: meta.UID,
		owners: meta.OwnerReferences, annotations: pairs(meta.Annotations), labels: pairs(meta.Labels)}
	for key, v := range s.Data {
		k.keys = append(k.keys, key)
		k.values = append(k.values, v)
	}
	return k
}

// secret is the Secret as Resolve reads it; its data's values are the cache's, never changed.
func (k *keptSecret) secret() *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: k.name, Namespace: k.namespace, ResourceVersion: k.resourceVersion, UID: k.uid,
		OwnerReferences: append([]metav1.OwnerReference(nil), k.owners...),
		Annotations:     unpairs(k.annotations), Labels: unpairs(k.labels)}}
	if len(k.keys) > 0 {
		s.Data = make(map[string][]byte, len(k.keys))
		for i, key := range k.keys {
			s.Data[key] = k.values[i]
		}
	}
	return s
}

func pairs(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k, v)
	}
	return out
}

func unpairs(p []string) map[string]string {
	if len(p) == 0 {
		return nil
	}
	m := make(map[string]string, len(p)/2)
	for i := 0; i+1 < len(p); i += 2 {
		m[p[i]] = p[i+1]
	}
	return m
}

// errorTTL is how long a failed read is kept.
const errorTTL = time.Second

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
		return e.get()
	}
	return c.Read(ctx, name)
}

func (e cachedSecret) get() (*corev1.Secret, error) {
	if e.err != nil {
		return nil, e.err
	}
	return e.s.secret(), nil
}

// Read reads one Secret from the API server, and keeps it.
func (c *SecretCache) Read(ctx context.Context, name string) (*corev1.Secret, error) {
	var s corev1.Secret
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := c.reader.Get(gctx, types.NamespacedName{Namespace: c.namespace, Name: name}, &s)
	// Each entry expires after ttl, give or take a tenth, so entries read together are not
	// read again together.
	e := cachedSecret{at: time.Now().Add(c.ttl - c.ttl/10 + rand.N(c.ttl/5+1)), err: err}
	if err != nil {
		// A missing Secret may come soon, and one the dispatcher's Role does not name yet may be
		// named soon: the endpoints that failed are resolved again a second later and more.
		e.at = time.Now().Add(min(c.ttl, errorTTL))
	} else {
		e.s = keep(&s)
	}
	c.mu.Lock()
	c.m[name] = e
	c.mu.Unlock()
	return e.get()
}
