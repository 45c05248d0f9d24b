package controllers

import (
	"context"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
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
// ServiceAccounts: those the controller made, for the dispatchers the endpoints need. It is
// the binding's one writer: every change of a dispatcher ServiceAccount or of an endpoint
// enqueues the same request.
type MetricsAccessReconciler struct {
	Client client.Client
	// APIReader reads the binding without caching every ClusterRoleBinding of the cluster.
	APIReader client.Reader
	// Options says which namespaces the controller serves.
	Options *Options
}

// SetupWithManager registers the reconciler with mgr.
func (r *MetricsAccessReconciler) SetupWithManager(mgr ctrl.Manager) error {
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: DispatcherMetricsBinding}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("metricsaccess").
		Watches(&corev1.ServiceAccount{}, one).
		Watches(&v1alpha1.WebhookEndpoint{}, one, builder.WithPredicates(specOrDeletionChanged())).
		Complete(r)
}

// Reconcile writes the binding's subjects when they differ from the dispatchers'
// ServiceAccounts. A missing binding (an installation without secure metrics) is left alone.
func (r *MetricsAccessReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	want, err := r.dispatcherServiceAccounts(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
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

// dispatcherServiceAccounts are the subjects the binding should have, sorted: the
// ServiceAccounts that are the controller's own dispatchers'. The dispatcher labels say
// nothing (a tenant may set them on a ServiceAccount of its own); an account counts only when
// an endpoint of a namespace the controller serves needs a dispatcher of its name (while it
// lives, and while deleted as long as its dispatcher serves it, see served), it is labelled as
// that dispatcher's, and it is owned as the controller makes it: a dedicated
// dispatcher's by its endpoint (that endpoint's UID), the shared one by nothing.
func (r *MetricsAccessReconciler) dispatcherServiceAccounts(ctx context.Context) ([]rbacv1.Subject, error) {
	eps := &v1alpha1.WebhookEndpointList{}
	if err := r.Client.List(ctx, eps); err != nil {
		return nil, err
	}
	needed := map[types.NamespacedName]types.UID{} // dispatcher -> its endpoint's UID, "" for a shared one
	for i := range eps.Items {
		ep := &eps.Items[i]
		if !served(ep) || r.Options.exclusion(ep.Namespace) != "" {
			continue
		}
		var owner types.UID
		if names.Dedicated(ep) {
			owner = ep.UID
		}
		needed[types.NamespacedName{Namespace: ep.Namespace, Name: names.Dispatcher(ep)}] = owner
	}
	sas := &corev1.ServiceAccountList{}
	if err := r.Client.List(ctx, sas, client.MatchingLabels{names.LabelName: names.LabelNameValue, names.LabelManagedBy: names.LabelManagedByValue}); err != nil {
		return nil, err
	}
	want := []rbacv1.Subject{}
	for i := range sas.Items {
		sa := &sas.Items[i]
		owner, ok := needed[client.ObjectKeyFromObject(sa)]
		if !ok || !sa.DeletionTimestamp.IsZero() || sa.Labels[names.LabelDispatcher] != sa.Name {
			continue
		}
		controller := metav1.GetControllerOf(sa)
		switch {
		case owner == "" && controller != nil:
			continue
		case owner != "" && (controller == nil || controller.Kind != "WebhookEndpoint" || controller.UID != owner ||
			controller.APIVersion != v1alpha1.GroupVersion.String()):
			continue
		}
		want = append(want, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name})
	}
	sortSubjects(want)
	return want, nil
}
func sortSubjects(s []rbacv1.Subject) {
	slices.SortFunc(s, func(a, b rbacv1.Subject) int {
		return strings.Compare(a.Namespace+"/"+a.Name+"/"+a.Kind, b.Namespace+"/"+b.Name+"/"+b.Kind)
	})
}
