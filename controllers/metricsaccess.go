package controllers

import (
	"context"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/webhook-operator/webhook-operator/internal/names"
)

// DispatcherMetricsBinding is the ClusterRoleBinding, installed with the operator (chart,
// config/rbac), of the ClusterRole of the same name that lets its subjects create TokenReviews
// and SubjectAccessReviews: what a dispatcher needs to authenticate and authorize the scrapes
// of its /metrics (metricsauth). The controller keeps its subjects equal to the dispatchers'
// ServiceAccounts; it may get and update that one binding only (resourceNames), and holds the
// ClusterRole's permissions itself (for its own /metrics), so it never needs to create or bind
// anything cluster-wide.
const DispatcherMetricsBinding = "webhook-operator-dispatcher-metrics"

// metricsAccessResync re-checks the binding now and then: an installer's `helm upgrade --force`
// may have reset its subjects.
const metricsAccessResync = 10 * time.Minute

// MetricsAccessReconciler keeps DispatcherMetricsBinding's subjects equal to the dispatchers'
// ServiceAccounts. It is the binding's one writer: every change of a dispatcher ServiceAccount
// enqueues the same request.
type MetricsAccessReconciler struct {
	Client client.Client
	// APIReader reads the binding without caching every ClusterRoleBinding of the cluster.
	APIReader client.Reader
}

// SetupWithManager registers the reconciler.
func (r *MetricsAccessReconciler) SetupWithManager(mgr manager.Manager) error {
	one := []reconcile.Request{{NamespacedName: types.NamespacedName{Name: DispatcherMetricsBinding}}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("metricsaccess").
		Watches(&corev1.ServiceAccount{}, handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request { return one })).
		Complete(r)
}

// Reconcile writes the binding's subjects when they differ from the dispatchers'
// ServiceAccounts. A missing binding (an installation without secure metrics) is left alone.
func (r *MetricsAccessReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	sas := &corev1.ServiceAccountList{}
	if err := r.Client.List(ctx, sas, client.MatchingLabels{names.LabelName: names.LabelNameValue, names.LabelManagedBy: names.LabelManagedByValue}); err != nil {
		return reconcile.Result{}, err
	}
	want := make([]rbacv1.Subject, 0, len(sas.Items))
	for _, sa := range sas.Items {
		if sa.DeletionTimestamp.IsZero() {
			want = append(want, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name})
		}
	}
	sortSubjects(want)
	crb := &rbacv1.ClusterRoleBinding{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Name: DispatcherMetricsBinding}, crb); err != nil {
		if apierrors.IsNotFound(err) {
			log.FromContext(ctx).V(1).Info("no ClusterRoleBinding for the dispatchers' metrics authentication; dispatchers with --metrics-secure cannot check scrapers", "name", DispatcherMetricsBinding)
			return reconcile.Result{RequeueAfter: metricsAccessResync}, nil
		}
		return reconcile.Result{}, err
	}
	have := slices.Clone(crb.Subjects)
	sortSubjects(have)
	if slices.Equal(have, want) {
		return reconcile.Result{RequeueAfter: metricsAccessResync}, nil
	}
	crb.Subjects = want
	if err := r.Client.Update(ctx, crb); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: metricsAccessResync}, nil
}

func sortSubjects(s []rbacv1.Subject) {
	slices.SortFunc(s, func(a, b rbacv1.Subject) int {
		return strings.Compare(a.Namespace+"/"+a.Name+"/"+a.Kind, b.Namespace+"/"+b.Name+"/"+b.Kind)
	})
}
