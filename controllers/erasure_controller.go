package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	acv1alpha1 "github.com/webhook-operator/webhook-operator/api/applyconfiguration/api/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
	"github.com/webhook-operator/webhook-operator/internal/erasure"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// +kubebuilder:rbac:groups=webhook-operator.io,resources=webhookerasures,verbs=get;list;watch
// +kubebuilder:rbac:groups=webhook-operator.io,resources=webhookerasures/status,verbs=get;update;patch

// Bounds of the erasure reconciler's work.
const (
	// erasureBatch is the most messages one reconcile of an erasure reads.
	erasureBatch = 2000
	// DefaultMaxErasures and DefaultMaxErasuresPerNamespace bound the erasures in progress
	// at once (each holds the ids of the events it matched, up to erasure.MaxMatchedEvents).
	DefaultMaxErasures             = 4
	DefaultMaxErasuresPerNamespace = 1
	// queuedRetry is how often a queued erasure looks for a free place.
	queuedRetry = 2 * time.Second
	// erasureBatchTimeout bounds one batch's work with NATS.
	erasureBatchTimeout = 30 * time.Second
	// settleMargin is added to the longest ack wait before the Settle phase reads.
	settleMargin = 5 * time.Second
)

// ErasureReconciler runs WebhookErasures with the erasure engine (internal/erasure): a bounded
// batch per reconcile from the cursor kept in status (its phases: collect the selected
// events, erase their payloads from the delivery log and the dead letters, delete them from
// the deliveries and events streams, then settle what attempts in flight wrote meanwhile),
// the counts in status, and once complete the webhook_operator.erasure.completed
// operational event. A WebhookErasure acts in its own namespace only: a subject outside it is
// refused. It has no finalizer: deleting one stops it (its job is forgotten at once). At most
// MaxErasures erasures are in progress at once, MaxErasuresPerNamespace in one namespace: the
// others wait, Queued.
type ErasureReconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder
	NATS     *JetStream
	// MaxConcurrentReconciles is how many reconciles run at once (at least 1).
	MaxConcurrentReconciles int
	// MaxErasures and MaxErasuresPerNamespace bound the erasures in progress at once, in all
	// and in one namespace (DefaultMaxErasures, DefaultMaxErasuresPerNamespace when 0).
	MaxErasures, MaxErasuresPerNamespace int
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	status *statusWriter[v1alpha1.WebhookErasureStatus]
	// jobs are the erasures in progress in this process, with the event ids they matched.
	jobs *erasureJobs
}

// SetupWithManager registers the reconciler with mgr: an erasure runs when it is created.
func (r *ErasureReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.status = &statusWriter[v1alpha1.WebhookErasureStatus]{client: r.Client, recorder: r.Recorder, backoff: newBackoff(natsRetryBase, natsRetryMax)}
	r.jobs = newErasureJobs(r.MaxErasures, r.MaxErasuresPerNamespace)
	registerPayloadMetrics()
	return ctrl.NewControllerManagedBy(mgr).
		Named("webhookerasure").
		For(&v1alpha1.WebhookErasure{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1)}).
		Complete(r)
}

func (r *ErasureReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// erasureObservation is what one reconcile found and did; only summarize turns it into
// status.
type erasureObservation struct {
	problems
	status v1alpha1.WebhookErasureStatus
	// waiting says why the erasure waits (a phase's wait), when it does.
	waiting *problem
	stop    bool
}

type erasureStep func(ctx context.Context, wx *v1alpha1.WebhookErasure, obs *erasureObservation, result *ctrl.Result) error

// Reconcile is the entry point: get, a deferred status patch, then the steps.
func (r *ErasureReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	wx := &v1alpha1.WebhookErasure{}
	if err := r.Client.Get(ctx, req.NamespacedName, wx); err != nil {
		if apierrors.IsNotFound(err) {
			// Deleted, mid-run or not: its job and its place go.
			r.status.forget(req.NamespacedName)
			r.jobs.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !wx.DeletionTimestamp.IsZero() {
		r.jobs.forget(req.NamespacedName)
		return ctrl.Result{}, nil
	}
	obs := &erasureObservation{status: r.lastStatus(wx)}
	defer func() {
		result, retErr = r.summarize(ctx, wx, obs, result, retErr)
	}()
	for _, step := range []erasureStep{
		r.complete,
		r.erase,
	} {
		if err := step(ctx, wx, obs, &result); err != nil || obs.found() != nil || obs.stop {
			return result, err
		}
	}
	return result, nil
}

func (r *ErasureReconciler) lastStatus(wx *v1alpha1.WebhookErasure) v1alpha1.WebhookErasureStatus {
	if st, ok := r.status.last(wx, wx.Status); ok {
		return *st.DeepCopy()
	}
	return *wx.Status.DeepCopy()
}

func (r *ErasureReconciler) forgetJob(wx *v1alpha1.WebhookErasure) {
	r.jobs.forget(types.NamespacedName{Namespace: wx.Namespace, Name: wx.Name})
}

// complete ends the reconcile of a complete erasure, and of one that stopped for good (its
// expression reached a bound, or it matched too many events): it stays Stalled, and is not
// run again.
func (r *ErasureReconciler) complete(_ context.Context, wx *v1alpha1.WebhookErasure, obs *erasureObservation, _ *ctrl.Result) error {
	if obs.status.CompletedAt != nil {
		r.forgetJob(wx)
		obs.stop = true
		return nil
	}
	if c := meta.FindStatusCondition(obs.status.Conditions, v1alpha1.ConditionStalled); c != nil && c.Status == metav1.ConditionTrue &&
		c.ObservedGeneration == wx.Generation && (c.Reason == v1alpha1.ReasonExpressionLimit || c.Reason == v1alpha1.ReasonTooManyEvents) {
		r.forgetJob(wx)
		obs.stall(c.Reason, "%s", c.Message)
	}
	return nil
}

// job is the erasure's job in this process: the one running, or a new one resuming at the
// status' cursor once there is room for it (otherwise nil, and obs says it is queued). A spec
// that names something outside the namespace, or whose expression does not compile, is a
// problem (Stalled).
func (r *ErasureReconciler) job(wx *v1alpha1.WebhookErasure, obs *erasureObservation, result *ctrl.Result) *erasure.Job {
	key := types.NamespacedName{Namespace: wx.Namespace, Name: wx.Name}
	if j := r.jobs.running(key, wx.UID); j != nil {
		return j
	}
	sel, err := erasure.SelectionOf(r.NATS.Config().For(wx.Namespace), &wx.Spec)
	var outside *erasure.OutsideError
	var exprErr *expr.Error
	switch {
	case errors.As(err, &outside):
		obs.stall(v1alpha1.ReasonOutsideNamespace, "refused: %v", err)
		return nil
	case errors.As(err, &exprErr):
		obs.stall(v1alpha1.ReasonInvalidExpression, "%v", err)
		return nil
	case err != nil:
		obs.stall(v1alpha1.ReasonInvalidSpec, "%v", err)
		return nil
	}
	j, queued := r.jobs.start(key, wx.UID, func() *erasure.Job { return erasure.NewJob(sel, progressOf(obs.status.Progress)) })
	if j == nil {
		obs.waiting = &problem{reason: v1alpha1.ReasonQueued, message: queued}
		result.RequeueAfter = queuedRetry
	}
	return j
}

// erase runs one batch of the erasure and adds what it did to the status.
func (r *ErasureReconciler) erase(ctx context.Context, wx *v1alpha1.WebhookErasure, obs *erasureObservation, result *ctrl.Result) error {
	j := r.job(wx, obs, result)
	if j == nil {
		return nil
	}
	if obs.status.StartedAt == nil {
		now := metav1.NewTime(r.now().UTC().Truncate(time.Second))
		obs.status.StartedAt = &now
	}
	engine, err := r.engine(ctx, wx.Namespace)
	if err != nil {
		return err
	}
	var step erasure.Step
	err = r.NATS.DoWithin(ctx, wx.Namespace, erasureBatchTimeout, func(ctx context.Context, js jetstream.JetStream) error {
		engine.JS = js
		var err error
		step, err = engine.Run(ctx, j, erasureBatch)
		return err
	})
	st := &obs.status
	st.Erased.Events += step.Counts.Events
	st.Erased.Deliveries += step.Counts.Deliveries
	st.Erased.DeliveryLogRecords += step.Counts.LogRecords
	st.Erased.DeadLetters += step.Counts.DeadLetters
	st.Unevaluated += step.Counts.Unevaluated
	st.Matched = max(st.Matched, int64(len(j.IDs)))
	st.Progress = progressStatus(j.Progress)
	erasedMetrics.add(wx.Namespace, step.Counts)
	var limit *erasure.ExpressionLimitError
	switch {
	case errors.Is(err, erasure.ErrTooManyEvents):
		r.forgetJob(wx)
		obs.stall(v1alpha1.ReasonTooManyEvents, "%v", err)
		return nil
	case errors.As(err, &limit) && ctx.Err() == nil:
		// The expression cannot decide on a stored event within its bounds: the erasure
		// stops rather than spend them again on every event.
		r.forgetJob(wx)
		obs.stall(v1alpha1.ReasonExpressionLimit, "stopped: %v; an erasure's expression must decide on every stored event within the bounds of an expression (what it builds, its work, %s): erase with a simpler one",
			err, expr.EvalTimeout)
		return nil
	case errors.Is(err, ErrNATSUnavailable):
		// The job keeps its ids and cursor: the next reconcile goes on from there.
		obs.block(v1alpha1.ReasonNATSUnavailable, "erasing: %v", err)
		return nil
	case err != nil:
		return err
	}
	if step.Done {
		if err := r.announce(ctx, wx, st); err != nil {
			obs.block(v1alpha1.ReasonNATSUnavailable, "publishing the erasure.completed operational event: %v", err)
			return nil
		}
		now := metav1.NewTime(r.now().UTC().Truncate(time.Second))
		st.CompletedAt = &now
		r.forgetJob(wx)
		return nil
	}
	result.RequeueAfter = nextBatch
	if !step.WaitUntil.IsZero() {
		result.RequeueAfter = max(time.Until(step.WaitUntil), nextBatch)
		obs.waiting = &problem{reason: step.WaitReason, message: step.WaitMessage}
	}
	return nil
}

// engine is the erasure engine of namespace ns: how far each endpoint's counts include the
// delivery log (their health keys), and how long an attempt in flight may still write (the
// longest ack wait of the namespace's endpoints).
func (r *ErasureReconciler) engine(ctx context.Context, ns string) (*erasure.Engine, error) {
	e := &erasure.Engine{Set: r.NATS.Config().For(ns), Now: r.Now}
	js := func() jetstream.JetStream { return e.JS }
	folded, wait, err := r.endpointsOf(ctx, e.Set, js)
	if err != nil {
		return nil, err
	}
	e.Folded = folded
	readers, err := r.readersOf(ctx, ns)
	if err != nil {
		return nil, err
	}
	for _, reader := range readers {
		set := r.NATS.Config().For(reader)
		folded, w, err := r.endpointsOf(ctx, set, js)
		if err != nil {
			return nil, err
		}
		e.Readers = append(e.Readers, erasure.Reader{Set: set, Folded: folded})
		wait = max(wait, w)
	}
	e.SettleWait = wait + settleMargin
	// A namespace's Settle phase waits only for its own attempts in flight: they write into
	// its streams alone. One without streams has none.
	e.Idle = func(ctx context.Context, set streams.Set) (bool, error) {
		idle, err := noneInFlight(ctx, e.JS, set)
		if streams.IsNotFound(err) {
			return true, nil
		}
		return idle, err
	}
	return e, nil
}

// endpointsOf are the fold lookup of the endpoints of set's namespace and their longest ack
// wait.
func (r *ErasureReconciler) endpointsOf(ctx context.Context, set streams.Set, js func() jetstream.JetStream) (erasure.FoldLookup, time.Duration, error) {
	list := &v1alpha1.WebhookEndpointList{}
	if err := r.Client.List(ctx, list, client.InNamespace(set.Namespace())); err != nil {
		return nil, 0, err
	}
	exists := map[string]bool{}
	wait := time.Duration(0)
	for i := range list.Items {
		ep := &list.Items[i]
		exists[ep.Name] = true
		wait = max(wait, set.EndpointConsumerConfig(ep.Name, streams.EndpointConsumerOptionsFor(&ep.Spec)).AckWait)
	}
	return foldLookup(set, js, exists), wait, nil
}

// readersOf are the other namespaces whose endpoints read namespace ns's events
// (spec.sourceNamespaces), sorted: they hold copies of its events, which its erasures erase
// too. Whether ns consents now does not matter: copies made while it did are still there.
func (r *ErasureReconciler) readersOf(ctx context.Context, ns string) ([]string, error) {
	list := &v1alpha1.WebhookEndpointList{}
	if err := r.Client.List(ctx, list, client.MatchingFields{indexSources: ns}); err != nil {
		return nil, err
	}
	var out []string
	for i := range list.Items {
		if reader := list.Items[i].Namespace; reader != ns && !slices.Contains(out, reader) {
			out = append(out, reader)
		}
	}
	slices.Sort(out)
	return out, nil
}

// noneInFlight reports whether no consumer of the namespace's events and deliveries streams
// has a message handed out and not acknowledged.
func noneInFlight(ctx context.Context, js jetstream.JetStream, set streams.Set) (bool, error) {
	for _, name := range []string{set.EventsStream(), set.DeliveriesStream()} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return false, err
		}
		l := s.ListConsumers(ctx)
		for info := range l.Info() {
			if info.NumAckPending > 0 {
				return false, nil
			}
		}
		if err := l.Err(); err != nil {
			return false, err
		}
	}
	return true, nil
}

// foldLookup reads how far an endpoint's health counts include the delivery log, from its
// health key in the namespace's bucket; an endpoint not in exists is counted by no one.
func foldLookup(set streams.Set, js func() jetstream.JetStream, exists map[string]bool) erasure.FoldLookup {
	var kv jetstream.KeyValue
	return func(ctx context.Context, ep string) (uint64, bool, error) {
		if !exists[ep] {
			return 0, false, nil
		}
		if kv == nil {
			var err error
			if kv, err = js().KeyValue(ctx, set.Bucket()); err != nil {
				return 0, false, err
			}
		}
		e, err := kv.Get(ctx, streams.HealthKey(ep))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0, true, nil
		}
		if err != nil {
			return 0, false, err
		}
		var h struct {
			Folded uint64 `json:"folded"`
		}
		if err := json.Unmarshal(e.Value(), &h); err != nil {
			return 0, true, nil
		}
		return h.Folded, true, nil
	}
}

// announce publishes the webhook_operator.erasure.completed operational event of a complete
// erasure, once (its id comes from the erasure's uid): its name and counts, never what it
// erased.
func (r *ErasureReconciler) announce(ctx context.Context, wx *v1alpha1.WebhookErasure, st *v1alpha1.WebhookErasureStatus) error {
	data := map[string]any{"erasure": wx.Name, "matched": st.Matched, "events": st.Erased.Events, "deliveries": st.Erased.Deliveries,
		"deliveryLogRecords": st.Erased.DeliveryLogRecords, "deadLetters": st.Erased.DeadLetters}
	ev := records.NewOpsEvent(wx.Namespace, "", records.OpsErasureCompleted, "whx:"+string(wx.UID), r.now(), data)
	ev.Source = "webhook-operator/" + wx.Namespace + "/erasures/" + wx.Name
	return r.NATS.Do(ctx, wx.Namespace, func(ctx context.Context, js jetstream.JetStream) error {
		msg, err := records.OpsEventMessage(r.NATS.Config().For(wx.Namespace).EventSubject(ev.Type), ev)
		if err != nil {
			return err
		}
		_, err = js.PublishMsg(ctx, msg)
		return err
	})
}

func progressOf(p *v1alpha1.ErasureProgress) erasure.Progress {
	if p == nil {
		return erasure.Progress{}
	}
	out := erasure.Progress{Phase: p.Phase, Stream: p.Stream, Next: uint64(max(p.Next, 0)), Ends: map[string]uint64{}, SettleErased: p.SettleErased}
	for k, v := range p.Ends {
		out.Ends[k] = uint64(max(v, 0))
	}
	if p.SettleAfter != nil {
		out.SettleAfter = p.SettleAfter.Time
	}
	return out
}

func progressStatus(p erasure.Progress) *v1alpha1.ErasureProgress {
	if p.Phase == "" {
		return nil
	}
	out := &v1alpha1.ErasureProgress{Phase: p.Phase, Stream: p.Stream, Next: int64(p.Next), Ends: map[string]int64{}, SettleErased: p.SettleErased}
	for k, v := range p.Ends {
		out.Ends[k] = int64(v)
	}
	if !p.SettleAfter.IsZero() {
		t := metav1.NewTime(p.SettleAfter.UTC().Truncate(time.Second).Add(time.Second))
		out.SettleAfter = &t
	}
	return out
}

// summarize is the one place an erasure's status is written: summarize's rule gives Ready,
// Reconciling and Stalled, Complete follows them, and statusWriter.finish applies the status
// when it changed, records an Event when Complete changes, and spaces the retries of an
// erasure waiting for NATS.
func (r *ErasureReconciler) summarize(ctx context.Context, wx *v1alpha1.WebhookErasure, obs *erasureObservation, result ctrl.Result, err error) (ctrl.Result, error) {
	st := obs.status
	e := st.Erased
	counts := fmt.Sprintf("%d events matched: erased %d events, %d deliveries, the payloads of %d delivery-log records and %d dead letters",
		st.Matched, e.Events, e.Deliveries, e.DeliveryLogRecords, e.DeadLetters)
	var complete *metav1.Condition
	v := summarize(err, obs.found(), func() verdict {
		if st.CompletedAt != nil {
			msg := "complete: no stored message of the namespace holds a selected payload; " + counts
			complete = conditions.True(v1alpha1.ConditionComplete, v1alpha1.ReasonErased, msg)
			return verdict{ready: conditions.True(v1alpha1.ConditionReady, v1alpha1.ReasonErased, msg)}
		}
		reason, msg := v1alpha1.ReasonErasing, "erasing: "+counts+" so far"
		if p := st.Progress; p != nil {
			msg += fmt.Sprintf("; phase %s, %s from %d", p.Phase, p.Stream, p.Next)
		}
		if w := obs.waiting; w != nil && w.reason == v1alpha1.ReasonQueued {
			reason, msg = w.reason, w.message
		} else if w != nil {
			reason, msg = w.reason, msg+"; "+w.message
		}
		complete = conditions.False(v1alpha1.ConditionComplete, reason, msg)
		return verdict{
			ready:       conditions.False(v1alpha1.ConditionReady, reason, msg),
			reconciling: conditions.True(v1alpha1.ConditionReconciling, reason, msg),
		}
	})
	if complete == nil {
		// An error or a problem: not complete, for the same reason Ready says.
		complete = conditions.False(v1alpha1.ConditionComplete, v.ready.Reason, v.ready.Message)
	}
	if err == nil {
		st.ObservedGeneration = wx.Generation
	}
	st.Conditions = conditions.Set(st.Conditions, wx.Generation, r.now(), complete, v.ready, v.reconciling, v.stalled)
	before := r.lastStatus(wx)
	return r.status.finish(ctx, wx, ending[v1alpha1.WebhookErasureStatus]{
		before: before, status: st, was: before.Conditions, announce: []*metav1.Condition{complete},
		apply: erasureStatus(wx, &st), problem: obs.found(), result: result, err: err,
	})
}

// erasureStatus is the apply configuration of an erasure's status; the controller is its only
// writer.
func erasureStatus(wx *v1alpha1.WebhookErasure, st *v1alpha1.WebhookErasureStatus) *acv1alpha1.WebhookErasureApplyConfiguration {
	e := st.Erased
	s := acv1alpha1.WebhookErasureStatus().
		WithObservedGeneration(st.ObservedGeneration).
		WithConditions(conditions.Apply(st.Conditions)...).
		WithMatched(st.Matched).
		WithUnevaluated(st.Unevaluated).
		WithErased(acv1alpha1.ErasureCounts().WithEvents(e.Events).WithDeliveries(e.Deliveries).
			WithDeliveryLogRecords(e.DeliveryLogRecords).WithDeadLetters(e.DeadLetters))
	if p := st.Progress; p != nil {
		ap := acv1alpha1.ErasureProgress().WithPhase(p.Phase).WithStream(p.Stream).WithNext(p.Next).WithEnds(p.Ends).WithSettleErased(p.SettleErased)
		if p.SettleAfter != nil {
			ap.WithSettleAfter(*p.SettleAfter)
		}
		s.WithProgress(ap)
	}
	if st.StartedAt != nil {
		s.WithStartedAt(*st.StartedAt)
	}
	if st.CompletedAt != nil {
		s.WithCompletedAt(*st.CompletedAt)
	}
	return acv1alpha1.WebhookErasure(wx.Name, wx.Namespace).WithStatus(s)
}

// payloadCounters count payloads removed: by erasures and by the retention sweep, per
// namespace and stream.
type payloadCounters struct {
	vec  *prometheus.CounterVec
	once sync.Once
}

var (
	erasedMetrics = &payloadCounters{vec: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "webhook_erasure_erased_total",
		Help: "What WebhookErasures erased, by namespace and stream: events and deliveries deleted, delivery-log records and dead letters kept without their payload."},
		[]string{"namespace", "stream"})}
	expiredMetrics = &payloadCounters{vec: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "webhook_payloads_expired_total",
		Help: "Payloads removed by their retention (spec.payloadRetention, a WebhookQuota's retention), by namespace and stream: delivery-log records and dead letters kept without them."},
		[]string{"namespace", "stream"})}
)

func registerPayloadMetrics() {
	for _, c := range []*payloadCounters{erasedMetrics, expiredMetrics} {
		c.once.Do(func() { ctrlmetrics.Registry.MustRegister(c.vec) })
	}
}

func (c *payloadCounters) add(ns string, n erasure.Counts) {
	for _, v := range []struct {
		stream string
		n      int64
	}{{"events", n.Events}, {"deliveries", n.Deliveries}, {"delivery_log", n.LogRecords}, {"dead_letters", n.DeadLetters}} {
		if v.n > 0 {
			c.vec.WithLabelValues(ns, v.stream).Add(float64(v.n))
		}
	}
}
