package controllers

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
)

// Options configure the reconcilers.
type Options struct {
	// Config is the installation-wide configuration, shared with dispatchers.
	Config opconfig.Config
	// DispatcherImage runs dispatchers: the controller's own image.
	DispatcherImage string
	// DispatcherReplicas of a shared dispatcher, and of a dedicated one without spec.dispatcher.replicas.
	DispatcherReplicas int32
	// DispatcherResources of a shared dispatcher, and of a dedicated one without spec.dispatcher.resources.
	DispatcherResources corev1.ResourceRequirements
	// MaxConcurrentReconciles per controller.
	MaxConcurrentReconciles int
	// BusAuth says how dispatchers authenticate to NATS.
	BusAuth BusAuth
	// Autoscaling, when set, renders a KEDA ScaledObject for every dispatcher Deployment and
	// leaves its replicas to it.
	Autoscaling *Autoscaling
}

// Field indexes on WebhookEndpoints.
const (
	indexDispatcher  = "webhook-operator.io/dispatcher"
	indexSecrets     = "webhook-operator.io/secrets"
	indexRetryPolicy = "webhook-operator.io/retry-policy"
)

// natsRetryBase and natsRetryMax bound the backoff of reconciles waiting for NATS.
const (
	natsRetryBase = time.Second
	natsRetryMax  = time.Minute
)

// CacheOptions keeps the controller's memory small: of Deployments, ServiceAccounts, Roles and
// RoleBindings it caches only the dispatchers' own, of ConfigMaps only the streams ConfigMaps, Secrets are watched by metadata only (see
// Setup), and no object's managedFields are kept.
func CacheOptions() cache.Options {
	ours := labels.SelectorFromSet(labels.Set{names.LabelName: names.LabelNameValue, names.LabelManagedBy: names.LabelManagedByValue})
	return cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&appsv1.Deployment{}:     {Label: ours},
			&corev1.ServiceAccount{}: {Label: ours},
			&rbacv1.Role{}:           {Label: ours},
			&rbacv1.RoleBinding{}:    {Label: ours},
			&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{
				names.LabelName: names.LabelNameStreams, names.LabelManagedBy: names.LabelManagedByValue})},
		},
	}
}

// Setup registers the WebhookEndpoint, dispatcher and RetryPolicy reconcilers, their field
// indexes, and js's connection watcher with mgr. mgr's cache must use CacheOptions.
func Setup(ctx context.Context, mgr ctrl.Manager, opts *Options, js *JetStream) error {
	if err := setupIndexes(ctx, mgr); err != nil {
		return err
	}
	if err := mgr.Add(js); err != nil {
		return err
	}
	rec := mgr.GetEventRecorder(FieldManager)
	copts := controller.Options{MaxConcurrentReconciles: max(opts.MaxConcurrentReconciles, 1)}

	sets := &StreamSets{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: rec, NATS: js}
	creator := &StreamSetCreator{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), NATS: js}
	dispatchers := &DispatcherReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), NATS: js, Sets: creator, Options: opts,
		applier: newApplier(mgr.GetClient()), backoff: newBackoff(natsRetryBase, natsRetryMax),
		handedOver: map[string]bool{},
	}
	if opts.Autoscaling != nil {
		if err := checkScaledObjectsServed(mgr.GetRESTMapper()); err != nil {
			return err
		}
	} else if err := mgr.Add(manager.RunnableFunc(removeScaledObjects(mgr.GetClient()))); err != nil {
		return err
	}
	endpoints := &EndpointReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: rec, NATS: js, Options: opts,
		Sets:    creator,
		guard:   netguard.Policy{AllowHTTP: opts.Config.AllowHTTP, Allowed: opts.Config.AllowedCIDRs},
		backoff: newBackoff(natsRetryBase, natsRetryMax),
	}
	policies := &RetryPolicyReconciler{Client: mgr.GetClient(), Recorder: rec}
	c := mgr.GetClient()

	err := ctrl.NewControllerManagedBy(mgr).
		Named("webhookendpoint").
		For(&v1alpha1.WebhookEndpoint{}, builder.WithPredicates(specOrDeletionChanged())).
		Watches(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return endpointsMatching(ctx, c, o.GetNamespace(), indexDispatcher, o.GetName())
		}), builder.WithPredicates(availabilityChanged())).
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return endpointsMatching(ctx, c, o.GetNamespace(), indexSecrets, o.GetName())
		})).
		Watches(&v1alpha1.RetryPolicy{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return endpointsMatching(ctx, c, o.GetNamespace(), indexRetryPolicy, o.GetName())
		}), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(js.subscribe(), handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ string) []reconcile.Request {
			return endpointsMatching(ctx, c, "", "", "")
		}))).
		// A streams ConfigMap deleted while the namespace keeps its endpoints is created again.
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return endpointsMatching(ctx, c, o.GetNamespace(), "", "")
		}), builder.WithPredicates(deletions())).
		WithOptions(copts).
		Complete(endpoints)
	if err != nil {
		return err
	}

	byLabel := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if name := o.GetLabels()[names.LabelDispatcher]; name != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
		}
		return nil
	})
	natsSource := opts.Config.NATS.CredentialsSecret
	err = ctrl.NewControllerManagedBy(mgr).
		Named("dispatcher").
		Watches(&v1alpha1.WebhookEndpoint{}, oldAndNew(func(o client.Object) []reconcile.Request {
			ep := o.(*v1alpha1.WebhookEndpoint)
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ep.Namespace, Name: names.Dispatcher(ep)}}}
		}), builder.WithPredicates(specOrDeletionChanged())).
		Watches(&appsv1.Deployment{}, byLabel, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		Watches(&corev1.ServiceAccount{}, byLabel).
		Watches(&rbacv1.Role{}, byLabel).
		Watches(&rbacv1.RoleBinding{}, byLabel).
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			switch {
			case natsSource != "" && o.GetNamespace()+"/"+o.GetName() == natsSource:
				return allDispatchers(ctx, c, "")
			case o.GetName() == names.NATSSecret && o.GetLabels()[names.LabelManagedBy] == names.LabelManagedByValue:
				return allDispatchers(ctx, c, o.GetNamespace())
			}
			return nil
		})).
		WatchesRawSource(source.Channel(js.subscribe(), handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ string) []reconcile.Request {
			return allDispatchers(ctx, c, "")
		}))).
		WithOptions(copts).
		Complete(dispatchers)
	if err != nil {
		return err
	}

	err = ctrl.NewControllerManagedBy(mgr).
		Named("streams").
		For(&corev1.ConfigMap{}).
		// A deleted endpoint may be the last one a deleted streams ConfigMap waits for.
		Watches(&v1alpha1.WebhookEndpoint{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: names.StreamsConfigMap}}}
		}), builder.WithPredicates(deletions())).
		WithOptions(copts).
		Complete(sets)
	if err != nil {
		return err
	}

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
		WithOptions(copts).
		Complete(policies)
}

func setupIndexes(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	ep := func(f func(*v1alpha1.WebhookEndpoint) []string) client.IndexerFunc {
		return func(o client.Object) []string { return f(o.(*v1alpha1.WebhookEndpoint)) }
	}
	if err := idx.IndexField(ctx, &v1alpha1.WebhookEndpoint{}, indexDispatcher, ep(func(e *v1alpha1.WebhookEndpoint) []string {
		return []string{names.Dispatcher(e)}
	})); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &v1alpha1.WebhookEndpoint{}, indexSecrets, ep(func(e *v1alpha1.WebhookEndpoint) []string {
		refs := referencedSecrets(e)
		names := make([]string, len(refs))
		for i, r := range refs {
			names[i] = r.Name
		}
		return names
	})); err != nil {
		return err
	}
	return idx.IndexField(ctx, &v1alpha1.WebhookEndpoint{}, indexRetryPolicy, ep(func(e *v1alpha1.WebhookEndpoint) []string {
		if name := retryPolicyName(e); name != "" {
			return []string{name}
		}
		return nil
	}))
}

// endpointsMatching lists the endpoints of namespace ("" for all) whose index holds value
// (every endpoint when index is "").
func endpointsMatching(ctx context.Context, c client.Client, namespace, index, value string) []reconcile.Request {
	list := &v1alpha1.WebhookEndpointList{}
	opts := []client.ListOption{client.InNamespace(namespace)}
	if index != "" {
		opts = append(opts, client.MatchingFields{index: value})
	}
	if err := c.List(ctx, list, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing endpoints to reconcile")
		return nil
	}
	reqs := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		reqs[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
	}
	return reqs
}

// allDispatchers lists every dispatcher of namespace ("" for all): those endpoints need and
// those that exist.
func allDispatchers(ctx context.Context, c client.Client, namespace string) []reconcile.Request {
	seen := map[types.NamespacedName]bool{}
	eps := &v1alpha1.WebhookEndpointList{}
	if err := c.List(ctx, eps, client.InNamespace(namespace)); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing endpoints to reconcile their dispatchers")
	}
	for i := range eps.Items {
		seen[types.NamespacedName{Namespace: eps.Items[i].Namespace, Name: names.Dispatcher(&eps.Items[i])}] = true
	}
	deps := &appsv1.DeploymentList{}
	if err := c.List(ctx, deps, client.InNamespace(namespace)); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing dispatchers")
	}
	for _, d := range deps.Items {
		if name := d.Labels[names.LabelDispatcher]; name != "" {
			seen[types.NamespacedName{Namespace: d.Namespace, Name: name}] = true
		}
	}
	reqs := make([]reconcile.Request, 0, len(seen))
	for nn := range seen {
		reqs = append(reqs, reconcile.Request{NamespacedName: nn})
	}
	return reqs
}

// specOrDeletionChanged passes creations, deletions, spec changes and the start of a deletion;
// status-only and finalizer updates do not need a reconcile.
func specOrDeletionChanged() predicate.Predicate {
	return predicate.Or(predicate.GenerationChangedPredicate{}, predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
		},
	})
}

// deletions passes delete events only.
func deletions() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// availabilityChanged passes Deployment events that can change an endpoint's readiness.
func availabilityChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*appsv1.Deployment), e.ObjectNew.(*appsv1.Deployment)
		return o.Status.AvailableReplicas != n.Status.AvailableReplicas ||
			!equalReplicas(o.Spec.Replicas, n.Spec.Replicas) ||
			o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
	}}
}

func equalReplicas(a, b *int32) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// oldAndNew enqueues what f maps an object to, on an update for both its old and its new
// version, so a change of reference (a policy, a dispatcher) reaches the one it left too.
func oldAndNew(f func(client.Object) []reconcile.Request) handler.EventHandler {
	add := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], reqs []reconcile.Request) {
		for _, r := range reqs {
			q.Add(r)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, f(e.Object))
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, f(e.ObjectOld))
			add(q, f(e.ObjectNew))
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, f(e.Object))
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, f(e.Object))
		},
	}
}
