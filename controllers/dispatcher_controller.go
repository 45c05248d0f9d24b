package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/wake"
)

// DispatcherReconciler keeps one dispatcher (a request is its namespace and Deployment name)
// in line with the endpoints it serves: its Deployment, ServiceAccount, Role and RoleBinding,
// the namespace's mirror of the NATS credentials, and its router consumer. A dispatcher that
// serves no endpoint any more is removed with all of these; so is one found at start-up that
// nothing owns.
type DispatcherReconciler struct {
	Client client.Client
	// APIReader reads the NATS credentials Secret, whose contents are not cached.
	APIReader client.Reader
	NATS      *JetStream
	Sets      *StreamSetCreator
	Options   *Options
	// Quotas wakes the dispatchers of the endpoints whose admission by their namespace's
	// WebhookQuota changed (a held-back endpoint gets no dedicated dispatcher).
	Quotas *QuotaReconciler

	applier *applier
	backoff *backoff

	credsMu sync.Mutex
	creds   *mirror
	otel    *mirror
	egress  *mirror
	scrapCA *mirror

	// handedOver holds the autoscaled Deployments whose replicas FieldManager no longer owns.
	handoverMu sync.Mutex
	handedOver map[string]bool
}

// Reconcile creates, updates or removes the dispatcher named by req (its namespace and
// Deployment name). It learns of endpoint changes only through the API server: its watch
// maps each endpoint (before and after a change, and as soon as its deletion starts) to its
// dispatcher.
func (r *DispatcherReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	namespace, name := req.Namespace, req.Name
	if r.Options.isPool(namespace, name) {
		return r.reconcilePool(ctx)
	}
	eps, err := r.endpointsOf(ctx, namespace, name)
	if err != nil {
		return ctrl.Result{}, err
	}
	key := namespace + "/" + name
	if len(eps) == 0 {
		if err := r.teardown(ctx, namespace, name); err != nil {
			if errors.Is(err, ErrNATSUnavailable) {
				ctrl.LoggerFrom(ctx).Info("cannot delete the router consumers of an earlier version yet", "reason", err.Error())
				return ctrl.Result{RequeueAfter: r.backoff.next(key)}, nil
			}
			return ctrl.Result{}, err
		}
		r.backoff.forget(key)
		return ctrl.Result{}, nil
	}
	d, err := r.desired(ctx, namespace, name, eps)
	if err != nil {
		return ctrl.Result{}, err
	}
	pooled := false
	if name == names.SharedDispatcher {
		if pooled, err = r.Options.pooled(ctx, r.Client, namespace); err != nil {
			return ctrl.Result{}, err
		}
	}
	if !pooled && name == names.SharedDispatcher {
		if err := r.leavePool(ctx, namespace); err != nil {
			return ctrl.Result{}, err
		}
	}
	// The mirrors stay in a namespace the shared dispatcher serves: its producers connect
	// with the NATS TLS material too, and its dedicated dispatchers mount them.
	if err := r.applyMirrors(ctx, d); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.applyIdentity(ctx, d); err != nil {
		return ctrl.Result{}, err
	}
	var again time.Duration
	if pooled {
		if again, err = r.joinPool(ctx, namespace); err != nil {
			return ctrl.Result{}, err
		}
	} else {
		if err := r.reconcileEgress(ctx, d); err != nil {
			return ctrl.Result{}, fmt.Errorf("network policy: %w", err)
		}
		if err := r.applyDeployment(ctx, d); err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.reconcileSources(ctx, namespace, d.endpointName(), eps); err != nil {
		if errors.Is(err, ErrNATSUnavailable) {
			ctrl.LoggerFrom(ctx).Info("cannot create the source namespaces' consumers yet", "reason", err.Error())
			return ctrl.Result{RequeueAfter: r.backoff.next(key)}, nil
		}
		return ctrl.Result{}, err
	}
	r.backoff.forget(key)
	return ctrl.Result{RequeueAfter: again}, nil
}

// applyMirrors copies into the dispatcher's namespace the installation's Secrets its pods
// mount (NATS TLS material, tracing and egress proxy credentials, the scraper CA), and removes
// those the installation no longer configures.
func (r *DispatcherReconciler) applyMirrors(ctx context.Context, d *dispatcher) error {
	namespace := d.Namespace
	if d.NATS != nil {
		if err := r.applier.apply(ctx, secretMeta(), mirrorSecret(names.NATSSecret, namespace, d.NATS)); err != nil {
			return fmt.Errorf("mirroring NATS credentials: %w", err)
		}
	}
	if d.OTEL != nil {
		if err := r.applier.apply(ctx, secretMeta(), mirrorSecret(names.OTELSecret, namespace, d.OTEL)); err != nil {
			return fmt.Errorf("mirroring the tracing credentials: %w", err)
		}
	} else if err := r.delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: names.OTELSecret}}); err != nil {
		return fmt.Errorf("removing the tracing credentials: %w", err)
	}
	if d.EgressProxy != nil {
		if err := r.applier.apply(ctx, secretMeta(), mirrorSecret(names.EgressProxySecret, namespace, d.EgressProxy)); err != nil {
			return fmt.Errorf("mirroring the egress proxy's credentials: %w", err)
		}
	} else if err := r.delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: names.EgressProxySecret}}); err != nil {
		return fmt.Errorf("removing the egress proxy's credentials: %w", err)
	}
	if d.MetricsCA != nil {
		if err := r.applier.apply(ctx, secretMeta(), mirrorSecret(names.MetricsCASecret, namespace, d.MetricsCA)); err != nil {
			return fmt.Errorf("mirroring the scraper CA: %w", err)
		}
	} else if err := r.delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: names.MetricsCASecret}}); err != nil {
		return fmt.Errorf("removing the scraper CA: %w", err)
	}
	return nil
}

// applyIdentity applies the dispatcher's ServiceAccount, Role and RoleBinding.
func (r *DispatcherReconciler) applyIdentity(ctx context.Context, d *dispatcher) error {
	if err := r.applier.apply(ctx, &corev1.ServiceAccount{}, d.serviceAccount()); err != nil {
		return fmt.Errorf("service account: %w", err)
	}
	if err := r.applier.apply(ctx, &rbacv1.Role{}, d.role()); err != nil {
		return fmt.Errorf("role: %w", err)
	}
	if err := r.applier.apply(ctx, &rbacv1.RoleBinding{}, d.roleBinding()); err != nil {
		return fmt.Errorf("role binding: %w", err)
	}
	return nil
}

// reconcileEgress applies the dispatcher's egress NetworkPolicy when the installation asks for
// one, and deletes it otherwise (the installation may have stopped asking).
func (r *DispatcherReconciler) reconcileEgress(ctx context.Context, d *dispatcher) error {
	o := r.Options
	if o.DispatcherEgress == nil {
		return r.delete(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: d.Name}})
	}
	np, err := d.networkPolicy(o.DispatcherEgress, o.Config.NATS.URL, o.Config.Outbound())
	if err != nil {
		return err
	}
	return r.applier.apply(ctx, &networkingv1.NetworkPolicy{}, np)
}

// applyDeployment applies the dispatcher's Deployment and, with autoscaling, its ScaledObject:
// an autoscaled Deployment's replicas are handed over to the autoscaler first and its
// ScaledObject follows it; otherwise the ScaledObject goes first and the controller sets the
// replicas.
func (r *DispatcherReconciler) applyDeployment(ctx context.Context, d *dispatcher) error {
	if d.Autoscaling != nil && !d.autoscaled() {
		if err := r.reconcileScaledObject(ctx, d); err != nil {
			return err
		}
		r.takeBackReplicas(d.Namespace, d.Name)
	}
	if d.autoscaled() {
		if err := r.handOverReplicas(ctx, d); err != nil {
			return err
		}
	}
	if err := r.applier.apply(ctx, &appsv1.Deployment{}, d.deployment()); err != nil {
		return fmt.Errorf("deployment: %w", err)
	}
	if d.autoscaled() {
		if err := r.reconcileScaledObject(ctx, d); err != nil {
			return fmt.Errorf("ScaledObject: %w", err)
		}
	}
	return nil
}

// endpointsOf lists the endpoints dispatcher name serves (see served); none in a namespace the
// controller does not act in.
func (r *DispatcherReconciler) endpointsOf(ctx context.Context, namespace, name string) ([]*v1alpha1.WebhookEndpoint, error) {
	if r.Options.exclusion(namespace) != "" {
		return nil, nil
	}
	list := &v1alpha1.WebhookEndpointList{}
	if err := r.Client.List(ctx, list, client.InNamespace(namespace), client.MatchingFields{indexDispatcher: name}); err != nil {
		return nil, err
	}
	var eps []*v1alpha1.WebhookEndpoint
	for i := range list.Items {
		if served(&list.Items[i]) {
			eps = append(eps, &list.Items[i])
		}
	}
	slices.SortFunc(eps, func(a, b *v1alpha1.WebhookEndpoint) int { return strings.Compare(a.Name, b.Name) })
	// An endpoint the namespace's WebhookQuota holds back is served by no dispatcher (a
	// dedicated one is not made). A deleted one has no verdict: it is served until it goes.
	return r.Options.admitted(ctx, r.Client, namespace, eps)
}

// served says whether an endpoint's dispatcher serves it: while it lives, and once deleted for
// as long as it carries the finalizer, which waits for the dispatcher to dead-letter what is
// still queued for it (EndpointReconciler.finalize). Its Deployment, its credentials, its
// grants on the bus and its autoscaling triggers stay until then.
func served(ep client.Object) bool {
	return ep.GetDeletionTimestamp().IsZero() || controllerutil.ContainsFinalizer(ep, Finalizer)
}

// wakeChanged passes the updates of an endpoint that change what its dispatcher acts on
// (wake.Relevant).
func wakeChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*v1alpha1.WebhookEndpoint)
			n, ok2 := e.ObjectNew.(*v1alpha1.WebhookEndpoint)
			return ok1 && ok2 && wake.Relevant(o, n)
		},
	}
}

// servingEnded passes the update that removes the finalizer from a deleted endpoint: its
// dispatcher stops serving it then, even while another finalizer keeps the object.
func servingEnded() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc:  func(e event.UpdateEvent) bool { return served(e.ObjectOld) && !served(e.ObjectNew) },
	}
}

// desired is the dispatcher eps need.
func (r *DispatcherReconciler) desired(ctx context.Context, namespace, name string, eps []*v1alpha1.WebhookEndpoint) (*dispatcher, error) {
	o := r.Options
	d := &dispatcher{
		Namespace: namespace,
		Name:      name,
		Image:     o.DispatcherImage,
		Args:      o.Config.DispatcherArgs(),
		Replicas:  o.DispatcherReplicas,
		Resources: o.DispatcherResources,
		OTELEnv:   o.DispatcherOTELEnv,
		Auth:      o.BusAuth,
	}
	switch {
	case o.isPool(namespace, name):
		d.Pool, d.IdleAfter = true, o.SharedIdleAfter
	case name != names.SharedDispatcher:
		ep := eps[0]
		d.Endpoint = ep
		d.Replicas, d.Resources, _ = o.sizing(ep)
	}
	secrets, err := o.usableSecrets(ctx, r.Client, eps)
	if err != nil {
		return nil, err
	}
	d.Secrets = secrets
	if a := o.Autoscaling; a != nil && !d.Pool {
		d.Autoscaling = a
		d.Triggers = scaleTriggers(eps, r.NATS.Config().For(namespace).NamespaceNames)
		if d.Endpoint != nil {
			q, err := namespaceQuota(ctx, r.Client, namespace)
			if err != nil {
				return nil, err
			}
			d.ReplicaCap = o.replicaCap(q)
		}
	}
	creds, err := r.natsCredentials(ctx)
	if err != nil {
		return nil, err
	}
	d.NATS = creds
	if d.OTEL, err = r.otelCredentials(ctx); err != nil {
		return nil, err
	}
	if d.EgressProxy, err = r.egressProxyCredentials(ctx); err != nil {
		return nil, err
	}
	if d.MetricsCA, err = r.metricsCA(ctx); err != nil {
		return nil, err
	}
	d.MetricsClientName = o.DispatcherMetricsClientName
	return d, nil
}

// natsCredentials reads the --nats-credentials-secret, again only when its resourceVersion
// changed. It returns nil when no such Secret is configured.
func (r *DispatcherReconciler) natsCredentials(ctx context.Context) (*mirror, error) {
	ref := r.Options.Config.NATS.CredentialsSecret
	if ref == "" {
		return nil, nil
	}
	ns, name, _ := strings.Cut(ref, "/")
	m, err := r.readMirror(ctx, types.NamespacedName{Namespace: ns, Name: name}, &r.creds, r.Options.BusAuth.mirroredKeys)
	if err != nil {
		return nil, fmt.Errorf("NATS credentials Secret %s: %w", ref, err)
	}
	return m, nil
}

// readMirror reads the Secret key whole, past the cache, into *last, keeping of its data what
// keep returns; again only when its resourceVersion (read from the metadata cache) changed.
func (r *DispatcherReconciler) readMirror(ctx context.Context, key types.NamespacedName, last **mirror, keep func(map[string][]byte) map[string][]byte) (*mirror, error) {
	rv, err := secretVersion(ctx, r.Client, key)
	if err != nil {
		return nil, err
	}
	r.credsMu.Lock()
	defer r.credsMu.Unlock()
	if *last != nil && (*last).SourceVersion == rv {
		return *last, nil
	}
	s := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, key, s); err != nil {
		return nil, err
	}
	m := newMirror(keep(s.Data))
	m.SourceVersion = s.ResourceVersion
	*last = m
	return m, nil
}

// reconcileSources makes each endpoint's consumers on other namespaces' events streams match
// what it reads: with cross-namespace sources allowed, one on the events stream of each
// namespace of its spec.sourceNamespaces that consents to it (whose set it creates if
// needed), starting at the endpoint's creation; consumers on namespaces it no longer reads, or
// whose consent was withdrawn, are removed. (Each endpoint's consumers in its own namespace
// are the endpoint reconciler's.) The router consumers of earlier versions go once every
// endpoint reading a stream has its own consumer there.
func (r *DispatcherReconciler) reconcileSources(ctx context.Context, namespace, dedicated string, eps []*v1alpha1.WebhookEndpoint) error {
	allow := r.Options.Config.AllowCrossNamespaceSources
	var withSets []string
	if allow {
		var err error
		if withSets, err = r.namespacesWithSets(ctx); err != nil {
			return err
		}
	}
	readers := map[string][]string{namespace: nil} // events stream's namespace -> endpoints reading it
	// The shared lane reads each source namespace through one intake consumer of the reader's,
	// from the first time one of its shared-lane endpoints joined it.
	intakes := map[string]time.Time{}
	var errs []error
	for _, ep := range eps {
		if !ep.DeletionTimestamp.IsZero() {
			// Its consumers are its finalizer's, which deletes them once empty: none is made
			// again, and no router of an earlier version waits for it.
			continue
		}
		shared := streams.LaneOf(&ep.Spec) == streams.LaneShared
		if !shared {
			readers[namespace] = append(readers[namespace], ep.Name)
		}
		var read []string
		if allow {
			consenting, err := consentingSources(ctx, r.Client, ep)
			if err != nil {
				return err
			}
			read = consenting
		}
		read = slices.DeleteFunc(read, func(src string) bool { return r.Options.exclusion(src) != "" })
		for _, src := range read {
			if src == namespace {
				continue
			}
			if shared {
				// Its consumer of an earlier version there (if any) drains, and goes with the
				// endpoint reconciler (status.drainingConsumers).
				since := ep.CreationTimestamp.Time
				if ep.Status.SharedSince != nil {
					since = ep.Status.SharedSince.Time
				}
				if t, ok := intakes[src]; !ok || since.Before(t) {
					intakes[src] = since
				}
				continue
			}
			if err := r.ensureSourceConsumer(ctx, src, ep); err != nil {
				errs = append(errs, fmt.Errorf("events of source namespace %s for %s: %w", src, ep.Name, err))
				continue
			}
			readers[src] = append(readers[src], ep.Name)
		}
		for _, ns := range withSets {
			if ns == namespace || slices.Contains(read, ns) || shared && slices.Contains(ep.Status.DrainingConsumers, r.NATS.Config().For(ns).EventsStream()+"/"+streams.EndpointConsumerOf(namespace, ep.Name)) {
				continue
			}
			stream, name := r.NATS.Config().For(ns).EventsStream(), streams.EndpointConsumerOf(namespace, ep.Name)
			err := r.NATS.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error { return js.DeleteConsumer(ctx, stream, name) })
			if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
				errs = append(errs, err)
			}
		}
	}
	if dedicated == "" {
		errs = append(errs, r.reconcileSourceIntakes(ctx, namespace, intakes, withSets))
	}
	for ns, names := range readers {
		errs = append(errs, r.retireRouter(ctx, ns, namespace, dedicated, names))
	}
	if allow {
		errs = append(errs, r.deleteRouterConsumers(ctx, namespace, dedicated, slices.Collect(maps.Keys(readers))))
	}
	return errors.Join(errs...)
}

// reconcileSourceIntakes makes the intake consumers of reader's shared dispatcher on source
// namespaces' events streams those of intakes (source namespace -> when its first shared-lane
// endpoint reading it joined the shared lane), and removes its intake consumers on the other
// namespaces with a set.
func (r *DispatcherReconciler) reconcileSourceIntakes(ctx context.Context, reader string, intakes map[string]time.Time, withSets []string) error {
	var errs []error
	for src, since := range intakes {
		if err := r.Sets.ensure(ctx, src); err != nil {
			errs = append(errs, err)
			continue
		}
		set := r.NATS.Config().For(src)
		errs = append(errs, r.NATS.EnsureAndDo(ctx, src, func(ctx context.Context, js jetstream.JetStream) error {
			return set.EnsureIntakeConsumer(ctx, js, reader, since)
		}))
	}
	name := streams.IntakeConsumer(reader)
	for _, ns := range withSets {
		if _, ok := intakes[ns]; ok || ns == reader {
			continue
		}
		stream := r.NATS.Config().For(ns).EventsStream()
		err := r.NATS.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error { return js.DeleteConsumer(ctx, stream, name) })
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ensureSourceConsumer creates or updates ep's consumer on source namespace src's events stream.
func (r *DispatcherReconciler) ensureSourceConsumer(ctx context.Context, src string, ep *v1alpha1.WebhookEndpoint) error {
	if err := r.Sets.ensure(ctx, src); err != nil {
		return err
	}
	set := r.NATS.Config().For(src)
	return r.NATS.EnsureAndDo(ctx, src, func(ctx context.Context, js jetstream.JetStream) error {
		start, err := eventsStart(ctx, js, set, ep)
		if err != nil {
			return err
		}
		return set.EnsureEventsConsumer(ctx, js, ep.Namespace, ep.Name, streams.EventPatterns(&ep.Spec), streams.EndpointConsumerOptionsFor(&ep.Spec), start)
	})
}

// retireRouter deletes the router consumer of an earlier version that reader's dispatcher had
// on ns's events stream, once every endpoint reading that stream has its own consumer there
// (which started where the router had got to, see eventsStart).
func (r *DispatcherReconciler) retireRouter(ctx context.Context, ns, reader, dedicated string, endpoints []string) error {
	stream := r.NATS.Config().For(ns).EventsStream()
	err := r.NATS.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error {
		if _, err := js.Consumer(ctx, stream, streams.RouterConsumer(reader, dedicated)); err != nil {
			return err
		}
		if dedicated == "" {
			// The shared lane's intake started where the router had got to.
			if _, err := js.Consumer(ctx, stream, streams.IntakeConsumer(reader)); err != nil {
				if errors.Is(err, jetstream.ErrConsumerNotFound) {
					return nil // not yet
				}
				return err
			}
		}
		for _, ep := range endpoints {
			if _, err := js.Consumer(ctx, stream, streams.EndpointConsumerOf(reader, ep)); err != nil {
				if errors.Is(err, jetstream.ErrConsumerNotFound) {
					return nil // not yet
				}
				return err
			}
		}
		return js.DeleteConsumer(ctx, stream, streams.RouterConsumer(reader, dedicated))
	})
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	return err
}

// namespacesWithSets are the namespaces that have a set of streams (a streams ConfigMap).
func (r *DispatcherReconciler) namespacesWithSets(ctx context.Context) ([]string, error) {
	cms := &corev1.ConfigMapList{}
	if err := r.Client.List(ctx, cms, client.MatchingLabels{names.LabelName: names.LabelNameStreams, names.LabelManagedBy: names.LabelManagedByValue}); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(cms.Items))
	for _, cm := range cms.Items {
		out = append(out, cm.Namespace)
	}
	return out, nil
}

// deleteRouterConsumers deletes the router consumers of an earlier version that reader's
// dispatcher had on the events streams of every namespace with a set (a streams ConfigMap) but
// those in keep. A stream already gone holds no consumer.
func (r *DispatcherReconciler) deleteRouterConsumers(ctx context.Context, reader, dedicated string, keep []string) error {
	var namespaces []string
	if r.Options.Config.AllowCrossNamespaceSources {
		var err error
		if namespaces, err = r.namespacesWithSets(ctx); err != nil {
			return err
		}
	}
	if !slices.Contains(namespaces, reader) {
		namespaces = append(namespaces, reader)
	}
	name := streams.RouterConsumer(reader, dedicated)
	for _, ns := range namespaces {
		if slices.Contains(keep, ns) {
			continue
		}
		stream := r.NATS.Config().For(ns).EventsStream()
		err := r.NATS.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteConsumer(ctx, stream, name)
		})
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
	}
	return nil
}

// deleteSharedLane deletes the consumers of the namespace's shared lane, which no endpoint
// rides any more: its queue consumer, and its intake consumers on its own events stream and on
// every other namespace's with a set (a source's).
func (r *DispatcherReconciler) deleteSharedLane(ctx context.Context, namespace string) error {
	set := r.NATS.Config().For(namespace)
	targets := [][3]string{{namespace, set.DeliveriesStream(), set.QueueConsumer()}, {namespace, set.EventsStream(), streams.IntakeConsumer(namespace)}}
	if r.Options.Config.AllowCrossNamespaceSources {
		others, err := r.namespacesWithSets(ctx)
		if err != nil {
			return err
		}
		for _, ns := range others {
			if ns != namespace {
				targets = append(targets, [3]string{ns, r.NATS.Config().For(ns).EventsStream(), streams.IntakeConsumer(namespace)})
			}
		}
	}
	for _, t := range targets {
		err := r.NATS.Do(ctx, t[0], func(ctx context.Context, js jetstream.JetStream) error { return js.DeleteConsumer(ctx, t[1], t[2]) })
		if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
	}
	return nil
}

// teardown removes a dispatcher that serves nothing: first its router consumers (so a NATS
// outage leaves the Deployment, and with it a reason to come back), then its objects, and the
// namespace's NATS credentials once no dispatcher of the namespace serves an endpoint. The namespace's
// streams stay (dead letters and the log remain readable) until the namespace goes.
func (r *DispatcherReconciler) teardown(ctx context.Context, namespace, name string) error {
	dedicated := ""
	if name != names.SharedDispatcher {
		dedicated = r.dedicatedEndpointOf(ctx, namespace, name)
	}
	if err := r.deleteRouterConsumers(ctx, namespace, dedicated, nil); err != nil {
		return err
	}
	if name == names.SharedDispatcher {
		if err := r.deleteSharedLane(ctx, namespace); err != nil {
			return err
		}
		if err := r.leavePool(ctx, namespace); err != nil {
			return err
		}
	}
	if r.Options.Autoscaling != nil {
		if err := r.deleteScaledObject(ctx, namespace, name); err != nil {
			return err
		}
		r.takeBackReplicas(namespace, name)
	}
	for _, obj := range []client.Object{&appsv1.Deployment{}, &networkingv1.NetworkPolicy{}, &rbacv1.RoleBinding{}, &rbacv1.Role{}, &corev1.ServiceAccount{}} {
		obj.SetNamespace(namespace)
		obj.SetName(name)
		if err := r.delete(ctx, obj); err != nil {
			return err
		}
	}
	others := &v1alpha1.WebhookEndpointList{}
	if err := r.Client.List(ctx, others, client.InNamespace(namespace)); err != nil {
		return err
	}
	for i := range others.Items {
		if served(&others.Items[i]) && r.Options.exclusion(namespace) == "" {
			return nil
		}
	}
	for _, name := range []string{names.NATSSecret, names.OTELSecret, names.EgressProxySecret, names.MetricsCASecret} {
		if err := r.delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}); err != nil {
			return err
		}
	}
	return nil
}

// delete deletes obj unless the cache already knows it is gone.
func (r *DispatcherReconciler) delete(ctx context.Context, obj client.Object) error {
	gvk, err := r.Client.GroupVersionKindFor(obj)
	if err != nil {
		return err
	}
	r.applier.forget(gvk.Kind, obj.GetNamespace(), obj.GetName())
	var cached client.Object = obj.DeepCopyObject().(client.Object)
	if gvk.Kind == "Secret" {
		cached = secretMeta()
	}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(obj), cached); err != nil {
		return client.IgnoreNotFound(err)
	}
	err = r.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground))
	return client.IgnoreNotFound(err)
}

// dedicatedEndpointOf finds which endpoint a dedicated dispatcher was for, from its
// Deployment's annotation (or any of its other objects'), or from its name.
func (r *DispatcherReconciler) dedicatedEndpointOf(ctx context.Context, namespace, name string) string {
	for _, obj := range []client.Object{&appsv1.Deployment{}, &rbacv1.Role{}, &corev1.ServiceAccount{}, &rbacv1.RoleBinding{}} {
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, obj); err == nil {
			if ep := obj.GetAnnotations()[names.AnnotationEndpoint]; ep != "" {
				return ep
			}
		}
	}
	return strings.TrimPrefix(name, names.SharedDispatcher+"-")
}

func secretMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	return m
}

// SetupWithManager registers the reconciler and what it watches with mgr: every endpoint
// change (before and after, so a dispatcher an endpoint leaves hears of it too), the objects
// it makes (by their dispatcher label), the Secrets its endpoints reference and the NATS
// credentials, the NATS connection coming back, the source namespaces' consent, the
// endpoints whose admission by their WebhookQuota changed, and (with autoscaling) the
// WebhookQuotas, whose bound on replicas bounds the ScaledObjects. Without
// autoscaling it also removes the ScaledObjects an earlier configuration left. The endpoint
// field indexes (IndexEndpoints) must be registered first.
func (r *DispatcherReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.applier = newApplier(r.Client)
	r.backoff = newBackoff(natsRetryBase, natsRetryMax)
	r.handedOver = map[string]bool{}
	if r.Options.Autoscaling != nil {
		if err := checkScaledObjectsServed(mgr.GetRESTMapper()); err != nil {
			return err
		}
	} else if err := mgr.Add(manager.RunnableFunc(removeScaledObjects(r.Client))); err != nil {
		return err
	}
	c := r.Client
	byLabel := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if name := o.GetLabels()[names.LabelDispatcher]; name != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
		}
		return nil
	})
	natsSource := r.Options.Config.NATS.CredentialsSecret
	otelSource := r.Options.DispatcherOTELSecret.String()
	egressSource := r.Options.EgressProxySecret.String()
	metricsCASource := r.Options.DispatcherMetricsCA.String()
	return ctrl.NewControllerManagedBy(mgr).
		Named("dispatcher").
		Watches(&v1alpha1.WebhookEndpoint{}, oldAndNew(func(o client.Object) []reconcile.Request {
			ep := o.(*v1alpha1.WebhookEndpoint)
			reqs := []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ep.Namespace, Name: names.Dispatcher(ep)}}}
			if r.Options.SharedDispatcher {
				// The namespaces the shared dispatcher serves may change.
				reqs = append(reqs, r.Options.poolRequest())
			}
			return reqs
		}), builder.WithPredicates(predicate.Or(specOrDeletionChanged(), servingEnded()))).
		// What a sleeping namespace's dispatcher would act on changed: the digest beside its
		// name in the shared dispatcher's list changes, which wakes it.
		Watches(&v1alpha1.WebhookEndpoint{}, handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
			if !r.Options.SharedDispatcher {
				return nil
			}
			return []reconcile.Request{r.Options.poolRequest()}
		}), builder.WithPredicates(wakeChanged())).
		Watches(&appsv1.Deployment{}, byLabel, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}))).
		Watches(&corev1.ServiceAccount{}, byLabel).
		Watches(&rbacv1.Role{}, byLabel).
		Watches(&rbacv1.RoleBinding{}, byLabel).
		Watches(&networkingv1.NetworkPolicy{}, byLabel).
		Watches(&corev1.ConfigMap{}, byLabel).
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			switch {
			case natsSource != "" && o.GetNamespace()+"/"+o.GetName() == natsSource:
				return allDispatchers(ctx, c, "")
			case r.Options.DispatcherOTELSecret.Name != "" && o.GetNamespace()+"/"+o.GetName() == otelSource:
				return allDispatchers(ctx, c, "")
			case r.Options.EgressProxySecret.Name != "" && o.GetNamespace()+"/"+o.GetName() == egressSource:
				return allDispatchers(ctx, c, "")
			case r.Options.DispatcherMetricsCA.Name != "" && o.GetNamespace()+"/"+o.GetName() == metricsCASource:
				return allDispatchers(ctx, c, "")
			case (o.GetName() == names.NATSSecret || o.GetName() == names.OTELSecret || o.GetName() == names.EgressProxySecret ||
				o.GetName() == names.MetricsCASecret) &&
				o.GetLabels()[names.LabelManagedBy] == names.LabelManagedByValue:
				return allDispatchers(ctx, c, o.GetNamespace())
			}
			// A referenced Secret that appears, or gives or withdraws its consent, changes
			// what the dispatchers of the endpoints referencing it may read.
			return dispatchersMatching(ctx, c, o.GetNamespace(), indexSecrets, o.GetName())
		})).
		WatchesRawSource(source.Channel(r.NATS.subscribe(), handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ string) []reconcile.Request {
			return allDispatchers(ctx, c, "")
		}))).
		WatchesMetadata(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			reqs := dispatchersMatching(ctx, c, "", indexSources, o.GetName())
			if r.Options.SharedDispatcher {
				// A namespace that asks for a dispatcher of its own, or no longer does.
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetName(), Name: names.SharedDispatcher}},
					r.Options.poolRequest())
			}
			return reqs
		})).
		// Dedicated dispatchers of endpoints whose admission by the WebhookQuota changed.
		WatchesRawSource(r.Quotas.dispatchersWoken()).
		// A quota's bound on dedicated dispatchers' replicas bounds their autoscaling too.
		Watches(&v1alpha1.WebhookQuota{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			if r.Options.Autoscaling == nil {
				return nil
			}
			return allDispatchers(ctx, c, o.GetNamespace())
		}), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.Options.concurrency()}).
		Complete(r)
}
