package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/shared"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/wake"
)

// The installation's shared dispatcher (Options.SharedDispatcher): one Deployment in the
// controller's namespace serves the endpoints of every namespace that has no dispatcher of its
// own, instead of a Deployment per namespace. The controller
//   - keeps, in each served namespace, the dispatcher ServiceAccount, Role and RoleBinding as
//     before (the namespace's identity: its endpoints, the Secrets that consent, its bus
//     permissions through the auth callout), and a Role and RoleBinding (tokenGrant) that let
//     the shared dispatcher's ServiceAccount create that ServiceAccount's tokens, nothing more;
//   - lists the served namespaces in the pool ConfigMap, which the shared dispatcher follows;
//   - removes a namespace's own Deployment once the shared one is available, and makes it
//     again when the namespace leaves the pool (names.LabelOwnDispatcher, or the option
//     turned off). Both serving a namespace meanwhile is what a rolling update does: the
//     partition leases keep single-active deliveries single.

// poolWaitWhileMoving is how soon a namespace moving into the pool is looked at again while the
// shared dispatcher is not available yet.
const poolWaitWhileMoving = 5 * time.Second

// poolRequest is the reconcile request of the shared dispatcher's own objects.
func (o *Options) poolRequest() reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.Namespace, Name: names.SharedPool}}
}

// isPool says whether a dispatcher request is the shared dispatcher's.
func (o *Options) isPool(namespace, name string) bool {
	return name == names.SharedPool && namespace == o.Namespace
}

// pooled says whether the shared dispatcher serves namespace ns's endpoints that have no
// dedicated dispatcher: with the option on, unless the namespace asks for its own.
func (o *Options) pooled(ctx context.Context, c client.Reader, ns string) (bool, error) {
	if !o.SharedDispatcher || o.exclusion(ns) != "" {
		return false, nil
	}
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	if err := c.Get(ctx, types.NamespacedName{Name: ns}, m); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}
	return m.GetLabels()[names.LabelOwnDispatcher] != "true", nil
}

// poolDeployment reads the shared dispatcher's Deployment; nil when there is none.
func (o *Options) poolDeployment(ctx context.Context, c client.Reader) (*appsv1.Deployment, error) {
	dep := &appsv1.Deployment{}
	if err := c.Get(ctx, o.poolRequest().NamespacedName, dep); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return dep, nil
}

// reconcilePool keeps the shared dispatcher's objects in the controller's namespace: its
// ConfigMap of served namespaces, ServiceAccount, Role, RoleBinding, egress policy and
// Deployment, and the mirrors its pods mount; all removed when the option is off or no
// namespace is left to serve.
func (r *DispatcherReconciler) reconcilePool(ctx context.Context) (ctrl.Result, error) {
	o := r.Options
	var served []shared.Entry
	if o.SharedDispatcher {
		var err error
		if served, err = r.pooledNamespaces(ctx); err != nil {
			return ctrl.Result{}, err
		}
	}
	if len(served) == 0 {
		return ctrl.Result{}, r.removePool(ctx)
	}
	d, err := r.desired(ctx, o.Namespace, names.SharedPool, nil)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.applyMirrors(ctx, d); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.applier.apply(ctx, &corev1.ConfigMap{}, d.poolConfigMap(served)); err != nil {
		return ctrl.Result{}, fmt.Errorf("the shared dispatcher's ConfigMap: %w", err)
	}
	if err := r.applyIdentity(ctx, d); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.reconcileEgress(ctx, d); err != nil {
		return ctrl.Result{}, fmt.Errorf("network policy: %w", err)
	}
	if err := r.applier.apply(ctx, &appsv1.Deployment{}, d.deployment()); err != nil {
		return ctrl.Result{}, fmt.Errorf("deployment: %w", err)
	}
	return ctrl.Result{}, nil
}

// removePool deletes the shared dispatcher's objects and the mirrors its pods mounted.
func (r *DispatcherReconciler) removePool(ctx context.Context) error {
	ns := r.Options.Namespace
	for _, obj := range []client.Object{&appsv1.Deployment{}, &networkingv1.NetworkPolicy{}, &rbacv1.RoleBinding{}, &rbacv1.Role{}, &corev1.ServiceAccount{}, &corev1.ConfigMap{}} {
		obj.SetNamespace(ns)
		obj.SetName(names.SharedPool)
		if err := r.delete(ctx, obj); err != nil {
			return err
		}
	}
	for _, name := range []string{names.NATSSecret, names.OTELSecret, names.EgressProxySecret, names.MetricsCASecret} {
		if err := r.delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			return err
		}
	}
	return nil
}

// pooledNamespaces are the namespaces the shared dispatcher serves: those with an endpoint
// their namespace's shared dispatcher would serve (served, and admitted by the namespace's
// quota, as endpointsOf says), that do not ask for their own; each with the digest of what its
// dispatcher acts on of its served endpoints (a change wakes it if it sleeps) and whether it
// may sleep (wake.MaySleep). One read of the cache for every namespace, its objects not copied
// (they are only read here): it runs on every endpoint change.
func (r *DispatcherReconciler) pooledNamespaces(ctx context.Context) ([]shared.Entry, error) {
	list := &v1alpha1.WebhookEndpointList{}
	if err := r.Client.List(ctx, list, client.MatchingFields{indexDispatcher: names.SharedDispatcher}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	byNamespace := map[string][]*v1alpha1.WebhookEndpoint{}
	for i := range list.Items {
		if ep := &list.Items[i]; served(ep) {
			byNamespace[ep.Namespace] = append(byNamespace[ep.Namespace], ep)
		}
	}
	var out []shared.Entry
	for ns, eps := range byNamespace {
		ok, err := r.Options.pooled(ctx, r.Client, ns)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		admitted, err := r.Options.admitted(ctx, r.Client, ns, eps)
		if err != nil {
			return nil, err
		}
		if len(admitted) > 0 {
			out = append(out, shared.Entry{Namespace: ns, Digest: wake.Digest(eps), Awake: !wake.MaySleep(eps)})
		}
	}
	slices.SortFunc(out, func(a, b shared.Entry) int { return strings.Compare(a.Namespace, b.Namespace) })
	return out, nil
}

// joinPool makes namespace's shared dispatcher the pool's: the grant that lets the shared
// dispatcher create the namespace's tokens, and the namespace's own Deployment (and its
// ScaledObject and egress policy) removed once the shared one is available. It says how soon
// to look again (0: not needed).
func (r *DispatcherReconciler) joinPool(ctx context.Context, namespace string) (time.Duration, error) {
	role, binding := tokenGrant(namespace, r.Options.Namespace)
	if err := r.applier.apply(ctx, &rbacv1.Role{}, role); err != nil {
		return 0, fmt.Errorf("the shared dispatcher's token grant: %w", err)
	}
	if err := r.applier.apply(ctx, &rbacv1.RoleBinding{}, binding); err != nil {
		return 0, fmt.Errorf("the shared dispatcher's token grant: %w", err)
	}
	own := &appsv1.Deployment{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: names.SharedDispatcher}, own); err != nil {
		return 0, client.IgnoreNotFound(err)
	}
	pool, err := r.Options.poolDeployment(ctx, r.Client)
	if err != nil {
		return 0, err
	}
	if pool == nil || pool.Status.AvailableReplicas == 0 || !rolledOut(pool) {
		// The namespace's own Deployment serves it until the shared one can.
		ctrl.LoggerFrom(ctx).Info("the namespace moves to the shared dispatcher once it is available; its own Deployment serves it meanwhile")
		return poolWaitWhileMoving, nil
	}
	if r.Options.Autoscaling != nil {
		if err := r.deleteScaledObject(ctx, namespace, names.SharedDispatcher); err != nil {
			return 0, err
		}
		r.takeBackReplicas(namespace, names.SharedDispatcher)
	}
	for _, obj := range []client.Object{&appsv1.Deployment{}, &networkingv1.NetworkPolicy{}} {
		obj.SetNamespace(namespace)
		obj.SetName(names.SharedDispatcher)
		if err := r.delete(ctx, obj); err != nil {
			return 0, err
		}
	}
	ctrl.LoggerFrom(ctx).Info("the shared dispatcher serves the namespace: its own Deployment is removed")
	return 0, nil
}

// leavePool removes the grant that let the shared dispatcher create namespace's tokens.
func (r *DispatcherReconciler) leavePool(ctx context.Context, namespace string) error {
	for _, obj := range []client.Object{&rbacv1.RoleBinding{}, &rbacv1.Role{}} {
		obj.SetNamespace(namespace)
		obj.SetName(names.SharedPool)
		if err := r.delete(ctx, obj); err != nil {
			return err
		}
	}
	return nil
}
