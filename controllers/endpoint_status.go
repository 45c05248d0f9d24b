package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	acv1alpha1 "github.com/webhook-operator/webhook-operator/api/applyconfiguration/api/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
)

// summarize is the one place an endpoint's status is written: it turns the observation into
// the controller's conditions (summarize's rule) and fields, and statusWriter.finish applies
// them when they changed, records an Event when Ready changes, and decides when to come back.
func (r *EndpointReconciler) summarize(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation, result ctrl.Result, err error) (ctrl.Result, error) {
	if obs.gone {
		r.status.forget(client.ObjectKeyFromObject(ep))
		return result, err
	}
	st := obs.status
	v := summarize(err, obs.found(), func() verdict {
		switch {
		case ep.Spec.Suspend:
			return verdict{ready: conditions.False(v1alpha1.ConditionReady, v1alpha1.ReasonSuspended, "spec.suspend is true: deliveries are held in the stream until it is false")}
		case !obs.dispatcherAvailable:
			msg := fmt.Sprintf("waiting for Deployment %s to report an available replica", deploymentName(st.Dispatcher))
			return verdict{
				ready:       conditions.False(v1alpha1.ConditionReady, v1alpha1.ReasonDispatcherUnavailable, msg),
				reconciling: conditions.True(v1alpha1.ConditionReconciling, v1alpha1.ReasonDispatcherUnavailable, msg),
			}
		}
		return verdict{ready: conditions.True(v1alpha1.ConditionReady, v1alpha1.ReasonReady,
			fmt.Sprintf("consumer %s delivers %s through Deployment %s (%d/%d available)",
				st.ConsumerName, st.DeliverySubject, deploymentName(st.Dispatcher), st.Dispatcher.AvailableReplicas, st.Dispatcher.Replicas))}
	})
	if err == nil {
		st.ObservedGeneration = ep.Generation
	}
	// A full dead-letter stream or delivery log is a warning beside Ready, not a reason for
	// Ready False: the endpoint is wired and delivers (GitOps tools that wait for Ready must
	// not hold a rollout for it), deliveries that cannot be dead-lettered stay queued, and
	// what fixes it is the namespace's storage, not this endpoint. The condition is the
	// namespace's, the same on each of its endpoints; when this reconcile did not read it,
	// the last one stays.
	storage := obs.storage
	if storage == nil {
		storage = meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStorageLimitReached)
	}
	// What the installation's caps changed of the dedicated dispatcher the endpoint asks for:
	// a warning beside Ready too (it runs, at the caps), present only while true.
	var capped *metav1.Condition
	if len(obs.capped) > 0 {
		capped = conditions.True(v1alpha1.ConditionDispatcherCapped, v1alpha1.ReasonInstallationCap,
			"the installation's caps apply: "+strings.Join(obs.capped, "; "))
	}
	// Ready always; Reconciling and Stalled only while true, in this order; then
	// StorageLimitReached once read, QuotaLimitReached while the namespace has a quota, and
	// DispatcherCapped while true.
	st.Conditions = conditions.Set(st.Conditions, ep.Generation, time.Now(), v.ready, v.reconciling, v.stalled, storage, obs.quotaCondition(st.Conditions), capped)

	before := r.lastStatus(ep)
	announce := []*metav1.Condition{v.ready}
	if v.reconciling != nil && meta.FindStatusCondition(before.Conditions, v1alpha1.ConditionReady) == nil {
		// A new endpoint on its way (its dispatcher starting) is not news: its first Event
		// says it is Ready, or what went wrong. An applied thousand of them would otherwise
		// be a thousand Warnings, and as many writes to the API server.
		announce = nil
	}
	return r.status.finish(ctx, ep, ending[v1alpha1.WebhookEndpointStatus]{
		before: before, status: st, was: before.Conditions, announce: announce,
		apply: endpointStatus(ep, &st), problem: obs.found(), result: result, err: err,
	})
}

// lastStatus is the controller's part of ep's status as last written: what this process
// wrote, which the cache may not show yet, else what the cache shows.
func (r *EndpointReconciler) lastStatus(ep *v1alpha1.WebhookEndpoint) v1alpha1.WebhookEndpointStatus {
	cached := controllerFields(ep.Status)
	if st, ok := r.status.last(ep, cached); ok {
		return *st.DeepCopy()
	}
	return cached
}

// endpointStatus is the apply configuration of the controller's fields of an endpoint's
// status. Only the fields set are claimed, so the dispatcher's health and conditions are left
// alone; an empty optional string is left out, which removes it.
func endpointStatus(ep *v1alpha1.WebhookEndpoint, st *v1alpha1.WebhookEndpointStatus) *acv1alpha1.WebhookEndpointApplyConfiguration {
	s := acv1alpha1.WebhookEndpointStatus().WithConditions(conditions.Apply(st.Conditions)...)
	if st.ObservedGeneration != 0 {
		s.WithObservedGeneration(st.ObservedGeneration)
	}
	if d := st.Dispatcher; d != nil {
		ds := acv1alpha1.DispatcherStatus().WithName(d.Name).WithDedicated(d.Dedicated).
			WithReplicas(d.Replicas).WithAvailableReplicas(d.AvailableReplicas)
		if d.Namespace != "" {
			ds.WithNamespace(d.Namespace)
		}
		s.WithDispatcher(ds)
	}
	for _, f := range []struct {
		value string
		set   func(string) *acv1alpha1.WebhookEndpointStatusApplyConfiguration
	}{
		{st.SigningSecretName, s.WithSigningSecretName},
		{st.SecretsVersion, s.WithSecretsVersion},
		{st.RetryPolicyName, s.WithRetryPolicyName},
		{st.DeliverySubject, s.WithDeliverySubject},
		{st.ConsumerName, s.WithConsumerName},
		{st.Lane, s.WithLane},
	} {
		if f.value != "" {
			f.set(f.value)
		}
	}
	if st.SharedSince != nil {
		s.WithSharedSince(*st.SharedSince)
	}
	if len(st.DrainingConsumers) > 0 {
		s.WithDrainingConsumers(st.DrainingConsumers...)
	}
	return acv1alpha1.WebhookEndpoint(ep.Name, ep.Namespace).WithStatus(s)
}

// deploymentName names a dispatcher's Deployment in a condition: with its namespace when it is
// not the endpoint's (the installation's shared dispatcher).
func deploymentName(d *v1alpha1.DispatcherStatus) string {
	if d.Namespace != "" {
		return d.Namespace + "/" + d.Name
	}
	return d.Name
}
