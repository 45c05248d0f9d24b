package controllers

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
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
	// MaxConcurrentReconciles is how many policies are reconciled at once (1 when 0).
	MaxConcurrentReconciles int

	status *statusWriter[v1alpha1.RetryPolicyStatus]
}

// SetupWithManager registers the reconciler with mgr: spec changes of policies, and every
// endpoint that starts or stops using one (before and after a change). The endpoint field
// indexes (IndexEndpoints) must be registered first.
func (r *RetryPolicyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.status = &statusWriter[v1alpha1.RetryPolicyStatus]{client: r.Client, recorder: r.Recorder}
	return ctrl.NewControllerManagedBy(mgr).
		Named("retrypolicy").
		For(&v1alpha1.RetryPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.WebhookEndpoint{}, oldAndNew(func(o client.Object) []reconcile.Request {
			ep := o.(*v1alpha1.WebhookEndpoint)
			if name := retryPolicyName(ep); name != "" {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ep.Namespace, Name: name}}}
			}
			return nil
		}), builder.WithPredicates(specOrDeletionChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1)}).
		Complete(r)
}

// Reconcile computes the policy's status and applies it when it changed. Its one problem is an
// invalid policy (Stalled InvalidSpec: only a change of the policy helps).
func (r *RetryPolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	rp := &v1alpha1.RetryPolicy{}
	if err := r.Client.Get(ctx, req.NamespacedName, rp); err != nil {
		if apierrors.IsNotFound(err) {
			r.status.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	cached := rp.Status
	cached.Conditions = nil
	for _, c := range rp.Status.Conditions {
		if c.Type == v1alpha1.ConditionReady || c.Type == v1alpha1.ConditionReconciling || c.Type == v1alpha1.ConditionStalled {
			cached.Conditions = append(cached.Conditions, c)
		}
	}
	before, ok := r.status.last(rp, cached)
	if !ok {
		before = cached
	}
	st := before
	var found problems
	users, err := r.endpoints(ctx, rp)
	if err == nil {
		st = v1alpha1.RetryPolicyStatus{ObservedGeneration: rp.Generation, Endpoints: users}
		if p, perr := policy.FromSpec(&rp.Spec); perr != nil {
			found.stall(v1alpha1.ReasonInvalidSpec, "%s", perr.Error())
		} else {
			st.MaxAttempts, st.Summary = int32(p.MaxAttempts), p.Summary()
		}
	}
	v := summarize(err, found.found(), func() verdict {
		return verdict{ready: conditions.True(v1alpha1.ConditionReady, v1alpha1.ReasonReady,
			fmt.Sprintf("%d attempts (%s); used by %d endpoints", st.MaxAttempts, st.Summary, users))}
	})
	// Ready always; Reconciling and Stalled only while true.
	st.Conditions = conditions.Set(before.Conditions, rp.Generation, time.Now(), v.ready, v.reconciling, v.stalled)
	return r.status.finish(ctx, rp, ending[v1alpha1.RetryPolicyStatus]{
		before: before, status: st, was: before.Conditions, announce: []*metav1.Condition{v.ready},
		apply: policyStatus(rp, &st), problem: found.found(), err: err,
	})
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
