package endpoint

import (
	"context"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/consent"
)

// SecretCache reads Secrets by name (the dispatcher's Role allows get on named Secrets only,
// no list or watch) and keeps each for about hold after reading it: long enough for the
// resolves that follow a change (the controller's status writes after an endpoint is
// applied), not for thousands of idle endpoints, whose configurations hold what they use (a
// shared dispatcher would otherwise keep a Secret per endpoint at least, its signing Secret).
// How often a Secret that did not change is read again is the resolver's to say.
type SecretCache struct {
	reader    client.Reader
	namespace string
	hold      time.Duration

	mu sync.Mutex
	m  map[string]cachedSecret
	// peak is the most entries m held since it was made: a map keeps its room when entries
	// go, so one that shrank to a quarter of it is made again (sweep).
	peak int
	// sweeper drops the expired entries, armed while the cache holds any.
	sweeper *time.Timer
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

// NewSecretCache reads the Secrets of namespace through reader, keeping each for hold.
func NewSecretCache(reader client.Reader, namespace string, hold time.Duration) *SecretCache {
	return &SecretCache{reader: reader, namespace: namespace, hold: hold, m: map[string]cachedSecret{}}
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
	e := cachedSecret{at: time.Now().Add(c.hold), err: err}
	if err != nil {
		// A missing Secret may come soon, and one the dispatcher's Role does not name yet may be
		// named soon: the endpoints that failed are resolved again a second later and more.
		e.at = time.Now().Add(min(c.hold, errorTTL))
	} else {
		e.s = keep(&s)
	}
	c.mu.Lock()
	c.m[name] = e
	c.peak = max(c.peak, len(c.m))
	if c.sweeper == nil {
		c.sweeper = time.AfterFunc(c.hold, c.sweep)
	}
	c.mu.Unlock()
	return e.get()
}

// sweep drops the expired entries, and arms itself again for the next to expire.
func (c *SecretCache) sweep() {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	for name, e := range c.m {
		switch {
		case !now.Before(e.at):
			delete(c.m, name)
		case next.IsZero() || e.at.Before(next):
			next = e.at
		}
	}
	if len(c.m) < c.peak/4 {
		m := make(map[string]cachedSecret, len(c.m)) // not maps.Clone, which may keep the room
		maps.Copy(m, c.m)
		c.m, c.peak = m, len(m)
	}
	c.sweeper = nil
	if !next.IsZero() {
		c.sweeper = time.AfterFunc(next.Sub(now), c.sweep)
	}
}

// Len is how many Secrets the cache holds.
func (c *SecretCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
