package quota

import (
	"sync"

	toolscache "k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// RateTable holds, for the ingress, the publish rate each namespace's WebhookQuota sets, as
// one replica's share: Replicas ingress replicas behind one Service each allow 1/Replicas of
// it (the ingress keeps no shared state). It is filled from an informer on WebhookQuotas
// (Handler) and read on every request (Lookup).
type RateTable struct {
	// Replicas share a namespace's rate (at least 1).
	Replicas int

	mu sync.RWMutex
	m  map[string]rateShare
}

type rateShare struct {
	perSecond float64
	burst     int
}

// Lookup is namespace's rate and burst on this replica; ok false when its quota sets none.
func (t *RateTable) Lookup(namespace string) (perSecond float64, burst int, ok bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	r, ok := t.m[namespace]
	return r.perSecond, r.burst, ok
}

// Observe records q's rate (or that it sets none).
func (t *RateTable) Observe(q *v1alpha1.WebhookQuota) {
	if q.Name != v1alpha1.QuotaName {
		return
	}
	perSecond, burst, ok := PublishRate(&q.Spec)
	if !ok || !q.DeletionTimestamp.IsZero() {
		t.Forget(q.Namespace)
		return
	}
	n := max(t.Replicas, 1)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]rateShare{}
	}
	t.m[q.Namespace] = rateShare{perSecond: perSecond / float64(n), burst: max(burst/n, 1)}
}

// Forget drops namespace's rate: its quota is gone.
func (t *RateTable) Forget(namespace string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, namespace)
}

// Handler keeps the table equal to an informer's WebhookQuotas.
func (t *RateTable) Handler() toolscache.ResourceEventHandler {
	observe := func(obj any) {
		if q, ok := obj.(*v1alpha1.WebhookQuota); ok {
			t.Observe(q)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    observe,
		UpdateFunc: func(_, obj any) { observe(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if q, ok := obj.(*v1alpha1.WebhookQuota); ok && q.Name == v1alpha1.QuotaName {
				t.Forget(q.Namespace)
			}
		},
	}
}
