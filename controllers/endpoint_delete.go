package controllers

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// retireCheckInterval is how often the finalizer looks whether a deleted endpoint's consumers
// are empty yet.
const retireCheckInterval = time.Second

// finalize lets a deleted endpoint go without losing anything, and writes no dead letter
// itself: its dispatcher, which serves it while the finalizer is there (served),
// dead-letters everything still queued for it with reason endpoint_deleted through its one
// dead-letter writer. The finalizer retires its consumers so that the dispatcher gets all of it
// (retire), waits for them to be empty, deletes them, and removes itself.
func (r *EndpointReconciler) finalize(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ep, Finalizer) {
		obs.gone = true
		return ctrl.Result{}, nil
	}
	wait, err := r.mustWait(ctx, ep)
	if err != nil {
		return ctrl.Result{}, err
	}
	if wait {
		left, err := r.retire(ctx, ep)
		if err != nil {
			return finalizeProblem(obs, err, "deleting: cannot see whether its dispatcher dead-lettered what was queued for it")
		}
		if left.deliveries > 0 || left.events > 0 {
			obs.block(v1alpha1.ReasonDeleting, "deleting: its dispatcher is to dead-letter (reason %s) %d deliveries and about %d events still queued for it",
				records.ReasonEndpointDeleted, left.deliveries, left.events)
			return ctrl.Result{RequeueAfter: retireCheckInterval}, nil
		}
	}
	if err := r.deleteConsumers(ctx, ep); err != nil {
		return finalizeProblem(obs, err, "deleting: cannot delete its consumers")
	}
	patch := client.MergeFromWithOptions(ep.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(ep, Finalizer)
	if err := r.Client.Patch(ctx, ep, patch); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.retiring.forget(ep.UID)
	if wait {
		r.Recorder.Eventf(ep, nil, corev1.EventTypeNormal, "ConsumersDeleted", "Delete",
			"its dispatcher dead-lettered what was queued for it (reason %s); its consumers are deleted", records.ReasonEndpointDeleted)
	} else {
		r.Recorder.Eventf(ep, nil, corev1.EventTypeNormal, "ConsumersDeleted", "Delete",
			"its consumers are deleted without waiting: its namespace is being deleted (or not served), its streams with it")
	}
	obs.gone = true
	return ctrl.Result{}, nil
}

// finalizeProblem reports a NATS error of the finalizer as the endpoint's problem, to be tried
// again, and returns any other.
func finalizeProblem(obs *endpointObservation, err error, what string) (ctrl.Result, error) {
	if errors.Is(err, ErrNATSUnavailable) {
		obs.block(v1alpha1.ReasonNATSUnavailable, "%s: %v", what, err)
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, err
}

// mustWait says whether the finalizer waits for ep's dispatcher to dead-letter what is queued
// for it. Not when its namespace is being deleted: its streams, dead letters included, go with
// it (StreamSets deletes them once its endpoints are gone), so dead letters would outlive
// nothing, and its dispatcher may already be gone. Nor in a namespace the controller does not
// serve (any more): no dispatcher runs there.
func (r *EndpointReconciler) mustWait(ctx context.Context, ep *v1alpha1.WebhookEndpoint) (bool, error) {
	if r.Options.exclusion(ep.Namespace) != "" {
		return false, nil
	}
	m := namespaceMeta()
	err := r.Client.Get(ctx, types.NamespacedName{Name: ep.Namespace}, m)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return m.DeletionTimestamp.IsZero(), nil
}

// queued is what a deleted endpoint's consumers still hold.
type queued struct {
	deliveries, events uint64
}

// retirements is what the finalizer remembers of the endpoints it retires, by UID. A
// controller that restarts retires their consumers again (rewinding a deliveries consumer
// again only brings its dispatcher, once more, what it held: at least once) and reads new
// marks.
type retirements struct {
	mu sync.Mutex
	m  map[types.UID]*retirement
}

// retirement is one endpoint's. Reconciles of one endpoint never run at once, so only the map
// needs the lock.
type retirement struct {
	// retired says its consumers were retired by this process.
	retired bool
	// through is, per events stream (by namespace), the stream's last sequence at the first
	// check: the endpoint's consumer there is empty once it settled that far, so a producer
	// publishing without pause cannot hold the deletion forever (what is stored after the
	// deletion is not the endpoint's; its dispatcher acknowledges it without a dead letter).
	through map[string]uint64
}

func (rs *retirements) of(uid types.UID) *retirement {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.m == nil {
		rs.m = map[types.UID]*retirement{}
	}
	t := rs.m[uid]
	if t == nil {
		t = &retirement{through: map[string]uint64{}}
		rs.m[uid] = t
	}
	return t
}

func (rs *retirements) forget(uid types.UID) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	delete(rs.m, uid)
}

// retire makes sure ep's dispatcher gets everything still queued for ep, and says what its
// consumers still hold. Once per endpoint (and process) its consumers are retired: the
// deliveries consumer widened to its scheduled retries and rewound
// (streams.Set.RetireDeliveriesConsumer), and every consumer resumed, should a WebhookQuota or
// the finalizer of an earlier version have paused it; that version's drain consumers go.
func (r *EndpointReconciler) retire(ctx context.Context, ep *v1alpha1.WebhookEndpoint) (queued, error) {
	t := r.retiring.of(ep.UID)
	set := r.NATS.Config().For(ep.Namespace)
	sources := streams.SourceNamespaces(ep.Namespace, ep.Spec.SourceNamespaces)
	if !t.retired {
		err := r.NATS.Do(ctx, ep.Namespace, func(ctx context.Context, js jetstream.JetStream) error {
			_, err := set.RetireDeliveriesConsumer(ctx, js, ep.Name, streams.EndpointConsumerOptionsFor(&ep.Spec))
			return ignoreNotFound(err)
		})
		if err != nil {
			return queued{}, err
		}
		for _, src := range sources {
			if err := r.retireEventsConsumer(ctx, ep, src); err != nil {
				return queued{}, err
			}
		}
		t.retired = true
	}
	// The events first: an event a dispatcher held (copied into the deliveries stream) before
	// it saw the deletion is acknowledged once its copy is stored, so the copy is counted below.
	var left queued
	read, err := r.readSources(ctx, ep)
	if err != nil {
		return queued{}, err
	}
	for _, src := range read {
		n, err := r.eventsLeft(ctx, ep, src, t)
		if err != nil {
			return queued{}, err
		}
		left.events += n
	}
	err = r.NATS.Do(ctx, ep.Namespace, func(ctx context.Context, js jetstream.JetStream) error {
		c, err := js.Consumer(ctx, set.DeliveriesStream(), set.EndpointConsumer(ep.Name))
		if err != nil {
			return ignoreNotFound(err)
		}
		info := c.CachedInfo()
		left.deliveries = info.NumPending + uint64(info.NumAckPending)
		return nil
	})
	if err != nil || streams.LaneOf(&ep.Spec) != streams.LaneShared {
		return left, err
	}
	// On the shared lane: what it has queued, parked or scheduled, and the events of its
	// namespace's intake (and of its sources') stored before the deletion.
	err = r.NATS.Do(ctx, ep.Namespace, func(ctx context.Context, js jetstream.JetStream) error {
		n, err := set.SharedLaneResidue(ctx, js, ep.Name)
		left.deliveries += n
		return ignoreNotFound(err)
	})
	if err != nil {
		return left, err
	}
	for _, src := range read {
		n, err := r.intakeLeft(ctx, ep, src, t)
		if err != nil {
			return queued{}, err
		}
		left.events += n
	}
	return left, nil
}

// intakeLeft is how many events the intake consumer of ep's dispatcher on src's events stream
// has not settled up to the stream's last event at the first check (t.through): the intake
// gives ep every event stored before its deletion, which its dispatcher dead-letters.
func (r *EndpointReconciler) intakeLeft(ctx context.Context, ep *v1alpha1.WebhookEndpoint, src string, t *retirement) (uint64, error) {
	stream := r.NATS.Config().For(src).EventsStream()
	key := "intake:" + src
	var left uint64
	err := r.NATS.Do(ctx, src, func(ctx context.Context, js jetstream.JetStream) error {
		c, err := js.Consumer(ctx, stream, streams.IntakeConsumer(ep.Namespace))
		if err != nil {
			return ignoreNotFound(err)
		}
		through, marked := t.through[key]
		if !marked {
			st, err := js.Stream(ctx, stream)
			if err != nil {
				return err
			}
			through = st.CachedInfo().State.LastSeq
			t.through[key] = through
		}
		info := c.CachedInfo()
		if info.AckFloor.Stream >= through || info.NumAckPending == 0 && info.NumPending == 0 {
			return nil
		}
		left = through - info.AckFloor.Stream
		return nil
	})
	return left, err
}

// readSources are the namespaces on whose events stream ep's dispatcher reads ep's consumer,
// which the finalizer waits for: its own, and, with cross-namespace sources allowed, the
// source namespaces that consent now, unless its consumers there are beyond its dispatcher's
// bus grant (SourceGrantFull). Its other consumers are deleted without waiting: nothing would
// empty them.
func (r *EndpointReconciler) readSources(ctx context.Context, ep *v1alpha1.WebhookEndpoint) ([]string, error) {
	own := []string{ep.Namespace}
	if !r.Options.Config.AllowCrossNamespaceSources || len(ep.Spec.SourceNamespaces) == 0 {
		return own, nil
	}
	if beyond, _, _, err := r.beyondSourceGrant(ctx, ep); err != nil || beyond {
		return own, err
	}
	consenting, err := consentingSources(ctx, r.Client, ep)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(streams.SourceNamespaces(ep.Namespace, consenting), func(ns string) bool {
		return ns != ep.Namespace && r.Options.exclusion(ns) != ""
	}), nil
}

// retireEventsConsumer resumes ep's consumer on src's events stream if it is paused. Where the
// finalizer of an earlier version had replaced it with a drain consumer, it is created again
// where that one had got to, and the drain consumer goes.
func (r *EndpointReconciler) retireEventsConsumer(ctx context.Context, ep *v1alpha1.WebhookEndpoint, src string) error {
	set := r.NATS.Config().For(src)
	stream := set.EventsStream()
	name := streams.EndpointConsumerOf(ep.Namespace, ep.Name)
	drain := r.NATS.Config().For(ep.Namespace).DrainConsumer(ep.Name)
	return r.NATS.Do(ctx, src, func(ctx context.Context, js jetstream.JetStream) error {
		c, err := js.Consumer(ctx, stream, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			c, err = restoreEventsConsumer(ctx, js, set, ep, drain)
		}
		if err != nil {
			return ignoreNotFound(err)
		}
		if err := js.DeleteConsumer(ctx, stream, drain); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return err
		}
		if c.CachedInfo().Paused {
			_, err = js.ResumeConsumer(ctx, stream, name)
		}
		return err
	})
}

// restoreEventsConsumer creates ep's consumer on set's events stream again, where the drain
// consumer of an earlier version that replaced it had got to; ErrConsumerNotFound without one.
func restoreEventsConsumer(ctx context.Context, js jetstream.JetStream, set streams.Set, ep *v1alpha1.WebhookEndpoint, drain string) (jetstream.Consumer, error) {
	stream := set.EventsStream()
	d, err := js.Consumer(ctx, stream, drain)
	if err != nil {
		return nil, err
	}
	start := streams.ConsumerStart{Seq: d.CachedInfo().AckFloor.Stream + 1}
	err = set.EnsureEventsConsumer(ctx, js, ep.Namespace, ep.Name, streams.EventPatterns(&ep.Spec), streams.EndpointConsumerOptionsFor(&ep.Spec), start)
	if err != nil {
		return nil, err
	}
	return js.Consumer(ctx, stream, streams.EndpointConsumerOf(ep.Namespace, ep.Name))
}

// eventsLeft is how many events ep's consumer on src's events stream still holds for it (0
// when it has none): none once nothing is unacknowledged and nothing pending, or it settled
// through the stream's last event at the first check (t.through).
func (r *EndpointReconciler) eventsLeft(ctx context.Context, ep *v1alpha1.WebhookEndpoint, src string, t *retirement) (uint64, error) {
	stream := r.NATS.Config().For(src).EventsStream()
	var left uint64
	err := r.NATS.Do(ctx, src, func(ctx context.Context, js jetstream.JetStream) error {
		c, err := js.Consumer(ctx, stream, streams.EndpointConsumerOf(ep.Namespace, ep.Name))
		if err != nil {
			return ignoreNotFound(err)
		}
		through, marked := t.through[src]
		if !marked {
			st, err := js.Stream(ctx, stream)
			if err != nil {
				return err
			}
			through = st.CachedInfo().State.LastSeq
			t.through[src] = through
		}
		info := c.CachedInfo()
		if info.NumAckPending == 0 && (info.NumPending == 0 || info.AckFloor.Stream >= through) {
			return nil
		}
		left = info.NumPending + uint64(info.NumAckPending)
		return nil
	})
	return left, err
}

// deleteConsumers deletes ep's consumers, on the deliveries stream and on every events stream
// it read, and the drain consumers an earlier version may have left there.
func (r *EndpointReconciler) deleteConsumers(ctx context.Context, ep *v1alpha1.WebhookEndpoint) error {
	own := r.NATS.Config().For(ep.Namespace)
	name, drain := own.EndpointConsumer(ep.Name), own.DrainConsumer(ep.Name)
	del := func(ns, stream string) error {
		return r.NATS.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error {
			for _, c := range []string{name, drain} {
				if err := ignoreNotFound(js.DeleteConsumer(ctx, stream, c)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := del(ep.Namespace, own.DeliveriesStream()); err != nil {
		return err
	}
	for _, src := range streams.SourceNamespaces(ep.Namespace, ep.Spec.SourceNamespaces) {
		if err := del(src, r.NATS.Config().For(src).EventsStream()); err != nil {
			return err
		}
	}
	return nil
}

// ignoreNotFound drops the error that says a stream or consumer does not exist: nothing waits
// in it.
func ignoreNotFound(err error) error {
	if streams.IsNotFound(err) {
		return nil
	}
	return err
}
