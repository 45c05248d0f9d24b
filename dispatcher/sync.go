package dispatcher

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// secretCache reads Secrets by name (the dispatcher's Role allows get on named Secrets only,
// no list or watch) and keeps them until the endpoint's status.secretsVersion changes or
// secretTTL passes.
type secretCache struct {
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

func (c *secretCache) get(ctx context.Context, name string) (*corev1.Secret, error) {
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

func (c *secretCache) invalidate() {
	c.mu.Lock()
	c.m = map[string]cachedSecret{}
	c.mu.Unlock()
}

// inScope reports whether this dispatcher delivers ep.
func (d *Dispatcher) inScope(ep *v1alpha1.WebhookEndpoint) bool {
	dedicated := ep.Spec.Dispatcher != nil && ep.Spec.Dispatcher.Dedicated
	if d.dedicated != "" {
		return ep.Name == d.dedicated
	}
	return !dedicated
}

// resync rebuilds every endpoint's configuration, the routing table and the set of workers
// from the informer cache. It runs after any change to endpoints or policies (debounced).
func (d *Dispatcher) resync(ctx context.Context) {
	var eps v1alpha1.WebhookEndpointList
	if err := d.cache.List(ctx, &eps, client.InNamespace(d.namespace)); err != nil {
		d.log.Error(err, "listing endpoints")
		return
	}
	var rps v1alpha1.RetryPolicyList
	if err := d.cache.List(ctx, &rps, client.InNamespace(d.namespace)); err != nil {
		d.log.Error(err, "listing retry policies")
		return
	}
	policies := map[string]*v1alpha1.RetryPolicy{}
	for i := range rps.Items {
		policies[rps.Items[i].Name] = &rps.Items[i]
	}
	configs := map[string]*endpointConfig{}
	invalidated := false
	for i := range eps.Items {
		ep := &eps.Items[i]
		if !d.inScope(ep) {
			continue
		}
		if v := ep.Status.SecretsVersion; d.secretVersions[ep.Name] != v {
			if !invalidated {
				d.secrets.invalidate()
				invalidated = true
			}
			d.secretVersions[ep.Name] = v
		}
		var rp *v1alpha1.RetryPolicy
		if ep.Spec.RetryPolicyRef != nil {
			rp = policies[ep.Spec.RetryPolicyRef.Name]
		}
		c := resolveEndpoint(ep, rp, func(name string) (*corev1.Secret, error) { return d.secrets.get(ctx, name) })
		c.URLBlocked = d.guard.CheckURL(c.URL) // the literal URL; resolved addresses are checked at connect time
		configs[ep.Name] = c
	}
	table := buildRoutes(configs, d.namespace, d.cfg.AllowCrossNamespaceSources)

	d.mu.Lock()
	var stopped []*worker
	for name, w := range d.workers {
		if _, ok := configs[name]; !ok {
			delete(d.workers, name)
			stopped = append(stopped, w)
		}
	}
	var started []*worker
	for name, c := range configs {
		w := d.workers[name]
		if w == nil {
			w = newWorker(d, name)
			d.workers[name] = w
			started = append(started, w)
		}
		if old := w.cfg.Load(); old == nil || !sameConfig(old, c) {
			w.configure(c)
		}
	}
	table.workers = make(map[string]*worker, len(d.workers))
	for name, w := range d.workers {
		table.workers[name] = w
	}
	d.mu.Unlock()
	d.routes.Store(table)

	initial := true
	select {
	case <-d.synced:
		initial = false
	default:
	}
	for _, w := range started {
		wctx, cancel := context.WithCancel(d.runCtx)
		w.cancel = cancel
		go w.run(wctx)
		if !initial {
			go d.backfill(d.runCtx, w.name, w.cfg.Load())
		}
	}
	for _, w := range stopped {
		w.cancel()
		go func() {
			w.wait()
			w.metrics.forget()
		}()
		d.health.forget(w.name)
		d.status.forget(w.name)
		delete(d.secretVersions, w.name)
	}
	// Re-enable endpoints whose enable annotation is newer than their disabling.
	for name, c := range configs {
		if c.EnabledAt.IsZero() {
			continue
		}
		st := d.health.snapshot(name, c.Policy, time.Now())
		if st.disabled() && c.EnabledAt.After(st.DisabledSince) {
			tr, st2, err := d.health.update(ctx, name, c.Policy, func(s *sharedState, _ time.Time) []transition { return s.enable(c.EnabledAt) })
			if err == nil {
				d.transitions(name, tr, st2)
			}
		}
	}
}

// sameConfig reports whether a new configuration changes nothing a worker uses. Resolved
// configurations are rebuilt on every resync, so compare what they were built from.
func sameConfig(a, b *endpointConfig) bool {
	return a.Generation == b.Generation && a.Suspend == b.Suspend && a.Deleting == b.Deleting &&
		a.EnabledAt.Equal(b.EnabledAt) && hashOf(a.PolicyName, a.Policy) == hashOf(b.PolicyName, b.Policy) &&
		errString(a.ConfigError) == errString(b.ConfigError) && a.SecretsFingerprint == b.SecretsFingerprint
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
