package controllers

import (
	"time"

	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// EndpointReconciler reconciles a WebhookEndpoint into its signing Secret and its JetStream
// consumer, reports whether it is wired (the controller's part of its status), and on deletion
// lets it go once its dispatcher dead-lettered what was still waiting for it (finalize).
type EndpointReconciler struct {
	Client client.Client
	// APIReader reads around the cache, for a Secret just created by an earlier reconcile.
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	NATS      *JetStream
	Options   *Options
	Sets      *StreamSetCreator
	// Quotas wakes the endpoints whose admission by their namespace's WebhookQuota changed
	// (each decides its own in checkQuota).
	Quotas *QuotaReconciler

	guard    netguard.Policy
	retiring retirements
	storage  *storageWatch
	status   *statusWriter[v1alpha1.WebhookEndpointStatus]
}

// endpointObservation is what one reconcile found out. Steps fill it; only the deferred
// summary turns it into status, so no step writes status.
type endpointObservation struct {
	problems
	status v1alpha1.WebhookEndpointStatus // the controller's fields, starting from the last ones
	// dispatcherAvailable is whether the Deployment reports available replicas.
	dispatcherAvailable bool
	// dispatcherCurrent is whether every pod of the Deployment delivers the shared lane from
	// status.sharedSince on (rolledOut); true when there is no Deployment.
	dispatcherCurrent bool
	// secrets found in this reconcile before the cache may know them (name to resourceVersion).
	created map[string]string
	// gone is set once the finalizer is removed: the object is about to disappear.
	gone bool
	// storage is the namespace's StorageLimitReached condition; nil when it was not read
	// (an earlier step ended the reconcile, or NATS did not answer): the last one stays.
	storage *metav1.Condition
	// capped says what the installation's caps change of the dedicated dispatcher ep asks
	// for (DispatcherCapped); empty when nothing.
	capped []string
	// quota is the QuotaLimitReached condition (nil without a quota) once quotaRead.
	quota     *metav1.Condition
	quotaRead bool
	// requeue asks for another look after this long (consumers of its own draining).
	requeue time.Duration
}

// endpointStep is one step of a reconcile. It returns an error only for the unexpected; an
// expected obstacle is a problem in the observation, which ends the reconcile.
type endpointStep func(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error

// Reconcile is the entry point: get, finalizer, a deferred status patch, then the steps.
func (r *EndpointReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	ep := &v1alpha1.WebhookEndpoint{}
	if err := r.Client.Get(ctx, req.NamespacedName, ep); err != nil {
		if apierrors.IsNotFound(err) {
			r.status.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	obs := &endpointObservation{status: r.lastStatus(ep), created: map[string]string{}}
	defer func() {
		result, retErr = r.summarize(ctx, ep, obs, result, retErr)
	}()

	if !ep.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, ep, obs)
	}
	if why := r.Options.exclusion(ep.Namespace); why != "" {
		// Nothing is made for it, so nothing needs a finalizer either.
		obs.stall(v1alpha1.ReasonNamespaceExcluded, "%s: no endpoint is served there; create it in a tenant namespace", why)
		return ctrl.Result{}, nil
	}
	if err := r.addFinalizer(ctx, ep); err != nil {
		return ctrl.Result{}, err
	}
	for _, step := range []endpointStep{
		r.observeDispatcher,
		r.validateSpec,
		r.checkExpressions,
		r.checkQuota,
		r.reconcileSigningSecret,
		r.checkReferences,
		r.reconcileStreams,
		r.observeStorage,
		r.reconcileConsumer,
	} {
		if err := step(ctx, ep, obs); err != nil || obs.found() != nil {
			return ctrl.Result{}, err
		}
	}
	return ctrl.Result{RequeueAfter: obs.requeue}, nil
}

// controllerFields keeps the fields of a status the controller owns.
func controllerFields(s v1alpha1.WebhookEndpointStatus) v1alpha1.WebhookEndpointStatus {
	out := v1alpha1.WebhookEndpointStatus{
		ObservedGeneration: s.ObservedGeneration,
		SigningSecretName:  s.SigningSecretName,
		SecretsVersion:     s.SecretsVersion,
		RetryPolicyName:    s.RetryPolicyName,
		DeliverySubject:    s.DeliverySubject,
		ConsumerName:       s.ConsumerName,
		Lane:               s.Lane,
		SharedSince:        s.SharedSince,
		DrainingConsumers:  s.DrainingConsumers,
	}
	if s.Dispatcher != nil {
		d := *s.Dispatcher
		out.Dispatcher = &d
	}
	for _, c := range s.Conditions {
		if isControllerCondition(c.Type) {
			out.Conditions = append(out.Conditions, c)
		}
	}
	return out
}

func isControllerCondition(t string) bool {
	return t == v1alpha1.ConditionReady || t == v1alpha1.ConditionReconciling || t == v1alpha1.ConditionStalled ||
		t == v1alpha1.ConditionStorageLimitReached || t == v1alpha1.ConditionDispatcherCapped ||
		t == v1alpha1.ConditionQuotaLimitReached
}

func (r *EndpointReconciler) addFinalizer(ctx context.Context, ep *v1alpha1.WebhookEndpoint) error {
	if controllerutil.ContainsFinalizer(ep, Finalizer) {
		return nil
	}
	patch := client.MergeFromWithOptions(ep.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.AddFinalizer(ep, Finalizer)
	return r.Client.Patch(ctx, ep, patch)
}

// observeDispatcher reads the Deployment that delivers ep and whether it is available, and what
// the installation's caps change of the dispatcher ep asks for.
func (r *EndpointReconciler) observeDispatcher(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error {
	name := names.Dispatcher(ep)
	replicas, _, capped := r.Options.sizing(ep)
	obs.capped = capped
	st := &v1alpha1.DispatcherStatus{Name: name, Dedicated: names.Dedicated(ep), Replicas: replicas}
	key := types.NamespacedName{Namespace: ep.Namespace, Name: name}
	if !st.Dedicated {
		pooled, err := r.Options.pooled(ctx, r.Client, ep.Namespace)
		if err != nil {
			return err
		}
		if pooled {
			// The installation's shared dispatcher serves the namespace.
			key = r.Options.poolRequest().NamespacedName
			st.Name, st.Namespace = key.Name, key.Namespace
		}
	}
	dep := &appsv1.Deployment{}
	err := r.Client.Get(ctx, key, dep)
	switch {
	case apierrors.IsNotFound(err):
		obs.dispatcherCurrent = true
	case err != nil:
		return err
	default:
		if dep.Spec.Replicas != nil {
			st.Replicas = *dep.Spec.Replicas
		}
		st.AvailableReplicas = dep.Status.AvailableReplicas
		obs.dispatcherAvailable = dep.DeletionTimestamp.IsZero() && dep.Status.AvailableReplicas > 0
		obs.dispatcherCurrent = rolledOut(dep)
	}
	obs.status.Dispatcher = st
	obs.status.DeliverySubject = r.NATS.Config().For(ep.Namespace).DeliverySubject(ep.Name)
	return nil
}

// validateSpec checks what the API server's schema cannot: the installation's outbound policy
// and whether other namespaces' events may be read (the installation allows it, and each
// source namespace consents).
func (r *EndpointReconciler) validateSpec(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error {
	if ep.Spec.URLFrom == nil {
		if err := r.guard.CheckURL(ep.Spec.URL); err != nil {
			obs.stall(v1alpha1.ReasonInvalidURL, "spec.url is refused: %v", err)
			return nil
		}
	}
	if what, err := receiverURLs(r.guard, &ep.Spec); err != nil {
		obs.stall(v1alpha1.ReasonInvalidURL, "%s is refused: %v", what, err)
		return nil
	}
	if len(ep.Spec.SourceNamespaces) == 0 {
		return nil
	}
	if !r.Options.Config.AllowCrossNamespaceSources {
		obs.stall(v1alpha1.ReasonSourceNotAllowed,
			"spec.sourceNamespaces (%s) needs the operator's --allow-cross-namespace-sources; remove it or ask the installer",
			strings.Join(ep.Spec.SourceNamespaces, ", "))
		return nil
	}
	for _, src := range ep.Spec.SourceNamespaces {
		if why := r.Options.exclusion(src); why != "" && src != ep.Namespace {
			obs.stall(v1alpha1.ReasonSourceNotAllowed, "spec.sourceNamespaces: %s: no endpoint reads its events", why)
			return nil
		}
		why, err := sourceRefusal(ctx, r.Client, ep.Namespace, src)
		if err != nil {
			return err
		}
		if why != "" {
			obs.stall(v1alpha1.ReasonSourceNotAllowed, "spec.sourceNamespaces: %s", why)
			return nil
		}
	}
	return r.checkSourceGrant(ctx, ep, obs)
}

// checkSourceGrant checks that the endpoint's consumers on its source namespaces fit in its
// dispatcher's bus grant, as the auth callout decides it (natsauth.FitSources over the same
// list, oldest endpoint first): one left out could never pull there, so it says so instead of
// its dispatcher reconnecting in vain.
func (r *EndpointReconciler) checkSourceGrant(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error {
	beyond, fit, total, err := r.beyondSourceGrant(ctx, ep)
	if err != nil || !beyond {
		return err
	}
	obs.stall(v1alpha1.ReasonSourceGrantFull,
		"its dispatcher reads %d consumers on other namespaces' events streams and one bus grant holds the first %d (oldest endpoints first); this endpoint's are beyond them: make it dedicated (spec.dispatcher.dedicated) or have fewer endpoints of this dispatcher read source namespaces",
		total, fit)
	return nil
}

// beyondSourceGrant says whether ep's consumers on source namespaces are beyond the first fit
// of the total its dispatcher reads there, which one bus grant holds (never with the auth
// callout off).
func (r *EndpointReconciler) beyondSourceGrant(ctx context.Context, ep *v1alpha1.WebhookEndpoint) (beyond bool, fit, total int, err error) {
	if !r.Options.BusAuth.Callout {
		return false, 0, 0, nil
	}
	dedicated := ""
	if ep.Spec.Dispatcher != nil && ep.Spec.Dispatcher.Dedicated {
		dedicated = ep.Name
	}
	sources, err := SourceConsumers(r.Client, r.NATS.Config().Names, true)(ctx, ep.Namespace, dedicated)
	if err != nil {
		return false, 0, 0, err
	}
	fit = natsauth.FitSources(sources)
	consumer := streams.EndpointConsumerOf(ep.Namespace, ep.Name)
	if dedicated == "" && streams.LaneOf(&ep.Spec) == streams.LaneShared {
		consumer = streams.IntakeConsumer(ep.Namespace) // one per source, granted first
	}
	for _, sc := range sources[fit:] {
		if sc.Consumer == consumer {
			return true, fit, len(sources), nil
		}
	}
	return false, fit, len(sources), nil
}

// checkExpressions compiles spec.filter and spec.transform as the dispatcher will: one that
// does not compile, gives the wrong type or may cost too much stalls the endpoint with the
// error's place in the expression. Compilations are cached by source, so a reconcile that
// changes nothing in them costs a map lookup.
func (r *EndpointReconciler) checkExpressions(_ context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error {
	if _, err := expr.FilterOf(&ep.Spec); err != nil {
		obs.stall(v1alpha1.ReasonInvalidFilter, "%v", err)
		return nil
	}
	if _, err := expr.TransformOf(&ep.Spec); err != nil {
		obs.stall(v1alpha1.ReasonInvalidTransform, "%v", err)
	}
	return nil
}

// reconcileSigningSecret creates `<endpoint>-signing` when spec.signing is absent. An existing
// Secret of that name is never overwritten.
func (r *EndpointReconciler) reconcileSigningSecret(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error {
	if ep.Spec.Signing != nil {
		return nil
	}
	name := names.SigningSecret(ep.Name)
	key := types.NamespacedName{Namespace: ep.Namespace, Name: name}
	if _, err := secretVersion(ctx, r.Client, key); err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ep.Namespace, Labels: map[string]string{names.LabelManagedBy: names.LabelManagedByValue}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{names.SigningSecretKey: []byte("whsec_" + base64.StdEncoding.EncodeToString(raw))},
	}
	if err := controllerutil.SetControllerReference(ep, s, r.Client.Scheme()); err != nil {
		return err
	}
	err := r.Client.Create(ctx, s)
	switch {
	case err == nil:
		obs.created[name] = s.ResourceVersion
		return nil
	case apierrors.IsAlreadyExists(err):
		// Created by an earlier reconcile the cache does not show yet: read around it.
		rv, err := secretVersion(ctx, r.APIReader, key)
		if err == nil {
			obs.created[name] = rv
		}
		return err
	default:
		return err
	}
}

// secretVersion returns a Secret's resourceVersion, reading only its metadata.
func secretVersion(ctx context.Context, c client.Reader, key types.NamespacedName) (string, error) {
	m, err := secretMetadata(ctx, c, key)
	if err != nil {
		return "", err
	}
	return m.ResourceVersion, nil
}

// checkReferences finds the Secrets and the RetryPolicy ep refers to, checks that each Secret
// consents to ep (see Options.secretUse), and records the digest of the Secrets' versions that
// makes dispatchers re-read them after a rotation.
func (r *EndpointReconciler) checkReferences(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error {
	obs.status.SigningSecretName = signingSecretName(ep)
	refs := referencedSecrets(ep)
	versions := make([]string, 0, len(refs))
	for _, ref := range refs {
		rv, ok := obs.created[ref.Name]
		if !ok {
			m, err := secretMetadata(ctx, r.Client, types.NamespacedName{Namespace: ep.Namespace, Name: ref.Name})
			if apierrors.IsNotFound(err) {
				reason := v1alpha1.ReasonSecretNotFound
				if ref.Kind == signingSecret {
					reason = v1alpha1.ReasonSigningSecretNotFound
				}
				obs.block(reason, "Secret %s/%s (%s) not found", ep.Namespace, ref.Name, ref.What)
				continue
			}
			if err != nil {
				return err
			}
			if err := r.Options.secretUse(m, ep); err != nil {
				if ep.Spec.Signing == nil && generatedForEarlier(m, ep) {
					obs.block(v1alpha1.ReasonSigningSecretNotFound, "Secret %s/%s was generated for an earlier endpoint %s: waiting for the garbage collector to delete it, then a new one is generated",
						ep.Namespace, ref.Name, ep.Name)
					continue
				}
				obs.stall(v1alpha1.ReasonSecretNotAllowed, "Secret %s/%s (%s) %v", ep.Namespace, ref.Name, ref.What, err)
				continue
			}
			rv = m.ResourceVersion
		}
		versions = append(versions, ref.Name+"="+rv)
	}
	if obs.found() != nil {
		return nil
	}
	obs.status.SecretsVersion = digest(versions)

	obs.status.RetryPolicyName = policy.DefaultName
	if name := retryPolicyName(ep); name != "" {
		obs.status.RetryPolicyName = name
		rp := &v1alpha1.RetryPolicy{}
		err := r.Client.Get(ctx, types.NamespacedName{Namespace: ep.Namespace, Name: name}, rp)
		if apierrors.IsNotFound(err) {
			obs.block(v1alpha1.ReasonRetryPolicyNotFound, "RetryPolicy %s/%s (spec.retryPolicyRef) not found", ep.Namespace, name)
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := policy.FromSpec(&rp.Spec); err != nil {
			obs.stall(v1alpha1.ReasonInvalidSpec, "RetryPolicy %s/%s is invalid: %v", ep.Namespace, name, err)
		}
	}
	return nil
}

// digest is a short hash of sorted lines; it reveals nothing of what they describe.
func digest(lines []string) string {
	lines = slices.Clone(lines)
	slices.Sort(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(sum[:8])
}

// reconcileStreams makes sure the namespace has its streams and bucket (and the ConfigMap
// that removes them with the namespace).
func (r *EndpointReconciler) reconcileStreams(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error {
	if err := r.Sets.ensure(ctx, ep.Namespace); err != nil {
		var full *streams.StorageFullError
		if errors.As(err, &full) {
			obs.block(v1alpha1.ReasonInsufficientStorage, "%v", err)
			return nil
		}
		var conflict *streams.ConflictError
		if apierrors.IsForbidden(err) || errors.Is(err, ErrNATSUnavailable) || errors.As(err, &conflict) {
			obs.block(v1alpha1.ReasonNATSUnavailable, "cannot create the streams of namespace %s: %v", ep.Namespace, err)
			return nil
		}
		return err
	}
	return nil
}

// observeStorage reads whether the namespace's dead letters or delivery log reached their size
// bounds (one reading serves the namespace's endpoints for a while; see storageWatch). A
// reading that fails is no problem of the endpoint: its last condition stays.
func (r *EndpointReconciler) observeStorage(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error {
	if cond, err := r.storage.condition(ctx, ep.Namespace); err == nil {
		obs.storage = cond
	}
	return nil
}

// reconcileConsumer creates or updates ep's durable consumers in its namespace: on the events
// stream, where the dispatcher takes each event its patterns match, and on the deliveries
// stream (retries, replays, test deliveries, held events). Consumers on source namespaces'
// events streams are the dispatcher reconciler's (reconcileSources).
func (r *EndpointReconciler) reconcileConsumer(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) error {
	if streams.LaneOf(&ep.Spec) == streams.LaneShared {
		draining, err := r.reconcileSharedLane(ctx, ep, obs)
		if draining {
			obs.requeue = drainRecheck
		}
		return err
	}
	set := r.NATS.Config().For(ep.Namespace)
	opts := streams.EndpointConsumerOptionsFor(&ep.Spec)
	err := r.NATS.EnsureAndDo(ctx, ep.Namespace, func(ctx context.Context, js jetstream.JetStream) error {
		if err := set.EnsureDeliveriesConsumer(ctx, js, ep.Name, opts); err != nil {
			return err
		}
		start, err := eventsStart(ctx, js, set, ep)
		if err != nil {
			return err
		}
		return set.EnsureEventsConsumer(ctx, js, ep.Namespace, ep.Name, streams.EventPatterns(&ep.Spec), opts, start)
	})
	name := set.EndpointConsumer(ep.Name)
	if err != nil {
		obs.block(v1alpha1.ReasonNATSUnavailable, "cannot create consumer %s: %v", name, err)
		return nil
	}
	obs.status.ConsumerName = name
	obs.status.Lane = streams.LaneOwn.String()
	obs.status.SharedSince = nil
	obs.status.DrainingConsumers = nil
	return nil
}

// eventsStart is where a new consumer of ep on set's events stream starts: at the endpoint's
// creation, so events published while it was being wired reach it; or, when the router of an
// earlier version still has its consumer there, right after what that router settled (it
// wrote those events' deliveries, which the deliveries consumer delivers), so upgrading
// delivers nothing twice.
func eventsStart(ctx context.Context, js jetstream.JetStream, set streams.Set, ep *v1alpha1.WebhookEndpoint) (streams.ConsumerStart, error) {
	dedicated := ""
	if d := ep.Spec.Dispatcher; d != nil && d.Dedicated {
		dedicated = ep.Name
	}
	c, err := js.Consumer(ctx, set.EventsStream(), streams.RouterConsumer(ep.Namespace, dedicated))
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		return streams.ConsumerStart{Time: ep.CreationTimestamp.Time}, nil
	case err != nil:
		return streams.ConsumerStart{}, err
	}
	return streams.ConsumerStart{Seq: c.CachedInfo().AckFloor.Stream + 1}, nil
}

// SetupWithManager registers the reconciler and what it watches with mgr: its endpoints (spec
// changes and the start of a deletion), their dispatcher Deployments' availability, the
// Secrets and RetryPolicies they reference, the source namespaces' consent, the NATS
// connection coming back, the namespaces' storage bounds, the endpoints whose admission by
// their WebhookQuota changed, and the streams ConfigMaps (a deleted one is created again). The
// endpoint field indexes (IndexEndpoints) must be registered first.
func (r *EndpointReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.guard = r.Options.Config.Outbound()
	r.status = &statusWriter[v1alpha1.WebhookEndpointStatus]{client: r.Client, recorder: r.Recorder, backoff: newBackoff(natsRetryBase, natsRetryMax)}
	r.storage = newStorageWatch(r.NATS, r.Client, r.Options.StorageCheckInterval)
	if err := mgr.Add(r.storage); err != nil {
		return err
	}
	// Status writes reconcile nothing (specOrDeletionChanged), so the cache's updates tell the
	// status writer when it shows a write: what it remembered of it is forgotten then.
	inf, err := mgr.GetCache().GetInformer(context.Background(), &v1alpha1.WebhookEndpoint{})
	if err != nil {
		return err
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: func(_, o any) {
		if ep, ok := o.(*v1alpha1.WebhookEndpoint); ok {
			r.status.observed(ep, controllerFields(ep.Status))
		}
	}}); err != nil {
		return err
	}
	c := r.Client
	return ctrl.NewControllerManagedBy(mgr).
		Named("webhookendpoint").
		For(&v1alpha1.WebhookEndpoint{}, builder.WithPredicates(specOrDeletionChanged())).
		Watches(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			if r.Options.isPool(o.GetNamespace(), o.GetName()) {
				// The shared dispatcher: every endpoint it may serve.
				return endpointsMatching(ctx, c, "", indexDispatcher, names.SharedDispatcher)
			}
			return endpointsMatching(ctx, c, o.GetNamespace(), indexDispatcher, o.GetName())
		}), builder.WithPredicates(availabilityChanged())).
		WatchesMetadata(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return endpointsMatching(ctx, c, o.GetNamespace(), indexSecrets, o.GetName())
		})).
		Watches(&v1alpha1.RetryPolicy{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return endpointsMatching(ctx, c, o.GetNamespace(), indexRetryPolicy, o.GetName())
		}), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(r.NATS.subscribe(), handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ string) []reconcile.Request {
			return endpointsMatching(ctx, c, "", "", "")
		}))).
		// An endpoint reading source namespaces that comes, changes or goes moves the others
		// of its namespace into or out of their dispatcher's bus grant (SourceGrantFull).
		Watches(&v1alpha1.WebhookEndpoint{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			ep, ok := o.(*v1alpha1.WebhookEndpoint)
			if !ok || !r.Options.BusAuth.Callout || len(ep.Spec.SourceNamespaces) == 0 {
				return nil
			}
			var out []reconcile.Request
			for _, other := range listEndpoints(ctx, c, ep.Namespace, "", "") {
				if other.Name != ep.Name && len(other.Spec.SourceNamespaces) > 0 {
					out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&other)})
				}
			}
			return out
		}), builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.Funcs{
			CreateFunc: func(event.CreateEvent) bool { return false }, DeleteFunc: func(event.DeleteEvent) bool { return true },
			UpdateFunc: func(event.UpdateEvent) bool { return false }, GenericFunc: func(event.GenericEvent) bool { return false },
		}))).
		// A source namespace that gives or withdraws its consent.
		WatchesMetadata(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return endpointsMatching(ctx, c, "", indexSources, o.GetName())
		})).
		// A namespace whose dead letters or delivery log reached or left their size bounds.
		WatchesRawSource(source.Channel(r.storage.changed, handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ string) []reconcile.Request {
			var out []reconcile.Request
			for _, ns := range r.storage.takeChanged() {
				out = append(out, endpointsMatching(ctx, c, ns, "", "")...)
			}
			return out
		}))).
		// Endpoints whose admission by their namespace's WebhookQuota changed.
		WatchesRawSource(r.Quotas.endpointsWoken()).
		// A streams ConfigMap deleted while the namespace keeps its endpoints is created again.
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return endpointsMatching(ctx, c, o.GetNamespace(), "", "")
		}), builder.WithPredicates(deletions())).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.Options.concurrency()}).
		Complete(r)
}
