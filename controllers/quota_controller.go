package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	acv1alpha1 "github.com/webhook-operator/webhook-operator/api/applyconfiguration/api/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/quota"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// +kubebuilder:rbac:groups=webhook-operator.io,resources=webhookquotas,verbs=get;list;watch
// +kubebuilder:rbac:groups=webhook-operator.io,resources=webhookquotas/status,verbs=get;update;patch

// DefaultQuotaInterval is how often a quota's usage (stored bytes, publish rate) is read again.
const DefaultQuotaInterval = 30 * time.Second

// maxHeldBack bounds status.heldBack.
const maxHeldBack = 20

// QuotaReconciler reports a namespace's WebhookQuota: it puts the storage bounds in force
// (the namespace's streams are updated, through the StreamSetCreator, once they exist), tells
// the endpoints whose admission changed to reconcile (each endpoint decides its own with
// quota.Admit, the same rule), and writes usage, limits and conditions to the status, and
// the quota's metrics. The limits are enforced where each is spent: the endpoint reconciler
// holds back endpoints, the dispatcher reconciler makes no dedicated dispatcher for them, the
// streams' bounds hold the storage, the auth callout withholds direct publishing while a rate
// is set, and the ingress limits the rate.
type QuotaReconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder
	NATS     *JetStream
	Sets     *StreamSetCreator
	// Options give the installation's defaults, the interval between readings of usage
	// (StorageCheckInterval, DefaultQuotaInterval when 0) and the concurrency.
	Options *Options

	status *statusWriter[v1alpha1.WebhookQuotaStatus]

	// once makes what follows, on first use: by SetupWithManager or by the endpoint or
	// dispatcher reconciler's, whichever runs first, since they watch changed and
	// dispatchersChanged.
	once sync.Once
	mu   sync.Mutex
	// verdicts are the admissions last reported per namespace, to tell endpoints whose
	// admission changed; applied the bounds last put in force; seq the events stream's last
	// sequence and when it was read (the publish rate).
	verdicts map[string]map[string]quota.Verdict
	// defaults are, per namespace without a quota, the verdicts of the installation's bound on
	// endpoints (Options.MaxEndpointsPerNamespace), to tell endpoints whose admission changed.
	defaults map[string]map[string]quota.Verdict
	applied  map[string]string
	rate     map[string]rateReading
	// dirty are the endpoints whose admission changed, and dirtyDispatchers their
	// dispatchers; changed and dispatchersChanged wake the endpoint and the dispatcher
	// controllers for them.
	dirty, dirtyDispatchers     map[types.NamespacedName]bool
	changed, dispatchersChanged chan event.TypedGenericEvent[string]
}

type rateReading struct {
	at  time.Time
	seq uint64
}

// quotaObservation is what one reconcile found; only summarize turns it into status.
type quotaObservation struct {
	problems
	status v1alpha1.WebhookQuotaStatus
	// limited names what a limit holds back, for LimitReached.
	limited []string
	reasons []string
}

// quotaStep is one step of a quota's reconcile.
type quotaStep func(ctx context.Context, q *v1alpha1.WebhookQuota, obs *quotaObservation) error

func (r *QuotaReconciler) init() {
	r.once.Do(func() {
		r.verdicts, r.defaults = map[string]map[string]quota.Verdict{}, map[string]map[string]quota.Verdict{}
		r.applied, r.rate = map[string]string{}, map[string]rateReading{}
		r.dirty, r.dirtyDispatchers = map[types.NamespacedName]bool{}, map[types.NamespacedName]bool{}
		r.changed, r.dispatchersChanged = make(chan event.TypedGenericEvent[string], 1), make(chan event.TypedGenericEvent[string], 1)
	})
}

// SetupWithManager registers the reconciler with mgr: quotas, and the endpoints of their
// namespaces. The namespace's streams take its storage bounds from here on (JetStream.Ensure
// reads them with QuotaBounds).
func (r *QuotaReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.init()
	r.status = &statusWriter[v1alpha1.WebhookQuotaStatus]{client: r.Client, recorder: r.Recorder}
	r.NATS.bounds = QuotaBounds(r.Client)
	registerQuotaMetrics()
	return ctrl.NewControllerManagedBy(mgr).
		Named("webhookquota").
		For(&v1alpha1.WebhookQuota{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// An endpoint created, changed or deleted changes what the quota admits and counts.
		Watches(&v1alpha1.WebhookEndpoint{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: v1alpha1.QuotaName}}}
		}), builder.WithPredicates(specOrDeletionChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.Options.concurrency()}).
		Complete(r)
}

// endpointsWoken is the source of the endpoints whose admission changed, for the endpoint
// reconciler to watch.
func (r *QuotaReconciler) endpointsWoken() source.TypedSource[reconcile.Request] {
	r.init()
	return source.Channel(r.changed, handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, string) []reconcile.Request {
		return r.takeChanged()
	}))
}

// dispatchersWoken is the source of those endpoints' dispatchers, for the dispatcher
// reconciler to watch.
func (r *QuotaReconciler) dispatchersWoken() source.TypedSource[reconcile.Request] {
	r.init()
	return source.Channel(r.dispatchersChanged, handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, string) []reconcile.Request {
		return r.takeChangedDispatchers()
	}))
}

// takeChanged returns the endpoints whose admission changed since the last call.
func (r *QuotaReconciler) takeChanged() []reconcile.Request { return r.take(r.dirty) }

// takeChangedDispatchers returns the dispatchers of those endpoints.
func (r *QuotaReconciler) takeChangedDispatchers() []reconcile.Request {
	return r.take(r.dirtyDispatchers)
}

func (r *QuotaReconciler) take(m map[types.NamespacedName]bool) []reconcile.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]reconcile.Request, 0, len(m))
	for nn := range m {
		out = append(out, reconcile.Request{NamespacedName: nn})
	}
	clear(m)
	return out
}

// mark records that endpoint ep of namespace ns (served by dispatcher, when known) changed
// admission. Call with r.mu held.
func (r *QuotaReconciler) mark(ns, ep, dispatcher string) {
	r.dirty[types.NamespacedName{Namespace: ns, Name: ep}] = true
	if dispatcher != "" {
		r.dirtyDispatchers[types.NamespacedName{Namespace: ns, Name: dispatcher}] = true
	}
}

func (r *QuotaReconciler) interval() time.Duration {
	if i := r.Options.StorageCheckInterval; i > 0 {
		return i
	}
	return DefaultQuotaInterval
}

// Reconcile is the entry point: get, a deferred status patch, then the steps.
func (r *QuotaReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	q := &v1alpha1.WebhookQuota{}
	err := r.Client.Get(ctx, req.NamespacedName, q)
	if apierrors.IsNotFound(err) || err == nil && !q.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.forgetQuota(ctx, req.NamespacedName)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	obs := &quotaObservation{status: r.lastStatus(q)}
	defer func() {
		result, retErr = r.summarize(ctx, q, obs, result, retErr)
	}()
	for _, step := range []quotaStep{
		r.validate,
		r.applyBounds,
		r.observeAdmission,
		r.observeStorage,
		r.observeRate,
	} {
		if err := step(ctx, q, obs); err != nil || obs.found() != nil {
			return ctrl.Result{RequeueAfter: r.interval()}, err
		}
	}
	return ctrl.Result{RequeueAfter: r.interval()}, nil
}

// forgetQuota handles a namespace that lost its quota: its streams go back to the
// installation's bounds and every endpoint it held back is told to reconcile.
func (r *QuotaReconciler) forgetQuota(ctx context.Context, nn types.NamespacedName) error {
	if nn.Name != v1alpha1.QuotaName {
		return nil
	}
	ns := nn.Namespace
	// Without a quota the installation's bound on endpoints holds (--max-endpoints-per-namespace).
	list := &v1alpha1.WebhookEndpointList{}
	if err := r.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
		return err
	}
	var next map[string]quota.Verdict
	if r.Options.MaxEndpointsPerNamespace > 0 {
		next = quota.Admit(nil, list.Items, r.Options.quotaDefaults()).Verdicts
	}
	dispatcherOf := map[string]string{}
	for i := range list.Items {
		dispatcherOf[list.Items[i].Name] = names.Dispatcher(&list.Items[i])
	}
	r.mu.Lock()
	prev, had := r.verdicts[ns]
	if !had {
		prev = r.defaults[ns]
	}
	_, bounded := r.applied[ns]
	delete(r.verdicts, ns)
	delete(r.applied, ns)
	delete(r.rate, ns)
	if len(next) > 0 {
		r.defaults[ns] = next
	} else {
		delete(r.defaults, ns)
	}
	marked := false
	// Held back before (by the quota or the bound) and not now, or held back now and not
	// before (or for another reason).
	for ep, v := range prev {
		if nv, ok := next[ep]; !v.Admitted && (!ok || nv.Admitted) {
			r.mark(ns, ep, dispatcherOf[ep])
			marked = true
		}
	}
	for ep, v := range next {
		if pv, ok := prev[ep]; !v.Admitted && (!ok || pv.Admitted || pv.Message != v.Message) {
			r.mark(ns, ep, dispatcherOf[ep])
			marked = true
		}
	}
	r.mu.Unlock()
	if had {
		r.status.forget(nn)
		deleteQuotaMetrics(ns)
	}
	if had || marked {
		r.notify()
	}
	if bounded {
		return r.ensureStreams(ctx, ns)
	}
	return nil
}

func (r *QuotaReconciler) notify() {
	for _, c := range []chan event.TypedGenericEvent[string]{r.changed, r.dispatchersChanged} {
		select {
		case c <- event.TypedGenericEvent[string]{Object: "quota"}:
		default: // one is on its way; it takes every one marked
		}
	}
}

// lastStatus is the status this process last wrote (the cache may not show it yet), else the
// cache's.
func (r *QuotaReconciler) lastStatus(q *v1alpha1.WebhookQuota) v1alpha1.WebhookQuotaStatus {
	if st, ok := r.status.last(q, q.Status); ok {
		return *st.DeepCopy()
	}
	return *q.Status.DeepCopy()
}

// validate checks what the schema cannot: the storage bounds' sizes.
func (r *QuotaReconciler) validate(_ context.Context, q *v1alpha1.WebhookQuota, obs *quotaObservation) error {
	if why := quota.ValidateStorage(&q.Spec); why != "" {
		obs.stall(v1alpha1.ReasonInvalidSpec, "%s; the installation's bounds apply meanwhile", why)
	}
	return nil
}

// applyBounds puts the quota's storage bounds in force on the namespace's streams once they
// exist (the first endpoint creates them, with these bounds): again only when the bounds
// changed.
func (r *QuotaReconciler) applyBounds(ctx context.Context, q *v1alpha1.WebhookQuota, obs *quotaObservation) error {
	b := quota.Bounds(&q.Spec)
	want := fmt.Sprintf("%+v", b)
	r.mu.Lock()
	done := r.applied[q.Namespace] == want
	r.mu.Unlock()
	// A deliveries stream that held more than a lowered bound kept a raised one
	// (streams.Set.Ensure): it is updated again until it has the quota's.
	if st := q.Status.Storage; done && b.Deliveries > 0 && st != nil && st.Deliveries != nil &&
		st.Deliveries.Limit != nil && st.Deliveries.Limit.Value() != b.Deliveries {
		done = false
	}
	if done {
		return nil
	}
	if err := r.ensureStreams(ctx, q.Namespace); err != nil {
		if full := (*streams.StorageFullError)(nil); errors.As(err, &full) {
			// NATS answers, but the bounds do not fit: the quota says what to change.
			obs.block(v1alpha1.ReasonInsufficientStorage, "%v", full)
			return nil
		}
		return err
	}
	r.mu.Lock()
	r.applied[q.Namespace] = want
	r.mu.Unlock()
	return nil
}

// ensureStreams updates namespace ns's streams to their bounds, when the namespace has them
// (a set is only ever created with its streams ConfigMap, by an endpoint or dispatcher).
func (r *QuotaReconciler) ensureStreams(ctx context.Context, ns string) error {
	cm := &corev1.ConfigMap{}
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.StreamsConfigMap}, cm)
	if apierrors.IsNotFound(err) || err == nil && !cm.DeletionTimestamp.IsZero() {
		return nil
	}
	if err != nil {
		return err
	}
	r.NATS.forget(ns)
	if err := r.Sets.ensure(ctx, ns); err != nil {
		return fmt.Errorf("%w: updating the streams of namespace %s to the quota's bounds: %w", ErrNATSUnavailable, ns, err)
	}
	return nil
}

// observeAdmission decides the namespace's endpoints as they do themselves, counts what the
// admitted ones take, and marks for reconcile the endpoints whose admission changed.
func (r *QuotaReconciler) observeAdmission(ctx context.Context, q *v1alpha1.WebhookQuota, obs *quotaObservation) error {
	list := &v1alpha1.WebhookEndpointList{}
	if err := r.Client.List(ctx, list, client.InNamespace(q.Namespace)); err != nil {
		return err
	}
	res := quota.Admit(&q.Spec, list.Items, r.Options.quotaDefaults())
	count := func(limit *int32, used int64) *v1alpha1.QuotaCount {
		c := &v1alpha1.QuotaCount{Used: used}
		if limit != nil {
			l := int64(*limit)
			c.Limit = &l
		}
		return c
	}
	st := &obs.status
	st.Endpoints = count(q.Spec.MaxEndpoints, res.Usage.Endpoints)
	st.DeliveriesInFlight = count(q.Spec.MaxDeliveriesInFlight, res.Usage.InFlight)
	var maxDedicated *int32
	if d := q.Spec.DedicatedDispatchers; d != nil {
		maxDedicated = d.Max
	}
	st.DedicatedDispatchers = count(maxDedicated, res.Usage.Dedicated)
	st.HeldBack = nil
	for _, name := range res.HeldBack {
		v := res.Verdicts[name]
		if len(st.HeldBack) < maxHeldBack {
			st.HeldBack = append(st.HeldBack, v1alpha1.QuotaHold{Endpoint: name, Reason: v.Reason, Message: boundMessage(v.Message)})
		}
		if !slices.Contains(obs.reasons, v.Reason) {
			obs.reasons = append(obs.reasons, v.Reason)
		}
	}
	if n := len(res.HeldBack); n > 0 {
		obs.limited = append(obs.limited, fmt.Sprintf("%d endpoint(s) held back (%s)", n, strings.Join(res.HeldBack[:min(n, 5)], ", ")))
	}
	heldBack := map[string]int{}
	for _, name := range res.HeldBack {
		heldBack[res.Verdicts[name].Reason]++
	}
	quotaMetrics.setAdmission(q, res.Usage, heldBack)

	dispatcherOf := map[string]string{}
	for i := range list.Items {
		dispatcherOf[list.Items[i].Name] = names.Dispatcher(&list.Items[i])
	}
	r.mu.Lock()
	prev, known := r.verdicts[q.Namespace]
	delete(r.defaults, q.Namespace) // the quota decides now; !known marks every endpoint
	for name, v := range res.Verdicts {
		if old, ok := prev[name]; !known || !ok && !v.Admitted || ok && (old.Admitted != v.Admitted || old.Message != v.Message) {
			r.mark(q.Namespace, name, dispatcherOf[name])
		}
	}
	r.verdicts[q.Namespace] = res.Verdicts
	n := len(r.dirty) + len(r.dirtyDispatchers)
	r.mu.Unlock()
	if n > 0 {
		r.notify()
	}
	return nil
}

// observeStorage reads what each of the namespace's streams holds of its bound.
func (r *QuotaReconciler) observeStorage(ctx context.Context, q *v1alpha1.WebhookQuota, obs *quotaObservation) error {
	set := r.NATS.Config().For(q.Namespace)
	usage := &v1alpha1.StorageUsage{}
	slots := []struct {
		stream, what string
		out          **v1alpha1.QuotaBytes
	}{
		{set.EventsStream(), "events", &usage.Events},
		{set.DeliveriesStream(), "deliveries", &usage.Deliveries},
		{set.AttemptsStream(), "delivery_log", &usage.DeliveryLog},
		{set.DeadLetterStream(), "dead_letters", &usage.DeadLetters},
	}
	err := r.NATS.Do(ctx, q.Namespace, func(ctx context.Context, js jetstream.JetStream) error {
		for _, s := range slots {
			info, err := streamInfo(ctx, js, s.stream)
			if err != nil {
				return err
			}
			b := &v1alpha1.QuotaBytes{Used: *resource.NewQuantity(int64(info.State.Bytes), resource.BinarySI)}
			if info.Config.MaxBytes > 0 {
				b.Limit = resource.NewQuantity(info.Config.MaxBytes, resource.BinarySI)
				// The deliveries stream counts as at its bound where held events stop (80%).
				full := atByteLimit(info)
				if s.stream == set.DeliveriesStream() {
					full = deliveriesFull(info) != ""
				}
				if full {
					obs.limited = append(obs.limited, fmt.Sprintf("stream %s holds %s of its %s bound", s.stream, b.Used.String(), b.Limit.String()))
					if !slices.Contains(obs.reasons, v1alpha1.ReasonStorageLimit) {
						obs.reasons = append(obs.reasons, v1alpha1.ReasonStorageLimit)
					}
				}
			}
			*s.out = b
			quotaMetrics.setStorage(q.Namespace, s.what, int64(info.State.Bytes), info.Config.MaxBytes)
		}
		return nil
	})
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		// No endpoint yet: nothing is stored.
		obs.status.Storage = nil
		return nil
	case err != nil:
		obs.block(v1alpha1.ReasonNATSUnavailable, "cannot read the namespace's streams: %v", err)
		return nil
	}
	obs.status.Storage = usage
	return nil
}

// observeRate measures the publish rate: the events the namespace's events stream stored
// between two readings.
func (r *QuotaReconciler) observeRate(ctx context.Context, q *v1alpha1.WebhookQuota, obs *quotaObservation) error {
	var limit *int64
	if q.Spec.EventsPerSecond != nil {
		l := int64(*q.Spec.EventsPerSecond)
		limit = &l
	}
	var last uint64
	err := r.NATS.Do(ctx, q.Namespace, func(ctx context.Context, js jetstream.JetStream) error {
		info, err := streamInfo(ctx, js, r.NATS.Config().For(q.Namespace).EventsStream())
		if err == nil {
			last = info.State.LastSeq
		}
		return err
	})
	now := time.Now()
	var used int64
	r.mu.Lock()
	prev, ok := r.rate[q.Namespace]
	if err == nil {
		r.rate[q.Namespace] = rateReading{at: now, seq: last}
	}
	r.mu.Unlock()
	if err == nil && ok && last >= prev.seq && now.Sub(prev.at) > time.Second {
		used = int64(float64(last-prev.seq) / now.Sub(prev.at).Seconds())
	} else if old := obs.status.EventsPerSecond; old != nil {
		used = old.Used
	}
	obs.status.EventsPerSecond = &v1alpha1.QuotaCount{Limit: limit, Used: used}
	quotaMetrics.setRate(q.Namespace, limit, used)
	return nil
}

// summarize is the one place a quota's status is written: summarize's rule gives Ready,
// Reconciling and Stalled; LimitReached says what a limit holds back (the last one stays when
// this reconcile could not tell), and statusWriter.finish applies the status when it changed
// and records an Event when LimitReached changes.
func (r *QuotaReconciler) summarize(ctx context.Context, q *v1alpha1.WebhookQuota, obs *quotaObservation, result ctrl.Result, err error) (ctrl.Result, error) {
	st := obs.status
	v := summarize(err, obs.found(), func() verdict {
		return verdict{ready: conditions.True(v1alpha1.ConditionReady, v1alpha1.ReasonApplied, "the quota's limits are in force")}
	})
	var limited *metav1.Condition
	switch {
	case len(obs.limited) > 0:
		limited = conditions.True(v1alpha1.ConditionLimitReached, strings.Join(obs.reasons, ","), boundMessage(strings.Join(obs.limited, "; ")))
	case err == nil && obs.found() == nil:
		limited = conditions.False(v1alpha1.ConditionLimitReached, v1alpha1.ReasonWithinQuota, "no limit holds anything back")
	default:
		limited = meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionLimitReached)
	}
	if err == nil {
		st.ObservedGeneration = q.Generation
	}
	st.Conditions = conditions.Set(st.Conditions, q.Generation, time.Now(), v.ready, v.reconciling, v.stalled, limited)
	var announce []*metav1.Condition
	if limited != nil {
		announce = append(announce, limited)
	}
	before := r.lastStatus(q)
	return r.status.finish(ctx, q, ending[v1alpha1.WebhookQuotaStatus]{
		before: before, status: st, was: before.Conditions, announce: announce,
		apply: quotaStatus(q, &st), problem: obs.found(), result: result, err: err,
	})
}

// boundMessage keeps a message within a condition's and a hold's bound.
func boundMessage(s string) string {
	if len(s) > 1000 {
		return s[:997] + "..."
	}
	return s
}

// quotaStatus is the apply configuration of a quota's status; the controller is its only
// writer.
func quotaStatus(q *v1alpha1.WebhookQuota, st *v1alpha1.WebhookQuotaStatus) *acv1alpha1.WebhookQuotaApplyConfiguration {
	s := acv1alpha1.WebhookQuotaStatus().WithObservedGeneration(st.ObservedGeneration).
		WithConditions(conditions.Apply(st.Conditions)...)
	count := func(c *v1alpha1.QuotaCount) *acv1alpha1.QuotaCountApplyConfiguration {
		ac := acv1alpha1.QuotaCount().WithUsed(c.Used)
		if c.Limit != nil {
			ac.WithLimit(*c.Limit)
		}
		return ac
	}
	if c := st.Endpoints; c != nil {
		s.WithEndpoints(count(c))
	}
	if c := st.DedicatedDispatchers; c != nil {
		s.WithDedicatedDispatchers(count(c))
	}
	if c := st.DeliveriesInFlight; c != nil {
		s.WithDeliveriesInFlight(count(c))
	}
	if c := st.EventsPerSecond; c != nil {
		s.WithEventsPerSecond(count(c))
	}
	if u := st.Storage; u != nil {
		bytes := func(b *v1alpha1.QuotaBytes) *acv1alpha1.QuotaBytesApplyConfiguration {
			ac := acv1alpha1.QuotaBytes().WithUsed(b.Used)
			if b.Limit != nil {
				ac.WithLimit(*b.Limit)
			}
			return ac
		}
		su := acv1alpha1.StorageUsage()
		if u.Events != nil {
			su.WithEvents(bytes(u.Events))
		}
		if u.Deliveries != nil {
			su.WithDeliveries(bytes(u.Deliveries))
		}
		if u.DeliveryLog != nil {
			su.WithDeliveryLog(bytes(u.DeliveryLog))
		}
		if u.DeadLetters != nil {
			su.WithDeadLetters(bytes(u.DeadLetters))
		}
		s.WithStorage(su)
	}
	for _, h := range st.HeldBack {
		s.WithHeldBack(acv1alpha1.QuotaHold().WithEndpoint(h.Endpoint).WithReason(h.Reason).WithMessage(h.Message))
	}
	return acv1alpha1.WebhookQuota(q.Name, q.Namespace).WithStatus(s)
}

// quotaGauges are the quotas' gauges in the controller's /metrics, labelled by namespace and
// resource: the limit (absent when the quota sets none), what is used, and how many endpoints
// each limit holds back.
type quotaGauges struct {
	limit, used, heldBack *prometheus.GaugeVec
	once                  sync.Once
}

var quotaMetrics = &quotaGauges{
	limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "webhook_quota_limit",
		Help: "A namespace's WebhookQuota limit, by resource: endpoints, dedicated_dispatchers, deliveries_in_flight, events_per_second, and the streams' bounds in bytes (storage_events, storage_deliveries, storage_delivery_log, storage_dead_letters)."},
		[]string{"namespace", "resource"}),
	used: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "webhook_quota_used",
		Help: "What a namespace uses of each resource of its WebhookQuota: admitted endpoints, their dedicated dispatchers and maxInFlight, the measured publish rate, the bytes each stream holds."},
		[]string{"namespace", "resource"}),
	heldBack: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "webhook_quota_held_back_endpoints",
		Help: "Endpoints a namespace's WebhookQuota holds back (not Ready, QuotaExceeded), by the limit's reason."},
		[]string{"namespace", "reason"}),
}

func registerQuotaMetrics() {
	quotaMetrics.once.Do(func() {
		ctrlmetrics.Registry.MustRegister(quotaMetrics.limit, quotaMetrics.used, quotaMetrics.heldBack)
	})
}

func (g *quotaGauges) set(ns, res string, limit *int64, used int64) {
	if limit == nil {
		g.limit.DeleteLabelValues(ns, res)
	} else {
		g.limit.WithLabelValues(ns, res).Set(float64(*limit))
	}
	g.used.WithLabelValues(ns, res).Set(float64(used))
}

func ptr64(v *int32) *int64 {
	if v == nil {
		return nil
	}
	n := int64(*v)
	return &n
}

// setAdmission sets the counted resources and the endpoints held back.
func (g *quotaGauges) setAdmission(q *v1alpha1.WebhookQuota, u quota.Usage, heldBack map[string]int) {
	ns := q.Namespace
	var maxDedicated *int32
	if d := q.Spec.DedicatedDispatchers; d != nil {
		maxDedicated = d.Max
	}
	g.set(ns, "endpoints", ptr64(q.Spec.MaxEndpoints), u.Endpoints)
	g.set(ns, "dedicated_dispatchers", ptr64(maxDedicated), u.Dedicated)
	g.set(ns, "deliveries_in_flight", ptr64(q.Spec.MaxDeliveriesInFlight), u.InFlight)
	for _, reason := range []string{v1alpha1.ReasonEndpointLimit, v1alpha1.ReasonDedicatedDispatcherLimit,
		v1alpha1.ReasonDedicatedDispatcherResources, v1alpha1.ReasonInFlightLimit} {
		g.heldBack.WithLabelValues(ns, reason).Set(float64(heldBack[reason]))
	}
}

// setStorage sets one stream's bytes and bound (0: unbounded).
func (g *quotaGauges) setStorage(ns, stream string, used, bound int64) {
	var limit *int64
	if bound > 0 {
		limit = &bound
	}
	g.set(ns, "storage_"+stream, limit, used)
}

// setRate sets the publish rate.
func (g *quotaGauges) setRate(ns string, limit *int64, used int64) {
	g.set(ns, "events_per_second", limit, used)
}

// deleteQuotaMetrics removes a namespace's series once it has no quota.
func deleteQuotaMetrics(ns string) {
	for _, v := range []*prometheus.GaugeVec{quotaMetrics.limit, quotaMetrics.used, quotaMetrics.heldBack} {
		v.DeletePartialMatch(prometheus.Labels{"namespace": ns})
	}
}
