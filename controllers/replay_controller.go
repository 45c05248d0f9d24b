package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	acv1alpha1 "github.com/webhook-operator/webhook-operator/api/applyconfiguration/api/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
	"github.com/webhook-operator/webhook-operator/internal/quota"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/replay"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Defaults of the replay reconciler.
const (
	// DefaultReplayTTL keeps a completed WebhookReplay this long before deleting it.
	DefaultReplayTTL = 24 * time.Hour
	// DefaultReplayBatch is the most deliveries one reconcile of a WebhookReplay without a
	// rate replays; the status shows progress after each batch.
	DefaultReplayBatch = 100
	// maxProblems bounds status.problems.
	maxProblems = 10
	// maxProblemMessage bounds one problem's message.
	maxProblemMessage = 1024
	// replayBatchTimeout bounds one batch's work with NATS (a few calls per delivery).
	replayBatchTimeout = 30 * time.Second
	// nextBatch is how soon the next batch of a replay without a rate starts: at once, after
	// the other objects waiting in the queue.
	nextBatch = time.Millisecond
)

// ReplayReconciler runs WebhookReplays with the replay engine (internal/replay): a bounded
// batch per reconcile, its cursor and counts in the status (so a restart resumes where the
// last batch ended, and the engine's replay keys make a repeated batch create nothing new),
// at most ratePerSecond deliveries a second when the spec asks, and never more than its
// namespace's WebhookQuota eventsPerSecond (replayRate). It refuses to start or go on
// while the endpoint is disabled, and deletes a completed WebhookReplay TTL after it
// completed. Deleting a WebhookReplay stops it and deletes no delivery.
type ReplayReconciler struct {
	Client client.Client
	// APIReader, when set, reads the endpoint past the cache before a replay goes out, so one
	// disabled a moment ago is not replayed to because the cache has not seen it yet.
	APIReader client.Reader
	Recorder  recorder.EventRecorder
	NATS      *JetStream
	// TTL after completion before a WebhookReplay is deleted; 0 keeps it.
	TTL time.Duration
	// Batch is the most deliveries one reconcile replays (DefaultReplayBatch when 0).
	Batch int
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	// MaxConcurrentReconciles is how many replays run at once (1 when 0).
	MaxConcurrentReconciles int

	status *statusWriter[v1alpha1.WebhookReplayStatus]
}

// SetupWithManager registers the reconciler and its field index with mgr: WebhookReplays
// (creations, spec and annotation changes), and the endpoints a waiting replay waits for.
func (r *ReplayReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.WebhookReplay{}, indexReplayEndpoint, func(o client.Object) []string {
		return []string{o.(*v1alpha1.WebhookReplay).Spec.EndpointRef.Name}
	}); err != nil {
		return err
	}
	r.status = &statusWriter[v1alpha1.WebhookReplayStatus]{client: r.Client, recorder: r.Recorder, backoff: newBackoff(natsRetryBase, natsRetryMax)}
	c := r.Client
	return ctrl.NewControllerManagedBy(mgr).
		Named("webhookreplay").
		// Status writes are the reconciler's own: creations start one, and a changed TTL
		// annotation.
		For(&v1alpha1.WebhookReplay{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		// A replay waiting for its endpoint goes on when it appears or is re-enabled.
		Watches(&v1alpha1.WebhookEndpoint{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return replaysOf(ctx, c, o.GetNamespace(), o.GetName())
		}), builder.WithPredicates(endpointAppearedOrEnabled())).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(r.MaxConcurrentReconciles, 1)}).
		Complete(r)
}

// replayObservation is what one reconcile of a replay found and did; only summarize turns it
// into status.
type replayObservation struct {
	problems
	status v1alpha1.WebhookReplayStatus
	// stop ends the steps without a problem: complete, or waiting for its rate.
	stop bool
	// gone is set once the object was deleted.
	gone bool
	// lane is the endpoint's: where the replayed deliveries are published.
	lane streams.Lane
}

// replayStep is one step of a replay's reconcile; it may set result (when to come back).
type replayStep func(ctx context.Context, wr *v1alpha1.WebhookReplay, obs *replayObservation, result *ctrl.Result) error

func (r *ReplayReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile is the entry point: get, a deferred status patch, then the steps.
func (r *ReplayReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, retErr error) {
	wr := &v1alpha1.WebhookReplay{}
	if err := r.Client.Get(ctx, req.NamespacedName, wr); err != nil {
		if apierrors.IsNotFound(err) {
			r.status.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !wr.DeletionTimestamp.IsZero() {
		// Nothing to undo: the deliveries a replay made are ordinary deliveries.
		return ctrl.Result{}, nil
	}
	obs := &replayObservation{status: r.lastStatus(wr)}
	defer func() {
		result, retErr = r.summarize(ctx, wr, obs, result, retErr)
	}()
	for _, step := range []replayStep{
		r.expire,
		r.checkEndpoint,
		r.begin,
		r.replayBatch,
	} {
		if err := step(ctx, wr, obs, &result); err != nil || obs.found() != nil || obs.stop || obs.gone {
			return result, err
		}
	}
	return result, nil
}

// lastStatus is the status as this process last wrote it (the cache may not show it yet),
// else as the cache shows it.
func (r *ReplayReconciler) lastStatus(wr *v1alpha1.WebhookReplay) v1alpha1.WebhookReplayStatus {
	if st, ok := r.status.last(wr, wr.Status); ok {
		return *st.DeepCopy()
	}
	return *wr.Status.DeepCopy()
}

// expire ends a completed replay's reconcile: it deletes it once TTL has passed since it
// completed, and otherwise comes back then.
func (r *ReplayReconciler) expire(ctx context.Context, wr *v1alpha1.WebhookReplay, obs *replayObservation, result *ctrl.Result) error {
	done := obs.status.CompletedAt
	if done == nil {
		return nil
	}
	obs.stop = true
	ttl := r.ttl(wr)
	if ttl <= 0 {
		return nil
	}
	if left := done.Add(ttl).Sub(r.now()); left > 0 {
		result.RequeueAfter = left
		return nil
	}
	err := r.Client.Delete(ctx, wr, client.Preconditions{UID: &wr.UID})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return err
	}
	obs.gone = true
	return nil
}

// ttl is how long wr is kept once complete: its annotation's, else the controller's.
func (r *ReplayReconciler) ttl(wr *v1alpha1.WebhookReplay) time.Duration {
	v, ok := wr.Annotations[v1alpha1.AnnotationTTLAfterComplete]
	if !ok {
		return r.TTL
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		r.Recorder.Eventf(wr, nil, corev1.EventTypeWarning, "InvalidTTL", "Reconcile",
			"annotation %s=%q is not a duration such as 30m or 168h (0 keeps it): the controller's %s applies",
			v1alpha1.AnnotationTTLAfterComplete, records.Bound(v, 64), r.TTL)
		return r.TTL
	}
	return d
}

// checkEndpoint finds the endpoint: a replay waits for one that does not exist yet, and is
// refused (Stalled) while it is disabled; it goes on once a person re-enables it.
func (r *ReplayReconciler) checkEndpoint(ctx context.Context, wr *v1alpha1.WebhookReplay, obs *replayObservation, _ *ctrl.Result) error {
	ep := &v1alpha1.WebhookEndpoint{}
	var reader client.Reader = r.Client
	if r.APIReader != nil {
		reader = r.APIReader
	}
	err := reader.Get(ctx, types.NamespacedName{Namespace: wr.Namespace, Name: wr.Spec.EndpointRef.Name}, ep)
	switch {
	case apierrors.IsNotFound(err):
		obs.block(v1alpha1.ReasonEndpointNotFound, "WebhookEndpoint %s/%s (spec.endpointRef) not found: the replay starts once it exists", wr.Namespace, wr.Spec.EndpointRef.Name)
		return nil
	case err != nil:
		return err
	case !ep.DeletionTimestamp.IsZero():
		obs.block(v1alpha1.ReasonEndpointNotFound, "WebhookEndpoint %s/%s is being deleted", wr.Namespace, ep.Name)
		return nil
	}
	if why := replay.Refusal(ep); why != "" {
		obs.stall(v1alpha1.ReasonEndpointDisabled, "replay refused: %s; this replay proceeds then", why)
	}
	obs.lane = streams.LaneOf(&ep.Spec)
	return nil
}

// withEngine runs f with the replay engine of the replay's namespace, within
// replayBatchTimeout. Every failure wraps ErrNATSUnavailable (see JetStream.Do).
func (r *ReplayReconciler) withEngine(ctx context.Context, wr *v1alpha1.WebhookReplay, f func(ctx context.Context, e *replay.Engine) error) error {
	return r.NATS.DoWithin(ctx, wr.Namespace, replayBatchTimeout, func(ctx context.Context, js jetstream.JetStream) error {
		return f(ctx, &replay.Engine{JS: js, Set: r.NATS.Config().For(wr.Namespace), Now: r.Now})
	})
}

// natsProblem turns a failure to reach JetStream (or a namespace's missing stream) into a
// problem that the reconcile waits out with backoff; other errors are returned.
func natsProblem(obs *replayObservation, what string, err error) error {
	if errors.Is(err, ErrNATSUnavailable) {
		obs.block(v1alpha1.ReasonNATSUnavailable, "%s: %v", what, err)
		return nil
	}
	return err
}

// begin fixes, on the first reconcile, what the replay reads and where it ends.
func (r *ReplayReconciler) begin(ctx context.Context, wr *v1alpha1.WebhookReplay, obs *replayObservation, _ *ctrl.Result) error {
	if obs.status.Progress != nil {
		return nil
	}
	var cur replay.Cursor
	err := r.withEngine(ctx, wr, func(ctx context.Context, e *replay.Engine) error {
		var err error
		cur, err = e.Begin(ctx, replay.SelectionOf(&wr.Spec))
		return err
	})
	if err != nil {
		return natsProblem(obs, "cannot start the replay", err)
	}
	now := metav1.NewTime(r.now().UTC().Truncate(time.Second))
	obs.status.StartedAt = &now
	obs.status.Progress = &v1alpha1.ReplayProgress{Stream: cur.Stream, Next: int64(cur.Next), End: int64(cur.End)}
	return nil
}

// replayBatch replays one batch from the cursor, adds what it did to the status, and says
// when the next one starts: at once, or when the rate allows.
func (r *ReplayReconciler) replayBatch(ctx context.Context, wr *v1alpha1.WebhookReplay, obs *replayObservation, result *ctrl.Result) error {
	p := obs.status.Progress
	cur := replay.Cursor{Stream: p.Stream, Next: uint64(max(p.Next, 0)), End: uint64(max(p.End, 0))}
	limit := r.Batch
	if limit <= 0 {
		limit = DefaultReplayBatch
	}
	q, err := namespaceQuota(ctx, r.Client, wr.Namespace)
	if err != nil {
		return err
	}
	rate := replayRate(wr, q)
	if rate > 0 {
		limit = min(limit, rate)
	}
	start := r.now()
	var b replay.Batch
	err = r.withEngine(ctx, wr, func(ctx context.Context, e *replay.Engine) error {
		var err error
		sel := replay.SelectionOf(&wr.Spec)
		sel.Lane = obs.lane
		b, err = e.Next(ctx, sel, replay.Run{Name: wr.Name, Owner: string(wr.UID)}, cur, limit)
		return err
	})
	count(&obs.status, b.Results)
	p.Next = int64(b.Cursor.Next)
	if err != nil {
		return natsProblem(obs, fmt.Sprintf("replaying from %s sequence %d", p.Stream, b.Cursor.Next), err)
	}
	if b.Cursor.Done() {
		// The replay.completed operational event, once per replay (its id comes from the
		// replay's uid): written before the replay is marked complete, so a failure to publish
		// is retried by the next reconcile.
		if err := r.withEngine(ctx, wr, func(ctx context.Context, e *replay.Engine) error {
			return announceReplay(ctx, e, wr, &obs.status, r.now())
		}); err != nil {
			return natsProblem(obs, "publishing the replay.completed operational event", err)
		}
		now := metav1.NewTime(r.now().UTC().Truncate(time.Second))
		obs.status.CompletedAt = &now
		if ttl := r.ttl(wr); ttl > 0 {
			result.RequeueAfter = ttl
		}
		return nil
	}
	result.RequeueAfter = nextBatch
	if rate > 0 {
		// n deliveries at rate per second take n/rate seconds, this batch's time included.
		wait := time.Duration(len(b.Results)) * time.Second / time.Duration(rate)
		result.RequeueAfter = max(wait-r.now().Sub(start), nextBatch)
	}
	return nil
}

// replayRate is how many deliveries a second replay wr may write (0: no bound): its
// ratePerSecond, within its namespace's WebhookQuota publish rate (eventsPerSecond), which
// covers every delivery its tenants write.
func replayRate(wr *v1alpha1.WebhookReplay, q *v1alpha1.WebhookQuota) int {
	rate := 0
	if wr.Spec.RatePerSecond != nil {
		rate = int(*wr.Spec.RatePerSecond)
	}
	if q != nil {
		if perSecond, _, ok := quota.PublishRate(&q.Spec); ok && (rate == 0 || int(perSecond) < rate) {
			rate = max(int(perSecond), 1)
		}
	}
	return rate
}

// count adds a batch's results to the status.
func count(st *v1alpha1.WebhookReplayStatus, results []replay.Result) {
	for _, res := range results {
		st.Selected++
		outcome := ""
		switch {
		case res.Outcome == replay.Replayed:
			st.Replayed++
		case res.Outcome.Skipped():
			st.Skipped++
			if res.Outcome == replay.Refused {
				outcome = "Skipped"
			}
		default:
			st.Failed++
			outcome = "Failed"
		}
		if outcome != "" && len(st.Problems) < maxProblems {
			st.Problems = append(st.Problems, v1alpha1.ReplayProblem{DeliveryID: res.Original, Outcome: outcome,
				Message: records.Bound(res.Message, maxProblemMessage)})
		}
	}
}

// summarize is the one place a replay's status is written: summarize's rule gives Ready,
// Reconciling and Stalled, and Complete follows Ready while there is an error or a problem.
// Events are recorded when Complete changes, and when a problem stalls the replay.
func (r *ReplayReconciler) summarize(ctx context.Context, wr *v1alpha1.WebhookReplay, obs *replayObservation, result ctrl.Result, err error) (ctrl.Result, error) {
	if obs.gone {
		r.status.forget(client.ObjectKeyFromObject(wr))
		return result, err
	}
	st := obs.status
	var complete *metav1.Condition
	counts := fmt.Sprintf("%d selected: %d replayed, %d skipped, %d failed", st.Selected, st.Replayed, st.Skipped, st.Failed)
	v := summarize(err, obs.found(), func() verdict {
		switch {
		case st.CompletedAt != nil && st.Failed == 0:
			msg := "complete: " + counts
			complete = conditions.True(v1alpha1.ConditionComplete, v1alpha1.ReasonReplayed, msg)
			return verdict{ready: conditions.True(v1alpha1.ConditionReady, v1alpha1.ReasonReplayed, msg)}
		case st.CompletedAt != nil:
			msg := fmt.Sprintf("complete, but %d of the selected deliveries could not be replayed (status.problems says why): %s", st.Failed, counts)
			complete = conditions.True(v1alpha1.ConditionComplete, v1alpha1.ReasonDeliveriesFailed, msg)
			return verdict{
				ready:   conditions.False(v1alpha1.ConditionReady, v1alpha1.ReasonDeliveriesFailed, msg),
				stalled: conditions.True(v1alpha1.ConditionStalled, v1alpha1.ReasonDeliveriesFailed, msg),
			}
		}
		msg := "replaying: " + counts + " so far"
		if p := st.Progress; p != nil {
			msg += fmt.Sprintf("; read %s up to %d of %d", p.Stream, p.Next, p.End)
		}
		complete = conditions.False(v1alpha1.ConditionComplete, v1alpha1.ReasonReplaying, msg)
		return verdict{
			ready:       conditions.False(v1alpha1.ConditionReady, v1alpha1.ReasonReplaying, msg),
			reconciling: conditions.True(v1alpha1.ConditionReconciling, v1alpha1.ReasonReplaying, msg),
		}
	})
	if complete == nil {
		// An error or a problem: not complete, for the same reason Ready says.
		complete = conditions.False(v1alpha1.ConditionComplete, v.ready.Reason, v.ready.Message)
	}
	if err == nil {
		st.ObservedGeneration = wr.Generation
	}
	st.Conditions = conditions.Set(st.Conditions, wr.Generation, r.now(), complete, v.ready, v.reconciling, v.stalled)

	announce := []*metav1.Condition{complete}
	if p := obs.found(); p != nil && p.stalled {
		announce = append(announce, v.stalled)
	}
	before := r.lastStatus(wr)
	return r.status.finish(ctx, wr, ending[v1alpha1.WebhookReplayStatus]{
		before: before, status: st, was: before.Conditions, announce: announce,
		apply: replayStatus(wr, &st), problem: obs.found(), result: result, err: err,
	})
}

// replayStatus is the apply configuration of a replay's status; the controller is its only
// writer. An empty optional field is left out, which removes it.
func replayStatus(wr *v1alpha1.WebhookReplay, st *v1alpha1.WebhookReplayStatus) *acv1alpha1.WebhookReplayApplyConfiguration {
	s := acv1alpha1.WebhookReplayStatus().
		WithObservedGeneration(st.ObservedGeneration).
		WithConditions(conditions.Apply(st.Conditions)...).
		WithSelected(st.Selected).
		WithReplayed(st.Replayed).
		WithSkipped(st.Skipped).
		WithFailed(st.Failed)
	if p := st.Progress; p != nil {
		s.WithProgress(acv1alpha1.ReplayProgress().WithStream(p.Stream).WithNext(p.Next).WithEnd(p.End))
	}
	if st.StartedAt != nil {
		s.WithStartedAt(*st.StartedAt)
	}
	if st.CompletedAt != nil {
		s.WithCompletedAt(*st.CompletedAt)
	}
	for _, p := range st.Problems {
		s.WithProblems(acv1alpha1.ReplayProblem().WithDeliveryID(p.DeliveryID).WithOutcome(p.Outcome).WithMessage(p.Message))
	}
	return acv1alpha1.WebhookReplay(wr.Name, wr.Namespace).WithStatus(s)
}

// announceReplay publishes the webhook_operator.replay.completed operational event of a
// finished replay: its counts and the replay's name.
func announceReplay(ctx context.Context, e *replay.Engine, wr *v1alpha1.WebhookReplay, st *v1alpha1.WebhookReplayStatus, now time.Time) error {
	data := map[string]any{"replay": wr.Name, "selected": st.Selected, "replayed": st.Replayed, "skipped": st.Skipped, "failed": st.Failed}
	ev := records.NewOpsEvent(wr.Namespace, wr.Spec.EndpointRef.Name, records.OpsReplayCompleted, "whr:"+string(wr.UID), now, data)
	msg, err := records.OpsEventMessage(e.Set.EventSubject(ev.Type), ev)
	if err != nil {
		return err
	}
	_, err = e.JS.PublishMsg(ctx, msg)
	return err
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
