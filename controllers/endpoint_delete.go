package controllers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// drainSlice bounds how long one reconcile spends dead-lettering a large backlog; the rest is
// moved by the next one, so other endpoints get their turn.
const drainSlice = 10 * time.Second

// drainBatch is how many deliveries are fetched at once.
const drainBatch = 256

// finalize lets a deleted endpoint go without losing anything: its consumer is deleted (so
// nothing delivers it any more), everything still waiting for it (deliveries and scheduled
// retries) moves to the dead-letter stream with reason endpoint_deleted, and only then is the
// finalizer removed. Its dispatcher follows on its own: the dispatcher reconciler watches
// endpoints and stops serving one as soon as its deletion starts.
func (r *EndpointReconciler) finalize(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(ep, Finalizer) {
		obs.gone = true
		return ctrl.Result{}, nil
	}
	moved, done, err := r.deadLetterPending(ctx, ep)
	if moved > 0 {
		r.Recorder.Eventf(ep, nil, corev1.EventTypeNormal, "DeadLettered", "Delete",
			"moved %d deliveries still waiting for this endpoint to the dead-letter stream (reason %s)", moved, records.ReasonEndpointDeleted)
	}
	switch {
	case errors.Is(err, ErrNATSUnavailable):
		obs.block(v1alpha1.ReasonNATSUnavailable, "deleting: pending deliveries must move to the dead-letter stream first: %v", err)
		return ctrl.Result{}, nil
	case err != nil:
		return ctrl.Result{}, err
	case !done:
		obs.block(v1alpha1.ReasonDeleting, "deleting: moved %d more pending deliveries to the dead-letter stream, continuing", moved)
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	patch := client.MergeFromWithOptions(ep.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(ep, Finalizer)
	if err := r.Client.Patch(ctx, ep, patch); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	obs.gone = true
	return ctrl.Result{}, nil
}

// deadLetterPending retires ep's consumers and moves what is left for it to the dead-letter
// stream, for at most drainSlice each. done is true when nothing is left and the temporary
// consumers are gone.
func (r *EndpointReconciler) deadLetterPending(ctx context.Context, ep *v1alpha1.WebhookEndpoint) (moved int, done bool, err error) {
	// First the events it had not taken, on its namespace's events stream and on those of its
	// source namespaces; then its deliveries (which a dispatcher still holding events may
	// have added to meanwhile).
	for _, src := range streams.SourceNamespaces(ep.Namespace, ep.Spec.SourceNamespaces) {
		n, done, err := r.drainEvents(ctx, ep, src)
		moved += n
		if err != nil || !done {
			return moved, false, err
		}
	}
	n, done, err := r.drainDeliveries(ctx, ep)
	return moved + n, done, err
}

// drainDeliveries deletes ep's consumer on the deliveries stream and moves what is left there
// (deliveries and scheduled retries) to the dead-letter stream through a temporary consumer.
func (r *EndpointReconciler) drainDeliveries(ctx context.Context, ep *v1alpha1.WebhookEndpoint) (moved int, done bool, err error) {
	ns, name := ep.Namespace, ep.Name
	set := r.NATS.Config().For(ns)
	stream := set.DeliveriesStream()
	// The set is not created here: an endpoint that never got its consumer may be in a
	// namespace without one, and then nothing waits for it.
	err = r.NATS.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteConsumer(ctx, stream, set.EndpointConsumer(name))
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, true, nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return 0, false, err
	}
	var cons jetstream.Consumer
	err = r.NATS.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) (err error) {
		cons, err = js.CreateOrUpdateConsumer(ctx, stream, set.DrainConsumerConfig(name))
		return err
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, err
	}
	dead := func(msg jetstream.Msg, meta *jetstream.MsgMetadata, maxPayload int64, now time.Time) *nats.Msg {
		dl := records.NewDeadLetter(msg.Headers(), records.ReasonEndpointDeleted,
			fmt.Sprintf("WebhookEndpoint %s/%s was deleted before this delivery succeeded", ns, name), nil, now)
		dl.Identify(meta.Stream, meta.Sequence.Stream, ns, name)
		return records.DeadLetterMessage(set.DeadLetterSubject(name, dl.DeliveryID), dl, msg.Data(), maxPayload)
	}
	empty := func(info *jetstream.ConsumerInfo) bool { return info.NumPending == 0 && info.NumAckPending == 0 }
	return r.drain(ctx, ns, cons, dead, empty, func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteConsumer(ctx, stream, set.DrainConsumer(name))
	})
}

// drain moves what a drain consumer brings to the dead-letter stream (dead makes the dead
// letter of a message, or nil to acknowledge it without one) for at most drainSlice, until
// finished says the consumer has nothing more to move; then remove deletes it.
func (r *EndpointReconciler) drain(ctx context.Context, ns string, cons jetstream.Consumer,
	dead func(msg jetstream.Msg, meta *jetstream.MsgMetadata, maxPayload int64, now time.Time) *nats.Msg,
	finished func(*jetstream.ConsumerInfo) bool, remove func(ctx context.Context, js jetstream.JetStream) error) (moved int, done bool, err error) {
	deadline := time.Now().Add(drainSlice)
	wait := false
	for time.Now().Before(deadline) {
		var n int
		var empty bool
		err = r.NATS.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error {
			var err error
			n, err = r.deadLetterBatch(ctx, js, cons, dead, wait)
			if err != nil || n > 0 {
				return err
			}
			// Done when nothing is left, acknowledged or not: an acknowledgement that got lost
			// returns its message after AckWait, to be moved again.
			info, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			empty = finished(info)
			return nil
		})
		moved += n
		if err != nil {
			return moved, false, err
		}
		// Nothing came but something is still unacknowledged: wait for it at the server.
		wait = n == 0
		if empty {
			err = r.NATS.Do(ctx, ns, remove)
			if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return moved, false, err
			}
			return moved, true, nil
		}
	}
	return moved, false, nil
}

// drainSettle is how long the drain of a deleted endpoint's events waits, after pausing its
// consumer, for the attempts in flight to settle before it moves what is left.
const drainSettle = 30 * time.Second

// drainEvents retires ep's consumer on src's events stream and moves the events it had not
// settled to the dead-letter stream: the consumer is paused (nothing more goes out), the
// attempts in flight may settle (for at most drainSettle), then a temporary consumer from
// right after what it settled through the stream's last event replaces it. done is true when
// that consumer has moved everything and is gone (or there was nothing to retire).
func (r *EndpointReconciler) drainEvents(ctx context.Context, ep *v1alpha1.WebhookEndpoint, src string) (moved int, done bool, err error) {
	set := r.NATS.Config().For(src)
	stream := set.EventsStream()
	name := streams.EndpointConsumerOf(ep.Namespace, ep.Name)
	drainName := set.EventsDrainConsumerConfig(ep.Namespace, ep.Name, nil, 0, 0).Durable
	var cons jetstream.Consumer
	settled := true
	err = r.NATS.Do(ctx, src, func(ctx context.Context, js jetstream.JetStream) error {
		c, err := js.Consumer(ctx, stream, name)
		if err == nil {
			if settled, err = retireEventsConsumer(ctx, js, set, ep, c); err != nil || !settled {
				return err
			}
		} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return err
		}
		cons, err = js.Consumer(ctx, stream, drainName)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			cons, err = nil, nil
		}
		return err
	})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, true, nil
	}
	if err != nil || !settled {
		return 0, false, err
	}
	if cons == nil {
		return 0, true, nil
	}
	through, _ := strconv.ParseUint(cons.CachedInfo().Config.Metadata[streams.DrainThroughKey], 10, 64)
	ns := ep.Namespace
	reader := r.NATS.Config().For(ns)
	dead := func(msg jetstream.Msg, meta *jetstream.MsgMetadata, maxPayload int64, now time.Time) *nats.Msg {
		if meta.Sequence.Stream > through {
			return nil // published after the endpoint went
		}
		m, _, ok := records.EventDelivery(msg.Subject(), r.NATS.Config().EventsSubjectPrefix, meta.Stream, meta.Sequence.Stream, meta.Timestamp, msg.Headers(), ns, ep.Name)
		if !ok {
			return nil
		}
		dl := records.DeadLetterOf(msg.Headers(), m, records.ReasonEndpointDeleted,
			fmt.Sprintf("WebhookEndpoint %s/%s was deleted before this event was delivered", ns, ep.Name), nil, now)
		return records.DeadLetterMessage(reader.DeadLetterSubject(ep.Name, dl.DeliveryID), dl, msg.Data(), maxPayload)
	}
	finished := func(info *jetstream.ConsumerInfo) bool {
		return info.NumAckPending == 0 && (info.NumPending == 0 || info.Delivered.Stream >= through)
	}
	return r.drain(ctx, src, cons, dead, finished, func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteConsumer(ctx, stream, drainName)
	})
}

// retireEventsConsumer pauses ep's consumer c on set's events stream and, once its attempts in
// flight settled (or drainSettle passed), replaces it with the drain consumer of what it had
// not settled. It reports whether it did.
func retireEventsConsumer(ctx context.Context, js jetstream.JetStream, set streams.Set, ep *v1alpha1.WebhookEndpoint, c jetstream.Consumer) (bool, error) {
	info := c.CachedInfo()
	stream := set.EventsStream()
	if !info.Paused {
		if _, err := js.PauseConsumer(ctx, stream, info.Name, time.Now().Add(time.Hour)); err != nil {
			return false, err
		}
		return false, nil
	}
	pausedAt := info.Config.PauseUntil.Add(-time.Hour)
	if info.NumAckPending > 0 && time.Since(pausedAt) < drainSettle {
		return false, nil
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return false, err
	}
	cc := set.EventsDrainConsumerConfig(ep.Namespace, ep.Name, streams.EventPatterns(&ep.Spec), info.AckFloor.Stream+1, st.CachedInfo().State.LastSeq)
	if _, err := js.CreateConsumer(ctx, stream, cc); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
		return false, err
	}
	return true, js.DeleteConsumer(ctx, stream, info.Name)
}

// deadLetterBatch moves the messages available now. internal/records makes each dead letter
// (naming a message without a delivery id after where it is stored, bounding what it holds,
// fitting it to the server's maximum payload); they are published together, and each message
// is acknowledged only once its own dead letter is stored (its PubAck came back), so a failure
// leaves it to be moved again. A message moved twice (after a crash mid-drain) is
// de-duplicated by the dead-letter message id.
func (r *EndpointReconciler) deadLetterBatch(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer,
	dead func(msg jetstream.Msg, meta *jetstream.MsgMetadata, maxPayload int64, now time.Time) *nats.Msg, wait bool) (int, error) {
	var batch jetstream.MessageBatch
	var err error
	if wait {
		batch, err = cons.Fetch(drainBatch, jetstream.FetchMaxWait(time.Second))
	} else {
		batch, err = cons.FetchNoWait(drainBatch)
	}
	if err != nil {
		return 0, err
	}
	type pending struct {
		msg jetstream.Msg
		ack jetstream.PubAckFuture
	}
	var sent []pending
	now := time.Now()
	for msg := range batch.Messages() {
		meta, err := msg.Metadata()
		if err != nil {
			return 0, err
		}
		out := dead(msg, meta, js.Conn().MaxPayload(), now)
		if out == nil {
			if err := msg.Ack(); err != nil {
				return 0, err
			}
			continue
		}
		ack, err := js.PublishMsgAsync(out)
		if err != nil {
			return 0, fmt.Errorf("storing a dead letter: %w", err)
		}
		sent = append(sent, pending{msg, ack})
	}
	if err := batch.Error(); err != nil {
		return 0, err
	}
	moved := 0
	for _, p := range sent {
		select {
		case <-p.ack.Ok():
		case err := <-p.ack.Err():
			return moved, fmt.Errorf("storing a dead letter: %w", err)
		case <-ctx.Done():
			return moved, fmt.Errorf("storing a dead letter: %w", ctx.Err())
		}
		if err := p.msg.Ack(); err != nil {
			return moved, fmt.Errorf("acknowledging a dead-lettered delivery: %w", err)
		}
		moved++
	}
	return moved, nil
}
