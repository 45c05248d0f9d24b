package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	acv1alpha1 "github.com/webhook-operator/webhook-operator/api/applyconfiguration/api/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
)

// summarize is the one place an endpoint's status is written: it turns the observation into
// the controller's conditions and fields, applies them when they changed, records an Event
// when Ready changes, and decides when to come back.
func (r *EndpointReconciler) summarize(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation, result ctrl.Result, err error) (ctrl.Result, error) {
	if obs.gone {
		r.backoff.forget(client.ObjectKeyFromObject(ep).String())
		r.written.forget(client.ObjectKeyFromObject(ep))
		return result, err
	}
	st := obs.status
	var ready, reconciling, stalled *metav1.Condition
	switch {
	case err != nil:
		ready = conditions.False(v1alpha1.ConditionReady, v1alpha1.ReasonReconciling, "reconcile failed, retrying: "+errorMessage(err))
		reconciling = conditions.True(v1alpha1.ConditionReconciling, v1alpha1.ReasonReconciling, ready.Message)
	case obs.problem != nil:
		ready = conditions.False(v1alpha1.ConditionReady, obs.problem.reason, obs.problem.message)
		if obs.problem.stalled {
			stalled = conditions.True(v1alpha1.ConditionStalled, obs.problem.reason, obs.problem.message)
		} else {
			reconciling = conditions.True(v1alpha1.ConditionReconciling, obs.problem.reason, obs.problem.message)
		}
	case ep.Spec.Suspend:
		ready = conditions.False(v1alpha1.ConditionReady, v1alpha1.ReasonSuspended, "spec.suspend is true: deliveries are held in the stream until it is false")
	case !obs.dispatcherAvailable:
		msg := fmt.Sprintf("waiting for Deployment %s to report an available replica", st.Dispatcher.Name)
		ready = conditions.False(v1alpha1.ConditionReady, v1alpha1.ReasonDispatcherUnavailable, msg)
		reconciling = conditions.True(v1alpha1.ConditionReconciling, v1alpha1.ReasonDispatcherUnavailable, msg)
	default:
		ready = conditions.True(v1alpha1.ConditionReady, v1alpha1.ReasonReady,
			fmt.Sprintf("consumer %s delivers %s through Deployment %s (%d/%d available)",
				st.ConsumerName, st.DeliverySubject, st.Dispatcher.Name, st.Dispatcher.AvailableReplicas, st.Dispatcher.Replicas))
	}
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
	// Ready always; Reconciling and Stalled only while true, in this order; then
	// StorageLimitReached once read.
	st.Conditions = conditions.Set(st.Conditions, ep.Generation, time.Now(), ready, reconciling, stalled, storage, obs.quotaCondition(st.Conditions))

	key := client.ObjectKeyFromObject(ep).String()
	if obs.problem != nil && obs.problem.reason == v1alpha1.ReasonNATSUnavailable {
		result.RequeueAfter = r.backoff.next(key)
	} else if err == nil {
		r.backoff.forget(key)
	}

	before := r.lastStatus(ep)
	if wrote, perr := r.written.apply(ctx, r.Client, ep, before, st, endpointStatus(ep, &st)); !wrote || perr != nil {
		return result, errors.Join(err, perr)
	}
	recordTransition(r.Recorder, ep, meta.FindStatusCondition(before.Conditions, v1alpha1.ConditionReady), ready)
	return result, err
}

// lastStatus is the controller's part of ep's status as last written: what this process
// wrote, which the cache may not show yet, else what the cache shows.
func (r *EndpointReconciler) lastStatus(ep *v1alpha1.WebhookEndpoint) v1alpha1.WebhookEndpointStatus {
	if st, ok := r.written.get(ep); ok {
		return *st.DeepCopy()
	}
	return controllerFields(ep.Status)
}

// statusMemo remembers the status this process last wrote to each object, so that a reconcile
// reading a cache that has not seen that write yet neither writes it again, nor resets a
// condition's transition time, nor records its Event twice. The controller is the only
// writer of these fields (its own field manager).
type statusMemo[S any] struct {
	mu sync.Mutex
	m  map[types.NamespacedName]memoEntry[S]
}

type memoEntry[S any] struct {
	uid    types.UID
	status S
}

func (m *statusMemo[S]) get(obj client.Object) (S, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[client.ObjectKeyFromObject(obj)]
	if !ok || e.uid != obj.GetUID() {
		var zero S
		return zero, false
	}
	return e.status, true
}

func (m *statusMemo[S]) put(obj client.Object, status S) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[types.NamespacedName]memoEntry[S]{}
	}
	m.m[client.ObjectKeyFromObject(obj)] = memoEntry[S]{uid: obj.GetUID(), status: status}
}

// apply server-side applies ac, the apply configuration of obj's status st, as FieldManager,
// unless st equals before (what was last written); then remembers st. It reports whether it
// wrote; an object deleted meanwhile is no error.
func (m *statusMemo[S]) apply(ctx context.Context, c client.Client, obj client.Object, before, st S, ac runtime.ApplyConfiguration) (bool, error) {
	if equality.Semantic.DeepEqual(before, st) {
		return false, nil
	}
	if err := c.Status().Apply(ctx, ac, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("patching status: %w", err)
	}
	m.put(obj, st)
	return true, nil
}

func (m *statusMemo[S]) forget(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, key)
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
		s.WithDispatcher(acv1alpha1.DispatcherStatus().WithName(d.Name).WithDedicated(d.Dedicated).
			WithReplicas(d.Replicas).WithAvailableReplicas(d.AvailableReplicas))
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
	} {
		if f.value != "" {
			f.set(f.value)
		}
	}
	return acv1alpha1.WebhookEndpoint(ep.Name, ep.Namespace).WithStatus(s)
}

// recordTransition records an Event when the Ready condition's status or reason changed.
func recordTransition(rec recorder.EventRecorder, obj runtime.Object, before, after *metav1.Condition) {
	if !conditions.Changed(before, after) {
		return
	}
	typ := corev1.EventTypeWarning
	if after.Status == metav1.ConditionTrue {
		typ = corev1.EventTypeNormal
	}
	rec.Eventf(obj, nil, typ, after.Reason, "Reconcile", "%s", after.Message)
}
