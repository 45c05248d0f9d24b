package controllers

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
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
	// ReplayTTL is how long a completed WebhookReplay is kept before it is deleted; 0 keeps
	// it.
	ReplayTTL time.Duration
	// Namespace is the controller's own namespace: no endpoint may use a Secret there.
	Namespace string
	// DispatcherEgress, when set, gives every dispatcher an egress NetworkPolicy.
	DispatcherEgress *EgressPolicy
	// BusAuth says how dispatchers authenticate to NATS.
	BusAuth BusAuth
	// Autoscaling, when set, renders a KEDA ScaledObject for every dispatcher Deployment and
	// leaves its replicas to it.
	Autoscaling *Autoscaling
	// DispatcherOTELEnv are OTEL_* environment variables set on every dispatcher container:
	// the standard OpenTelemetry settings that turn on the dispatchers' traces (tracing.FromEnv).
	DispatcherOTELEnv []corev1.EnvVar
	// StorageCheckInterval is how often each namespace's dead-letter stream and delivery log
	// are read for the StorageLimitReached condition (DefaultStorageCheckInterval when 0).
	StorageCheckInterval time.Duration
	// RetentionInterval is how often payloads past their retention are removed
	// (DefaultRetentionInterval when 0).
	RetentionInterval time.Duration
}

// Field indexes on WebhookEndpoints.
const (
	indexDispatcher  = "webhook-operator.io/dispatcher"
	indexSecrets     = "webhook-operator.io/secrets"
	indexRetryPolicy = "webhook-operator.io/retry-policy"
	// indexReplayEndpoint indexes WebhookReplays by the endpoint they replay.
	indexReplayEndpoint = "webhook-operator.io/replay-endpoint"
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
			&appsv1.Deployment{}:          {Label: ours},
			&corev1.ServiceAccount{}:      {Label: ours},
			&rbacv1.Role{}:                {Label: ours},
			&rbacv1.RoleBinding{}:         {Label: ours},
			&networkingv1.NetworkPolicy{}: {Label: ours},
			&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{
				names.LabelName: names.LabelNameStreams, names.LabelManagedBy: names.LabelManagedByValue})},
		},
	}
}

// Setup registers the WebhookEndpoint, dispatcher, RetryPolicy and WebhookReplay reconcilers,
// their field indexes, and js's connection watcher with mgr. mgr's cache must use CacheOptions.
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
	js.bounds = QuotaBounds(mgr.GetClient())
	quotas := NewQuotaReconciler(mgr.GetClient(), rec, js, creator, opts)
	if err := quotas.SetupWithManager(mgr, copts); err != nil {
		return err
	}
	if err := NewErasureReconciler(mgr.GetClient(), rec, js).SetupWithManager(mgr, copts); err != nil {
		return err
	}
	if err := mgr.Add(newRetentionSweep(mgr.GetClient(), js, opts.RetentionInterval)); err != nil {
		return err
	}
	storage := newStorageWatch(js, mgr.GetClient(), opts.StorageCheckInterval)
	if err := mgr.Add(storage); err != nil {
		return err
	}
	endpoints := &EndpointReconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: rec, NATS: js, Options: opts,
		Sets:    creator,
		guard:   netguard.Policy{AllowHTTP: opts.Config.AllowHTTP, Allowed: opts.Config.AllowedCIDRs},
		backoff: newBackoff(natsRetryBase, natsRetryMax),
		storage: storage,
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
		// A source namespace that gives or withdraws its consent.
		WatchesMetadata(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return endpointsMatching(ctx, c, "", indexSources, o.GetName())
		})).
		// A namespace whose dead letters or delivery log reached or left their size bounds.
		WatchesRawSource(source.Channel(storage.changed, handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ string) []reconcile.Request {
			var out []reconcile.Request
			for _, ns := range storage.takeChanged() {
				out = append(out, endpointsMatching(ctx, c, ns, "", "")...)
			}
			return out
		}))).
		// Endpoints whose admission by their namespace's WebhookQuota changed.
		WatchesRawSource(source.Channel(quotas.changed, handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, string) []reconcile.Request {
			return quotas.takeChanged()
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
		Watches(&networkingv1.NetworkPolicy{}, byLabel).
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			switch {
			case natsSource != "" && o.GetNamespace()+"/"+o.GetName() == natsSource:
				return allDispatchers(ctx, c, "")
			case o.GetName() == names.NATSSecret && o.GetLabels()[names.LabelManagedBy] == names.LabelManagedByValue:
				return allDispatchers(ctx, c, o.GetNamespace())
			}
			// A referenced Secret that appears, or gives or withdraws its consent, changes
			// what the dispatchers of the endpoints referencing it may read.
			return dispatchersMatching(ctx, c, o.GetNamespace(), indexSecrets, o.GetName())
		})).
		WatchesRawSource(source.Channel(js.subscribe(), handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ string) []reconcile.Request {
			return allDispatchers(ctx, c, "")
		}))).
		WatchesMetadata(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return dispatchersMatching(ctx, c, "", indexSources, o.GetName())
		})).
		// Dedicated dispatchers of endpoints whose admission by the WebhookQuota changed.
		WatchesRawSource(source.Channel(quotas.dispatchersChanged, handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, string) []reconcile.Request {
			return quotas.takeChangedDispatchers()
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

	metricsAccess := &MetricsAccessReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}
	if err := metricsAccess.SetupWithManager(mgr); err != nil {
		return err
	}

	err = ctrl.NewControllerManagedBy(mgr).
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
	if err != nil {
		return err
	}

	return setupReplays(mgr, opts, js, copts)
}

// SetupReplays registers the WebhookReplay reconciler and its field index alone, for a process
// that runs replays only (Setup registers it with the others).
func SetupReplays(ctx context.Context, mgr ctrl.Manager, opts *Options, js *JetStream) error {
	if err := indexReplays(ctx, mgr); err != nil {
		return err
	}
	return setupReplays(mgr, opts, js, controller.Options{MaxConcurrentReconciles: max(opts.MaxConcurrentReconciles, 1)})
}

func setupReplays(mgr ctrl.Manager, opts *Options, js *JetStream, copts controller.Options) error {
	c := mgr.GetClient()
	replays := &ReplayReconciler{Client: c, APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(FieldManager), NATS: js, TTL: opts.ReplayTTL,
		backoff: newBackoff(natsRetryBase, natsRetryMax)}
	return ctrl.NewControllerManagedBy(mgr).
		Named("webhookreplay").
		// Status writes are the reconciler's own: creations start one, and a changed TTL
		// annotation.
		For(&v1alpha1.WebhookReplay{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		// A replay waiting for its endpoint goes on when it appears or is re-enabled.
		Watches(&v1alpha1.WebhookEndpoint{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return replaysOf(ctx, c, o.GetNamespace(), o.GetName())
		}), builder.WithPredicates(endpointAppearedOrEnabled())).
		WithOptions(copts).
		Complete(replays)
}

// replaysOf lists the WebhookReplays of an endpoint that are not complete.
func replaysOf(ctx context.Context, c client.Client, namespace, endpoint string) []reconcile.Request {
	list := &v1alpha1.WebhookReplayList{}
	if err := c.List(ctx, list, client.InNamespace(namespace), client.MatchingFields{indexReplayEndpoint: endpoint}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing replays to reconcile")
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if list.Items[i].Status.CompletedAt == nil {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

// endpointAppearedOrEnabled passes the endpoint events a waiting replay cares about: a
// creation, a deletion, and a change of the Disabled condition.
func endpointAppearedOrEnabled() predicate.Predicate {
	return predicate.Funcs{
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*v1alpha1.WebhookEndpoint), e.ObjectNew.(*v1alpha1.WebhookEndpoint)
			return meta.IsStatusConditionTrue(o.Status.Conditions, v1alpha1.ConditionDisabled) !=
				meta.IsStatusConditionTrue(n.Status.Conditions, v1alpha1.ConditionDisabled) ||
				o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
		},
	}
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
	if err := idx.IndexField(ctx, &v1alpha1.WebhookEndpoint{}, indexSources, ep(func(e *v1alpha1.WebhookEndpoint) []string {
		return e.Spec.SourceNamespaces
	})); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &v1alpha1.WebhookEndpoint{}, indexRetryPolicy, ep(func(e *v1alpha1.WebhookEndpoint) []string {
		if name := retryPolicyName(e); name != "" {
			return []string{name}
		}
		return nil
	})); err != nil {
		return err
	}
	return indexReplays(ctx, mgr)
}

func indexReplays(ctx context.Context, mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.WebhookReplay{}, indexReplayEndpoint, func(o client.Object) []string {
		return []string{o.(*v1alpha1.WebhookReplay).Spec.EndpointRef.Name}
	})
}

// endpointsMatching lists the endpoints of namespace ("" for all) whose index holds value
// (every endpoint when index is "").
func endpointsMatching(ctx context.Context, c client.Client, namespace, index, value string) []reconcile.Request {
	eps := listEndpoints(ctx, c, namespace, index, value)
	reqs := make([]reconcile.Request, len(eps))
	for i := range eps {
		reqs[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&eps[i])}
	}
	return reqs
}

// dispatchersMatching lists, each once, the dispatchers of the endpoints endpointsMatching
// would list.
func dispatchersMatching(ctx context.Context, c client.Client, namespace, index, value string) []reconcile.Request {
	seen := map[types.NamespacedName]bool{}
	var reqs []reconcile.Request
	for _, ep := range listEndpoints(ctx, c, namespace, index, value) {
		nn := types.NamespacedName{Namespace: ep.Namespace, Name: names.Dispatcher(&ep)}
		if !seen[nn] {
			seen[nn] = true
			reqs = append(reqs, reconcile.Request{NamespacedName: nn})
		}
	}
	return reqs
}

func listEndpoints(ctx context.Context, c client.Client, namespace, index, value string) []v1alpha1.WebhookEndpoint {
	list := &v1alpha1.WebhookEndpointList{}
	opts := []client.ListOption{client.InNamespace(namespace)}
	if index != "" {
		opts = append(opts, client.MatchingFields{index: value})
	}
	if err := c.List(ctx, list, opts...); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing endpoints to reconcile")
		return nil
	}
	return list.Items
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
