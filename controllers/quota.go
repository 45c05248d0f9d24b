package controllers

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
	"github.com/webhook-operator/webhook-operator/internal/quota"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// namespaceQuota is namespace ns's WebhookQuota, nil when it has none (or it is being deleted:
// its limits end with it).
func namespaceQuota(ctx context.Context, c client.Reader, ns string) (*v1alpha1.WebhookQuota, error) {
	q := &v1alpha1.WebhookQuota{}
	err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.QuotaName}, q)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	case !q.DeletionTimestamp.IsZero():
		return nil, nil
	}
	return q, nil
}

// quotaDefaults are what an endpoint takes of the installation when its spec sets nothing.
func (o *Options) quotaDefaults() quota.Defaults {
	return quota.Defaults{DedicatedReplicas: o.DispatcherReplicas, DedicatedResources: o.DispatcherResources,
		MaxEndpoints: o.MaxEndpointsPerNamespace}
}

// admission is the decision on namespace ns's endpoints of its quota q, or, without one (q is
// nil), of the installation's bound on endpoints per namespace. Without either, Verdicts is nil
// and everything admitted.
func (o *Options) admission(ctx context.Context, c client.Reader, ns string) (*v1alpha1.WebhookQuota, quota.Result, error) {
	q, err := namespaceQuota(ctx, c, ns)
	if err != nil || q == nil && o.MaxEndpointsPerNamespace <= 0 {
		return nil, quota.Result{}, err
	}
	list := &v1alpha1.WebhookEndpointList{}
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil, quota.Result{}, err
	}
	var spec *v1alpha1.WebhookQuotaSpec
	if q != nil {
		spec = &q.Spec
	}
	return q, quota.Admit(spec, list.Items, o.quotaDefaults()), nil
}

// admits reports whether res admits endpoint name: its verdict says so, or there is none
// without a quota (nothing bounds the namespace, or the endpoint is being deleted).
func admits(q *v1alpha1.WebhookQuota, res quota.Result, name string) bool {
	v, ok := res.Verdicts[name]
	return v.Admitted || q == nil && !ok
}

// admitted keeps of eps those the namespace's quota, or the installation's bound, admits.
func (o *Options) admitted(ctx context.Context, c client.Reader, ns string, eps []*v1alpha1.WebhookEndpoint) ([]*v1alpha1.WebhookEndpoint, error) {
	q, res, err := o.admission(ctx, c, ns)
	if err != nil || q == nil && res.Verdicts == nil {
		return eps, err
	}
	out := eps[:0:0]
	for _, ep := range eps {
		if v, ok := res.Verdicts[ep.Name]; !ok || v.Admitted {
			out = append(out, ep)
		}
	}
	return out, nil
}

// QuotaBounds reads, for JetStream.Ensure, the storage bounds namespace ns's WebhookQuota
// sets on its streams (none without one).
func QuotaBounds(c client.Reader) func(ctx context.Context, ns string) (streams.Bounds, error) {
	return func(ctx context.Context, ns string) (streams.Bounds, error) {
		q, err := namespaceQuota(ctx, c, ns)
		if err != nil || q == nil {
			return streams.Bounds{}, err
		}
		if why := quota.ValidateStorage(&q.Spec); why != "" {
			return streams.Bounds{}, nil // the quota reports it; the installation's bounds hold meanwhile
		}
		return quota.Bounds(&q.Spec), nil
	}
}

// EventPublishing says, for the auth callout, whether producers of a namespace may publish
// events to the bus directly: not while its WebhookQuota sets a publish rate, which NATS
// cannot enforce and the ingress does.
func EventPublishing(c client.Reader) func(ctx context.Context, ns string) (bool, error) {
	return func(ctx context.Context, ns string) (bool, error) {
		q, err := namespaceQuota(ctx, c, ns)
		if err != nil || q == nil {
			return true, err
		}
		return !quota.RestrictsDirectPublish(&q.Spec), nil
	}
}

// quotaPause is how far ahead an endpoint its quota holds back has its consumers paused; every
// reconcile of it pauses them again, so they stay paused while it is held back.
const quotaPause = 30 * 24 * time.Hour

// checkQuota holds the endpoint back when its namespace's WebhookQuota does not admit it:
// Ready False QuotaExceeded (Stalled: a change of the endpoints or of the quota is needed),
// QuotaLimitReached True with the limit, and its consumers paused so nothing is delivered
// (they keep their place: admitted later, it delivers what waited). Admitted, its consumers
// are resumed if the quota had paused them.
func (r *EndpointReconciler) checkQuota(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error {
	q, res, err := r.Options.admission(ctx, r.Client, ep.Namespace)
	if err != nil {
		return err
	}
	set := r.NATS.Config().For(ep.Namespace)
	consumers := [][2]string{{set.EventsStream(), set.EndpointConsumer(ep.Name)}, {set.DeliveriesStream(), set.EndpointConsumer(ep.Name)}}
	v := res.Verdicts[ep.Name]
	if admits(q, res, ep.Name) {
		// Held back until now (its last condition says so): its consumers were paused.
		if meta.IsStatusConditionTrue(obs.status.Conditions, v1alpha1.ConditionQuotaLimitReached) {
			if err := r.NATS.Do(ctx, ep.Namespace, func(ctx context.Context, js jetstream.JetStream) error {
				return setPaused(ctx, js, consumers, false)
			}); err != nil {
				obs.block(v1alpha1.ReasonNATSUnavailable, "cannot resume the consumers the WebhookQuota had paused: %v", err)
				return nil
			}
		}
		obs.quotaRead = true
		if q != nil {
			obs.quota = conditions.False(v1alpha1.ConditionQuotaLimitReached, v1alpha1.ReasonWithinQuota,
				fmt.Sprintf("the namespace's WebhookQuota %s admits this endpoint", q.Name))
		}
		return nil
	}
	obs.quotaRead = true
	obs.quota = conditions.True(v1alpha1.ConditionQuotaLimitReached, v.Reason, v.Message)
	if err := r.NATS.Do(ctx, ep.Namespace, func(ctx context.Context, js jetstream.JetStream) error {
		return setPaused(ctx, js, consumers, true)
	}); err != nil && !streams.IsNotFound(err) {
		obs.block(v1alpha1.ReasonNATSUnavailable, "held back by the WebhookQuota, but cannot pause its consumers: %v", err)
		return nil
	}
	if q == nil {
		obs.stall(v1alpha1.ReasonQuotaExceeded, "held back by the installation's bound on endpoints per namespace, nothing is delivered: %s", v.Message)
		return nil
	}
	obs.stall(v1alpha1.ReasonQuotaExceeded, "held back by the namespace's WebhookQuota %s, nothing is delivered: %s", q.Name, v.Message)
	return nil
}

// setPaused pauses (for quotaPause) or resumes the consumers that exist of (stream, name)
// pairs, changing only those not already so.
func setPaused(ctx context.Context, js jetstream.JetStream, consumers [][2]string, pause bool) error {
	for _, sc := range consumers {
		c, err := js.Consumer(ctx, sc[0], sc[1])
		if streams.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		info := c.CachedInfo()
		switch {
		case pause && (!info.Paused || info.Config.PauseUntil == nil || time.Until(*info.Config.PauseUntil) < quotaPause/2):
			_, err = js.PauseConsumer(ctx, sc[0], sc[1], time.Now().Add(quotaPause))
		case !pause && info.Paused:
			_, err = js.ResumeConsumer(ctx, sc[0], sc[1])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// quotaCondition is the QuotaLimitReached condition this reconcile wants: the one read, no
// condition when the namespace has no quota, the last one when the quota was not read.
func (o *endpointObservation) quotaCondition(last []metav1.Condition) *metav1.Condition {
	if o.quotaRead {
		return o.quota
	}
	for i := range last {
		if last[i].Type == v1alpha1.ConditionQuotaLimitReached {
			return &last[i]
		}
	}
	return nil
}

// raise is what raises a full stream's bound: the installation's flag, or, when the
// namespace's WebhookQuota sets the bound (quotaBound > 0), the quota, which the platform team
// writes.
func raise(quotaBound int64, installation, byQuota string) string {
	if quotaBound > 0 {
		return byQuota
	}
	return installation
}
