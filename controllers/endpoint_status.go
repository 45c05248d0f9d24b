package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
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
	var ready metav1.Condition
	var reconciling, stalled *metav1.Condition
	switch {
	case err != nil:
		ready = falseCondition(v1alpha1.ReasonReconciling, "reconcile failed, retrying: "+errorMessage(err))
		reconciling = trueCondition(v1alpha1.ConditionReconciling, v1alpha1.ReasonReconciling, ready.Message)
	case obs.problem != nil:
		ready = falseCondition(obs.problem.reason, obs.problem.message)
		if obs.problem.stalled {
			stalled = trueCondition(v1alpha1.ConditionStalled, obs.problem.reason, obs.problem.message)
		} else {
			reconciling = trueCondition(v1alpha1.ConditionReconciling, obs.problem.reason, obs.problem.message)
		}
	case ep.Spec.Suspend:
		ready = falseCondition(v1alpha1.ReasonSuspended, "spec.suspend is true: deliveries are held in the stream until it is false")
	case !obs.dispatcherAvailable:
		msg := fmt.Sprintf("waiting for Deployment %s to report an available replica", st.Dispatcher.Name)
		ready = falseCondition(v1alpha1.ReasonDispatcherUnavailable, msg)
		reconciling = trueCondition(v1alpha1.ConditionReconciling, v1alpha1.ReasonDispatcherUnavailable, msg)
	default:
		ready = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady,
			Message: fmt.Sprintf("consumer %s delivers %s through Deployment %s (%d/%d available)",
				st.ConsumerName, st.DeliverySubject, st.Dispatcher.Name, st.Dispatcher.AvailableReplicas, st.Dispatcher.Replicas)}
	}
	if err == nil {
		st.ObservedGeneration = ep.Generation
	}
	for _, c := range []*metav1.Condition{&ready, reconciling, stalled} {
		if c != nil {
			c.ObservedGeneration = ep.Generation
		}
	}
	st.Conditions = setConditions(st.Conditions, ready, reconciling, stalled)

	key := client.ObjectKeyFromObject(ep).String()
	if obs.problem != nil && obs.problem.reason == v1alpha1.ReasonNATSUnavailable {
		result.RequeueAfter = r.backoff.next(key)
	} else if err == nil {
		r.backoff.forget(key)
	}

	before := r.lastStatus(ep)
	if equality.Semantic.DeepEqual(before, st) {
		return result, err
	}
	if perr := applyStatus(ctx, r.Client, ep, &st); perr != nil {
		if apierrors.IsNotFound(perr) {
			return result, err
		}
		return result, errors.Join(err, fmt.Errorf("patching status: %w", perr))
	}
	r.written.put(ep, st)
	recordTransition(r.Recorder, ep, meta.FindStatusCondition(before.Conditions, v1alpha1.ConditionReady), &ready)
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

func (m *statusMemo[S]) forget(key types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, key)
}

func falseCondition(reason, message string) metav1.Condition {
	return metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: message}
}

func trueCondition(typ, reason, message string) *metav1.Condition {
	return &metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: message}
}

// setConditions returns the controller's conditions: Ready always, Reconciling and Stalled
// only while true. Transition times are kept when a status does not change.
func setConditions(current []metav1.Condition, ready metav1.Condition, reconciling, stalled *metav1.Condition) []metav1.Condition {
	out := make([]metav1.Condition, 0, 3)
	for _, c := range current {
		out = append(out, *c.DeepCopy())
	}
	meta.SetStatusCondition(&out, ready)
	for typ, c := range map[string]*metav1.Condition{v1alpha1.ConditionReconciling: reconciling, v1alpha1.ConditionStalled: stalled} {
		if c == nil {
			meta.RemoveStatusCondition(&out, typ)
		} else {
			meta.SetStatusCondition(&out, *c)
		}
	}
	// A stable order keeps equal statuses equal.
	sorted := make([]metav1.Condition, 0, len(out))
	for _, typ := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionReconciling, v1alpha1.ConditionStalled} {
		if c := meta.FindStatusCondition(out, typ); c != nil {
			sorted = append(sorted, *c)
		}
	}
	return sorted
}

// applyStatus server-side applies status as the controller's field manager: only the fields
// set in status are claimed, so the dispatcher's health and conditions are left alone.
func applyStatus(ctx context.Context, c client.Client, obj client.Object, status any) error {
	gvk, err := c.GroupVersionKindFor(obj)
	if err != nil {
		return err
	}
	fields, err := runtime.DefaultUnstructuredConverter.ToUnstructured(status)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: map[string]any{"status": fields}}
	u.SetGroupVersionKind(gvk)
	u.SetName(obj.GetName())
	u.SetNamespace(obj.GetNamespace())
	return c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u),
		client.FieldOwner(FieldManager), client.ForceOwnership)
}

// recordTransition records an Event when the Ready condition's status or reason changed.
func recordTransition(rec recorder.EventRecorder, obj runtime.Object, before, after *metav1.Condition) {
	if before != nil && before.Status == after.Status && before.Reason == after.Reason {
		return
	}
	typ := corev1.EventTypeWarning
	if after.Status == metav1.ConditionTrue {
		typ = corev1.EventTypeNormal
	}
	rec.Eventf(obj, nil, typ, after.Reason, "Reconcile", "%s", after.Message)
}
