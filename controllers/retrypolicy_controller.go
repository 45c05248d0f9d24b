package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/policy"
)

// RetryPolicyReconciler reports on a RetryPolicy: whether it is valid (Ready), how many
// endpoints use it, and the attempts and waits it gives. Dispatchers watch policies
// themselves, so a change reaches them without the controller's help.
type RetryPolicyReconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder

	written statusMemo[v1alpha1.RetryPolicyStatus]
}

// Reconcile computes the policy's status and applies it when it changed.
func (r *RetryPolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	rp := &v1alpha1.RetryPolicy{}
	if err := r.Client.Get(ctx, req.NamespacedName, rp); err != nil {
		if apierrors.IsNotFound(err) {
			r.written.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before, ok := r.written.get(rp)
	if !ok {
		before = rp.Status
		before.Conditions = nil
		for _, c := range rp.Status.Conditions {
			if c.Type == v1alpha1.ConditionReady || c.Type == v1alpha1.ConditionStalled {
				before.Conditions = append(before.Conditions, c)
			}
		}
	}
	users, err := r.endpoints(ctx, rp)
	if err != nil {
		return ctrl.Result{}, err
	}

	st := v1alpha1.RetryPolicyStatus{ObservedGeneration: rp.Generation, Endpoints: users}
	for _, c := range before.Conditions {
		st.Conditions = append(st.Conditions, *c.DeepCopy())
	}
	var ready metav1.Condition
	p, perr := policy.FromSpec(&rp.Spec)
	if perr != nil {
		ready = falseCondition(v1alpha1.ReasonInvalidSpec, perr.Error())
		ready.ObservedGeneration = rp.Generation
		meta.SetStatusCondition(&st.Conditions, ready)
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionStalled, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonInvalidSpec, Message: perr.Error(), ObservedGeneration: rp.Generation})
	} else {
		st.MaxAttempts, st.Summary = int32(p.MaxAttempts), p.Summary()
		ready = metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady,
			Message: fmt.Sprintf("%d attempts (%s); used by %d endpoints", p.MaxAttempts, st.Summary, users), ObservedGeneration: rp.Generation}
		meta.SetStatusCondition(&st.Conditions, ready)
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionStalled)
	}

	if equality.Semantic.DeepEqual(before, st) {
		return ctrl.Result{}, nil
	}
	if err := applyStatus(ctx, r.Client, rp, &st); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("patching status: %w", err)
	}
	r.written.put(rp, st)
	recordTransition(r.Recorder, rp, meta.FindStatusCondition(before.Conditions, v1alpha1.ConditionReady), &ready)
	return ctrl.Result{}, nil
}

// endpoints counts the endpoints of the policy's namespace that refer to it.
func (r *RetryPolicyReconciler) endpoints(ctx context.Context, rp *v1alpha1.RetryPolicy) (int32, error) {
	list := &v1alpha1.WebhookEndpointList{}
	if err := r.Client.List(ctx, list, client.InNamespace(rp.Namespace), client.MatchingFields{indexRetryPolicy: rp.Name}); err != nil {
		return 0, err
	}
	n := int32(0)
	for _, ep := range list.Items {
		if ep.DeletionTimestamp.IsZero() {
			n++
		}
	}
	return n, nil
}
