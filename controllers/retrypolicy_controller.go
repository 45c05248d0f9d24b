package controllers

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	acv1alpha1 "github.com/webhook-operator/webhook-operator/api/applyconfiguration/api/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
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
	var ready, stalled *metav1.Condition
	p, perr := policy.FromSpec(&rp.Spec)
	if perr != nil {
		ready = conditions.False(v1alpha1.ConditionReady, v1alpha1.ReasonInvalidSpec, perr.Error())
		stalled = conditions.True(v1alpha1.ConditionStalled, v1alpha1.ReasonInvalidSpec, perr.Error())
	} else {
		st.MaxAttempts, st.Summary = int32(p.MaxAttempts), p.Summary()
		ready = conditions.True(v1alpha1.ConditionReady, v1alpha1.ReasonReady,
			fmt.Sprintf("%d attempts (%s); used by %d endpoints", p.MaxAttempts, st.Summary, users))
	}
	// Ready always; Stalled only while the policy is invalid.
	st.Conditions = conditions.Set(before.Conditions, rp.Generation, time.Now(), ready, stalled)

	if equality.Semantic.DeepEqual(before, st) {
		return ctrl.Result{}, nil
	}
	if err := r.Client.Status().Apply(ctx, policyStatus(rp, &st), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("patching status: %w", err)
	}
	r.written.put(rp, st)
	recordTransition(r.Recorder, rp, meta.FindStatusCondition(before.Conditions, v1alpha1.ConditionReady), ready)
	return ctrl.Result{}, nil
}

// policyStatus is the apply configuration of a policy's status; the controller is its only
// writer. An empty optional field is left out, which removes it.
func policyStatus(rp *v1alpha1.RetryPolicy, st *v1alpha1.RetryPolicyStatus) *acv1alpha1.RetryPolicyApplyConfiguration {
	s := acv1alpha1.RetryPolicyStatus().
		WithObservedGeneration(st.ObservedGeneration).
		WithConditions(conditions.Apply(st.Conditions)...).
		WithEndpoints(st.Endpoints)
	if st.MaxAttempts != 0 {
		s.WithMaxAttempts(st.MaxAttempts)
	}
	if st.Summary != "" {
		s.WithSummary(st.Summary)
	}
	return acv1alpha1.RetryPolicy(rp.Name, rp.Namespace).WithStatus(s)
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
