package controllers

import (
	"context"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
)

// Options configure the reconcilers.
type Options struct {
	// Config is the installation-wide configuration, shared with dispatchers.
	Config opconfig.Config
	// DispatcherImage runs dispatchers: the controller's own image.
	DispatcherImage string
	// DispatcherReplicas of a shared dispatcher, and of a dedicated one without spec.dispatcher.replicas.
	DispatcherReplicas int32
	// DispatcherResources of a shared dispatcher, and of a dedicated one without spec.dispatcher.resources;
	// their limits are also the limits of a dedicated one that sets none.
	DispatcherResources corev1.ResourceRequirements
	// DispatcherCaps bound what an endpoint may ask of its dedicated dispatcher.
	DispatcherCaps DispatcherCaps
	// MaxEndpointsPerNamespace bounds the endpoints of a namespace whose WebhookQuota sets no
	// spec.maxEndpoints, or that has none (--max-endpoints-per-namespace), as a quota's
	// maxEndpoints does; 0 leaves them unbounded.
	MaxEndpointsPerNamespace int32
	// MaxConcurrentReconciles per controller.
	MaxConcurrentReconciles int
	// ReplayTTL is how long a completed WebhookReplay is kept before it is deleted; 0 keeps
	// it.
	ReplayTTL time.Duration
	// Namespace is the controller's own namespace: no endpoint may use a Secret there, and
	// none is served there (see ExcludedNamespaces).
	Namespace string
	// ExcludedNamespaces are the namespaces the controller never acts in (the installation's
	// --excluded-namespaces: kube-system and the like), besides its own: an endpoint there is
	// Stalled NamespaceExcluded and gets nothing, and no endpoint reads their events. The
	// admission policy refuses the controller's objects there as well (config/admission).
	ExcludedNamespaces []string
	// DispatcherEgress, when set, gives every dispatcher an egress NetworkPolicy.
	DispatcherEgress *EgressPolicy
	// BusAuth says how dispatchers authenticate to NATS.
	BusAuth BusAuth
	// SharedDispatcher serves every namespace's endpoints that have no dedicated dispatcher
	// with the installation's shared dispatcher (names.SharedPool, a Deployment in Namespace),
	// each namespace under its own dispatcher ServiceAccount's tokens, instead of a Deployment
	// in each namespace; a namespace labelled names.LabelOwnDispatcher "true" keeps one of its
	// own. It needs BusAuth.Callout.
	SharedDispatcher bool
	// SharedIdleAfter is how long the shared dispatcher lets a namespace idle before it stops
	// serving it until something arrives (its --idle-after; 0: never).
	SharedIdleAfter time.Duration
	// Autoscaling, when set, renders a KEDA ScaledObject for every dispatcher Deployment and
	// leaves its replicas to it.
	Autoscaling *Autoscaling
	// DispatcherOTELEnv are OTEL_* environment variables set on every dispatcher container:
	// the standard OpenTelemetry settings that turn on the dispatchers' traces (tracing.FromEnv).
	// They show in every dispatcher's pod template: none may be a secret (OTELSecretOnly).
	DispatcherOTELEnv []corev1.EnvVar
	// DispatcherOTELSecret, when its Name is set, is a Secret of the controller's namespace
	// whose OTEL_* keys reach every dispatcher by reference and whose ca.crt, tls.crt and
	// tls.key are mounted for OTEL_EXPORTER_OTLP_CERTIFICATE, _CLIENT_CERTIFICATE and
	// _CLIENT_KEY; the controller mirrors it (those keys only) into each dispatcher namespace
	// as names.OTELSecret.
	DispatcherOTELSecret types.NamespacedName
	// EgressProxySecret, when its Name is set, is a Secret of the controller's namespace with
	// the username and password of the installation's egress proxy (Config.EgressProxy); the
	// controller mirrors those two keys into each dispatcher namespace as
	// names.EgressProxySecret, mounted where the dispatcher reads them at every new tunnel.
	EgressProxySecret types.NamespacedName
	// DispatcherMetricsCA, when its Name is set, is a Secret of the controller's namespace
	// whose ca.crt is the scraper CA's certificate: with Config.MetricsSecure, dispatchers serve
	// /metrics over mutual TLS to client certificates that CA signed (metricsauth.ClientCerts),
	// asking the API server nothing. The controller mirrors ca.crt alone into each dispatcher
	// namespace as names.MetricsCASecret; the scraper's key stays where the scraper is.
	DispatcherMetricsCA types.NamespacedName
	// DispatcherMetricsClientName, when not empty, is the subject common name the scraper's
	// client certificate must carry.
	DispatcherMetricsClientName string
	// StorageCheckInterval is how often each namespace's dead-letter stream and delivery log
	// are read for the StorageLimitReached condition (DefaultStorageCheckInterval when 0).
	StorageCheckInterval time.Duration
	// RetentionInterval is how often payloads past their retention are removed
	// (DefaultRetentionInterval when 0).
	RetentionInterval time.Duration
	// MaxErasures and MaxErasuresPerNamespace bound the WebhookErasures in progress at once,
	// in all and in one namespace (DefaultMaxErasures and DefaultMaxErasuresPerNamespace
	// when 0); the others wait, Queued.
	MaxErasures, MaxErasuresPerNamespace int
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

// CacheOptions keeps the controller's memory small and free of Secret data: of Deployments,
// ServiceAccounts, Roles and RoleBindings it caches only the dispatchers' own, of ConfigMaps
// only the streams ConfigMaps, Secrets are watched by metadata only (the endpoint and
// dispatcher reconcilers' WatchesMetadata) and stripped to what is read of them
// (secretMetadataOnly), and no object's managedFields or last-applied copy are kept
// (scheme.StripApplied).
func CacheOptions() cache.Options {
	ours := labels.SelectorFromSet(labels.Set{names.LabelName: names.LabelNameValue, names.LabelManagedBy: names.LabelManagedByValue})
	return cache.Options{
		DefaultTransform: scheme.StripApplied,
		ByObject: map[client.Object]cache.ByObject{
			&appsv1.Deployment{}:          {Label: ours},
			&corev1.ServiceAccount{}:      {Label: ours},
			&rbacv1.Role{}:                {Label: ours},
			&rbacv1.RoleBinding{}:         {Label: ours},
			&networkingv1.NetworkPolicy{}: {Label: ours},
			// The streams ConfigMaps and the shared dispatcher's list of namespaces.
			&corev1.ConfigMap{}: {Label: ourConfigMaps()},
			&corev1.Secret{}:    {Transform: secretMetadataOnly},
		},
	}
}

// secretAnnotations are the annotations of a Secret the controller reads (consent.Secret).
var secretAnnotations = []string{consent.AllowedEndpoints, corev1.ServiceAccountNameKey}

// secretMetadataOnly is the cache's transform of Secrets (by GVK, so of their metadata-only
// informers and of any full one alike): it keeps their identity, labels and owners, and of
// their annotations only those the controller reads, and drops any data. Metadata is not free
// of secrets: `kubectl apply` writes the whole Secret, data included, into the annotation
// kubectl.kubernetes.io/last-applied-configuration. So the controller's memory holds no
// tenant's Secret data, whichever way it reads Secrets through its cache.
func secretMetadataOnly(in any) (any, error) {
	var m *metav1.ObjectMeta
	switch o := in.(type) {
	case *metav1.PartialObjectMetadata:
		m = &o.ObjectMeta
	case *corev1.Secret:
		m = &o.ObjectMeta
		o.Data, o.StringData = nil, nil
	default:
		return in, nil
	}
	m.ManagedFields = nil
	var kept map[string]string
	for _, k := range secretAnnotations {
		if v, ok := m.Annotations[k]; ok {
			if kept == nil {
				kept = map[string]string{}
			}
			kept[k] = v
		}
	}
	m.Annotations = kept
	return in, nil
}

// Setup registers the controller's seven reconcilers and its retention sweep with mgr, as
// kubebuilder's main.go does: the endpoint field indexes they share, the NATS connection (js),
// then each one's SetupWithManager. mgr's cache must use CacheOptions.
func Setup(ctx context.Context, mgr ctrl.Manager, opts *Options, js *JetStream) error {
	if err := IndexEndpoints(ctx, mgr); err != nil {
		return err
	}
	if err := mgr.Add(js); err != nil {
		return err
	}
	c, api, rec := mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder(FieldManager)
	sets := &StreamSetCreator{Client: c, APIReader: api, NATS: js}
	// The endpoint and dispatcher reconcilers watch what the quota reconciler tells them.
	quotas := &QuotaReconciler{Client: c, Recorder: rec, NATS: js, Sets: sets, Options: opts}
	for _, r := range []interface{ SetupWithManager(ctrl.Manager) error }{
		&EndpointReconciler{Client: c, APIReader: api, Recorder: rec, NATS: js, Options: opts, Sets: sets, Quotas: quotas},
		&DispatcherReconciler{Client: c, APIReader: api, NATS: js, Sets: sets, Options: opts, Quotas: quotas},
		&StreamSets{Client: c, APIReader: api, Recorder: rec, NATS: js, MaxConcurrentReconciles: opts.concurrency()},
		&RetryPolicyReconciler{Client: c, Recorder: rec, MaxConcurrentReconciles: opts.concurrency()},
		newReplayReconciler(mgr, opts, js),
		quotas,
		&ErasureReconciler{Client: c, Recorder: rec, NATS: js, MaxConcurrentReconciles: opts.concurrency(),
			MaxErasures: opts.MaxErasures, MaxErasuresPerNamespace: opts.MaxErasuresPerNamespace},
		&RetentionSweep{Client: c, NATS: js, Interval: opts.RetentionInterval},
	} {
		if err := r.SetupWithManager(mgr); err != nil {
			return err
		}
	}
	return nil
}

// SetupReplays registers the WebhookReplay reconciler alone, for a process that runs replays
// only (Setup registers it with the others).
func SetupReplays(_ context.Context, mgr ctrl.Manager, opts *Options, js *JetStream) error {
	return newReplayReconciler(mgr, opts, js).SetupWithManager(mgr)
}

func newReplayReconciler(mgr ctrl.Manager, opts *Options, js *JetStream) *ReplayReconciler {
	return &ReplayReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder(FieldManager),
		NATS: js, TTL: opts.ReplayTTL, MaxConcurrentReconciles: opts.concurrency()}
}

// exclusion says why the controller does not act in namespace ns, "" when it does.
func (o *Options) exclusion(ns string) string {
	switch {
	case o.Namespace != "" && ns == o.Namespace:
		return fmt.Sprintf("namespace %s is the operator's own", ns)
	case slices.Contains(o.ExcludedNamespaces, ns):
		return fmt.Sprintf("namespace %s is excluded by the installation (--excluded-namespaces, the chart's excludedNamespaces)", ns)
	}
	return ""
}

// concurrency is how many objects of one kind are reconciled at once.
func (o *Options) concurrency() int { return max(o.MaxConcurrentReconciles, 1) }

// IndexEndpoints registers the WebhookEndpoint field indexes the endpoint, dispatcher and
// retry policy reconcilers share (by dispatcher, referenced Secret, source namespace and retry
// policy), once, before their SetupWithManager.
func IndexEndpoints(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	for name, f := range map[string]func(*v1alpha1.WebhookEndpoint) []string{
		indexDispatcher: func(e *v1alpha1.WebhookEndpoint) []string { return []string{names.Dispatcher(e)} },
		indexSecrets: func(e *v1alpha1.WebhookEndpoint) []string {
			refs := referencedSecrets(e)
			out := make([]string, len(refs))
			for i, r := range refs {
				out[i] = r.Name
			}
			return out
		},
		indexSources: func(e *v1alpha1.WebhookEndpoint) []string { return e.Spec.SourceNamespaces },
		indexRetryPolicy: func(e *v1alpha1.WebhookEndpoint) []string {
			if name := retryPolicyName(e); name != "" {
				return []string{name}
			}
			return nil
		},
	} {
		if err := idx.IndexField(ctx, &v1alpha1.WebhookEndpoint{}, name, func(o client.Object) []string {
			return f(o.(*v1alpha1.WebhookEndpoint))
		}); err != nil {
			return err
		}
	}
	return nil
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
		return o.Status.AvailableReplicas != n.Status.AvailableReplicas || rolledOut(o) != rolledOut(n) ||
			!equalReplicas(o.Spec.Replicas, n.Spec.Replicas) ||
			o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
	}}
}

// rolledOut reports whether every pod of dep delivers the shared lane from status.sharedSince
// on: its pod template says so (names.AnnotationSharedLane), the Deployment controller saw
// this template, and no pod of an earlier template runs or is still stopping.
func rolledOut(dep *appsv1.Deployment) bool {
	st := dep.Status
	return dep.Spec.Template.Annotations[names.AnnotationSharedLane] == names.AnnotationSharedLaneValue &&
		st.ObservedGeneration >= dep.Generation && st.UpdatedReplicas == st.Replicas &&
		(st.TerminatingReplicas == nil || *st.TerminatingReplicas == 0)
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

// ourConfigMaps selects the ConfigMaps the controller makes: the streams ConfigMaps and the
// shared dispatcher's (names.SharedPool).
func ourConfigMaps() labels.Selector {
	name, err := labels.NewRequirement(names.LabelName, selection.In, []string{names.LabelNameStreams, names.LabelNameValue})
	if err != nil {
		panic(err)
	}
	managed, err := labels.NewRequirement(names.LabelManagedBy, selection.Equals, []string{names.LabelManagedByValue})
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*name, *managed)
}
