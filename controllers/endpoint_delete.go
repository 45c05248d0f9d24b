package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// deadLetterPending deletes ep's consumer and moves what is left for it to the dead-letter
// stream through a temporary consumer, for at most drainSlice. done is true when nothing is
// left and the temporary consumer is gone.
func (r *EndpointReconciler) deadLetterPending(ctx context.Context, ep *v1alpha1.WebhookEndpoint) (moved int, done bool, err error) {
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
	deadline := time.Now().Add(drainSlice)
	wait := false
	for time.Now().Before(deadline) {
		var n int
		var empty bool
		err = r.NATS.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error {
			var err error
			n, err = r.deadLetterBatch(ctx, js, cons, set, name, wait)
			if err != nil || n > 0 {
				return err
			}
			// Done when nothing is left, acknowledged or not: an acknowledgement that got lost
			// returns its message after AckWait, to be moved again.
			info, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			empty = info.NumPending == 0 && info.NumAckPending == 0
			return nil
		})
		moved += n
		if err != nil {
			return moved, false, err
		}
		// Nothing came but something is still unacknowledged: wait for it at the server.
		wait = n == 0
		if empty {
			err = r.NATS.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error {
				return js.DeleteConsumer(ctx, stream, set.DrainConsumer(name))
			})
			if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return moved, false, err
			}
			return moved, true, nil
		}
	}
	return moved, false, nil
}

// deadLetterBatch moves the messages available now. internal/records makes each dead letter
// (naming a message without a delivery id after where it is stored, bounding what it holds,
// fitting it to the server's maximum payload); they are published together, and each message
// is acknowledged only once its own dead letter is stored (its PubAck came back), so a failure
// leaves it to be moved again. A message moved twice (after a crash mid-drain) is
// de-duplicated by the dead-letter message id.
func (r *EndpointReconciler) deadLetterBatch(ctx context.Context, js jetstream.JetStream, cons jetstream.Consumer, set streams.Set, name string, wait bool) (int, error) {
	ns := set.Namespace()
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
		dl := records.NewDeadLetter(msg.Headers(), records.ReasonEndpointDeleted,
			fmt.Sprintf("WebhookEndpoint %s/%s was deleted before this delivery succeeded", ns, name), nil, now)
		dl.Identify(meta.Stream, meta.Sequence.Stream, ns, name)
		dead := records.DeadLetterMessage(set.DeadLetterSubject(name, dl.DeliveryID), dl, msg.Data(), js.Conn().MaxPayload())
		ack, err := js.PublishMsgAsync(dead)
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
