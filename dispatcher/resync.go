package dispatcher

import (
	"context"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/deliver"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/dispatcher/intake"
)

// resync rebuilds the endpoints' configurations, the route table and the set of workers from
// the informer cache. It runs after any change to endpoints or policies (debounced): then only
// the endpoints that changed are resolved again (resolve); every one at start and on the
// periodic resync (full).
func (p *process) resync(ctx context.Context, full bool) {
	configs, ok := p.resolve(ctx, full)
	if !ok {
		return
	}
	started, stopped := p.reconcileWorkers(configs)
	for _, w := range started {
		w.Start(ctx)
	}
	if p.intake != nil {
		ws := p.workers.all()
		takers := make([]intake.Taker, len(ws))
		for i, w := range ws {
			takers[i] = w.Taker()
		}
		p.intake.SetRoutes(takers)
	}
	for _, w := range stopped {
		w.Stop()
		go func() {
			w.Wait()
			w.Metrics.Forget()
		}()
		p.health.Forget(w.Name())
		p.status.Forget(w.Name())
		delete(p.resolved, w.Name())
	}
	p.reenable(ctx, configs)
	p.nextRotationEnd(configs)
	p.nextConfigRetry(configs)
}

// Configuration retries: how soon endpoints whose configuration failed are resolved again, at
// first and at most.
const (
	configRetryMin = time.Second
	configRetryMax = 30 * time.Second
)

// nextConfigRetry resolves the endpoints whose configuration failed again soon (1 s, doubling
// to 30 s while they still fail), not at the periodic resync minutes later: a Secret the
// dispatcher may not read yet (the controller adds its name to the dispatcher's Role a moment
// after the endpoint appears) or that is created after the endpoint changes nothing the
// dispatcher watches, and each attempt meanwhile fails with a configuration error.
func (p *process) nextConfigRetry(configs map[string]*endpoint.Config) {
	failed := false
	for _, c := range configs {
		if c.ConfigError != nil && !c.Deleting {
			failed = true
			break
		}
	}
	if !failed {
		if p.configRetry != nil {
			p.configRetry.Stop()
			p.configRetry = nil
		}
		p.configBackoff = 0
		return
	}
	if p.configRetry != nil && time.Now().Before(p.configRetryAt) {
		return // one is due already
	}
	p.configBackoff = min(max(2*p.configBackoff, configRetryMin), configRetryMax)
	p.configRetryAt = time.Now().Add(p.configBackoff)
	p.configRetry = time.AfterFunc(p.configBackoff, func() { askResync(p.resyncs) })
}

// askResync asks resyncLoop for a resync, unless one is asked for already.
func askResync(resyncs chan<- struct{}) {
	select {
	case resyncs <- struct{}{}:
	default:
	}
}

// nextRotationEnd resolves the endpoints again when the first signing-secret rotation still
// running ends (spec.signing.rotationEndsAt), not at the periodic resync minutes later: the
// previous secret is let go then. (The signer itself stops using it on the dot, whatever the
// configuration.)
func (p *process) nextRotationEnd(configs map[string]*endpoint.Config) {
	var next time.Time
	for _, c := range configs {
		if !c.RotationEndsAt.IsZero() && (next.IsZero() || c.RotationEndsAt.Before(next)) {
			next = c.RotationEndsAt
		}
	}
	if p.rotationEnd != nil {
		p.rotationEnd.Stop()
		p.rotationEnd = nil
	}
	if next.IsZero() {
		return
	}
	p.rotationEnd = time.AfterFunc(time.Until(next), func() { askResync(p.resyncs) })
}

// resolvedFrom is what an endpoint's configuration was resolved from: the resourceVersions of
// the endpoint and of its retry policy (empty: none or missing), and its status.secretsVersion;
// and when a full resolve resolves it again, reading its Secrets again (unix nanoseconds).
type resolvedFrom struct {
	endpoint, policy, secrets string
	due                       int64
}

// Secrets: a full resolve (every 5 minutes) resolves again, reading their Secrets again, the
// endpoints resolved more than about secretsMaxAge ago (give or take a tenth, so that endpoints
// resolved together are not read again together); a Secret read is kept secretsHold, for the
// resolves that follow a change.
const (
	secretsMaxAge = time.Hour
	secretsHold   = time.Minute
)

// same says whether an endpoint's configuration resolved from last would resolve to the same
// now, from: unless full, when nothing it was resolved from changed; in a full resolve, when
// also its Secrets were read less than secretsMaxAge ago.
func (last resolvedFrom) same(from resolvedFrom, full bool, now time.Time) bool {
	return last.endpoint == from.endpoint && last.policy == from.policy && last.secrets == from.secrets &&
		(!full || now.UnixNano() < last.due)
}

// resolve builds the configuration of every endpoint this dispatcher serves. An endpoint whose
// object and retry policy did not change since its worker's configuration was resolved keeps
// that configuration (it would resolve to the same: Secrets that change reach it through its
// status.secretsVersion), except one whose configuration failed (a missing Secret may exist
// now) or whose signing-secret rotation has ended since: creating a thousand endpoints resolves
// each once or so, not each of them a thousand times. A full resolve (the periodic one) also
// resolves those resolved long ago, reading their Secrets again (resolvedFrom.same).
func (p *process) resolve(ctx context.Context, full bool) (map[string]*endpoint.Config, bool) {
	ns := p.o.Namespace
	// The informer's own objects, not copies: they are only read, here and by Resolve.
	var eps v1alpha1.WebhookEndpointList
	if err := p.cache.List(ctx, &eps, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		p.log.Error(err, "listing endpoints")
		return nil, false
	}
	var rps v1alpha1.RetryPolicyList
	if err := p.cache.List(ctx, &rps, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		p.log.Error(err, "listing retry policies")
		return nil, false
	}
	policies := map[string]*v1alpha1.RetryPolicy{}
	for i := range rps.Items {
		policies[rps.Items[i].Name] = &rps.Items[i]
	}
	guard := p.guard
	now := time.Now()
	configs := map[string]*endpoint.Config{}
	// reread are the Secrets read again in this resolve: once each, however many endpoints
	// reference them.
	reread := map[string]bool{}
	elsewhere := map[string]bool{}
	defer func() {
		p.workers.mu.Lock()
		p.workers.elsewhere = elsewhere
		p.workers.mu.Unlock()
	}()
	for i := range eps.Items {
		ep := &eps.Items[i]
		if !endpoint.InScope(ep, p.o.Endpoint) {
			elsewhere[ep.Name] = true
			continue
		}
		var rp *v1alpha1.RetryPolicy
		from := resolvedFrom{endpoint: ep.ResourceVersion, secrets: ep.Status.SecretsVersion}
		if ep.Spec.RetryPolicyRef != nil {
			if rp = policies[ep.Spec.RetryPolicyRef.Name]; rp != nil {
				from.policy = rp.ResourceVersion
			}
		}
		last, known := p.resolved[ep.Name]
		if known && last.same(from, full, now) {
			if w := p.workers.get(ep.Name); w != nil {
				if c := w.Config(); c != nil && c.ConfigError == nil && (c.RotationEndsAt.IsZero() || now.Before(c.RotationEndsAt)) {
					configs[ep.Name] = c
					continue
				}
			}
		}
		// A Secret it references changed (the controller says so): its Secrets are read again.
		fresh := last.secrets != from.secrets
		c := endpoint.Resolve(ep, rp, func(name string) (*corev1.Secret, error) {
			if fresh && !reread[name] {
				reread[name] = true
				return p.secrets.Read(ctx, name)
			}
			return p.secrets.Get(ctx, name)
		})
		c.URLBlocked = guard.CheckURL(c.URL) // the literal URL; resolved addresses are checked at connect time
		if c.Proxy == nil {
			c.Proxy = p.proxy
		}
		configs[ep.Name] = c
		from.due = now.Add(secretsMaxAge - secretsMaxAge/10 + rand.N(secretsMaxAge/5)).UnixNano()
		p.resolved[ep.Name] = from
	}
	return configs, true
}

// reconcileWorkers makes the set of workers match configs (new ones are returned to be
// started, gone ones to be stopped).
func (p *process) reconcileWorkers(configs map[string]*endpoint.Config) (started, stopped []*deliver.Worker) {
	ws := p.workers
	ws.mu.Lock()
	for name, w := range ws.m {
		if _, ok := configs[name]; !ok {
			delete(ws.m, name)
			stopped = append(stopped, w)
		}
	}
	for name, c := range configs {
		w := ws.m[name]
		if w == nil {
			w = p.factory.NewWorker(name, ws.metrics.Endpoint(ws.namespace, name))
			ws.m[name] = w
			started = append(started, w)
		}
		if old := w.Config(); old == nil || !endpoint.Same(old, c) {
			w.Configure(c)
		}
	}
	ws.mu.Unlock()
	return started, stopped
}

// reenable re-enables endpoints whose enable annotation is newer than their disabling.
func (p *process) reenable(ctx context.Context, configs map[string]*endpoint.Config) {
	for name, c := range configs {
		if c.EnabledAt.IsZero() {
			continue
		}
		st := p.health.Snapshot(name)
		if st.Disabled() && c.EnabledAt.After(st.DisabledSince) {
			_, _ = p.health.Change(ctx, name, func(s *state.State, _ time.Time) []state.Transition { return s.Enable(c.EnabledAt) })
		}
	}
}
