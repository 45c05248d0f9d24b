package controllers

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// drainRecheck is how soon an endpoint whose own consumers of an earlier version are draining
// is looked at again.
const drainRecheck = 10 * time.Second

// reconcileSharedLane wires a shared-lane endpoint (streams.LaneShared): its namespace's intake
// and queue consumers, which serve every shared-lane endpoint of the namespace; when it joined
// the shared lane (status.sharedSince: its creation, or now when consumers of its own exist,
// made by an earlier version or while it had its own lane: they deliver what came before; not
// before every pod of its dispatcher is of this version, see rolledOut); and
// those consumers of its own while they drain, deleted once they hold nothing from before
// (status.drainingConsumers). The scheduled retries of its own lane move to the shared lane's
// schedule subjects first, keeping their due times.
func (r *EndpointReconciler) reconcileSharedLane(ctx context.Context, ep *v1alpha1.WebhookEndpoint, obs *endpointObservation) (draining bool, err error) {
	set := r.NATS.Config().For(ep.Namespace)
	var left []string
	// As this controller last wrote it (the cache may not show it yet): once the consumers of
	// its own are deleted, nothing else says the endpoint joined later than its creation.
	since := obs.status.SharedSince
	err = r.NATS.EnsureAndDo(ctx, ep.Namespace, func(ctx context.Context, js jetstream.JetStream) error {
		own, err := ownConsumers(ctx, js, r.NATS.Config(), ep)
		if err != nil {
			return err
		}
		if since == nil && len(own) > 0 && !obs.dispatcherCurrent {
			// A dispatcher of an earlier version still runs (a rollout under way): it
			// delivers whatever its consumers of its own hold, so none of them drains yet,
			// and the shared lane takes nothing of the endpoint's (no sharedSince).
			for _, c := range own {
				left = append(left, c.stream+"/"+c.name)
			}
			return nil
		}
		if since == nil {
			t := ep.CreationTimestamp
			if len(own) > 0 {
				// The next whole second: status keeps whole seconds, and the intake
				// consumer made below must start where the dispatcher, reading the status,
				// stops taking events from the consumers of its own. With the fraction, the
				// events stored in it were neither's (make test-cluster's upgrade step lost
				// 7 of 600); rounded down, the consumers of its own could have delivered
				// some already, which the intake would deliver again.
				t = metav1.NewTime(time.Now().Add(time.Second).Truncate(time.Second))
			}
			since = &t
		}
		if err := r.NATS.EnsureSharedLane(ctx, js, ep.Namespace, since.Time); err != nil {
			return err
		}
		for _, c := range own {
			if time.Now().Before(since.Time) {
				// Until then what is stored is still theirs to deliver.
				left = append(left, c.stream+"/"+c.name)
				continue
			}
			done, err := drained(ctx, js, set, ep, c, since.Time)
			if err != nil {
				return err
			}
			if !done {
				left = append(left, c.stream+"/"+c.name)
				continue
			}
			if err := js.DeleteConsumer(ctx, c.stream, c.name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		obs.block(v1alpha1.ReasonNATSUnavailable, "cannot wire the shared lane of namespace %s: %v", ep.Namespace, err)
		return false, nil
	}
	obs.status.Lane = streams.LaneShared.String()
	obs.status.ConsumerName = streams.IntakeConsumer(ep.Namespace)
	obs.status.DeliverySubject = set.QueueSubject(ep.Name)
	obs.status.SharedSince = since
	obs.status.DrainingConsumers = left
	return len(left) > 0, nil
}

// ownConsumer is one of an endpoint's own consumers.
type ownConsumer struct {
	stream, name string
	// filter is every subject of an events stream.
	filter     string
	deliveries bool
	info       *jetstream.ConsumerInfo
}

// ownConsumers are the consumers of its own ep has: on its deliveries stream and on the events
// streams of its namespace and of its source namespaces.
func ownConsumers(ctx context.Context, js jetstream.JetStream, cfg streams.Config, ep *v1alpha1.WebhookEndpoint) ([]ownConsumer, error) {
	set := cfg.For(ep.Namespace)
	want := []ownConsumer{{stream: set.DeliveriesStream(), name: set.EndpointConsumer(ep.Name), deliveries: true}}
	for _, ns := range streams.SourceNamespaces(ep.Namespace, ep.Spec.SourceNamespaces) {
		src := cfg.For(ns)
		want = append(want, ownConsumer{stream: src.EventsStream(), filter: src.EventsFilter(), name: streams.EndpointConsumerOf(ep.Namespace, ep.Name)})
	}
	var out []ownConsumer
	for _, c := range want {
		cons, err := js.Consumer(ctx, c.stream, c.name)
		ownStream := c.stream == set.DeliveriesStream() || c.stream == set.EventsStream()
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) && !ownStream {
			// A source namespace without its set yet holds no consumer of ep's. A stream of
			// ep's own namespace missing is an error: the caller's EnsureAndDo makes the set
			// again (the shared lane's consumers, made sure of once a minute, would not notice).
			continue
		}
		if err != nil {
			return nil, err
		}
		c.info = cons.CachedInfo()
		out = append(out, c)
	}
	return out, nil
}

// drained reports whether c holds nothing a shared-lane endpoint that joined the shared lane at
// since still needs from it: an events consumer has delivered, and its dispatcher settled, every
// event stored before since; a deliveries consumer has nothing pending or unacknowledged, and no
// retry of its own lane is scheduled any more (MoveRetries moves them).
func drained(ctx context.Context, js jetstream.JetStream, set streams.Set, ep *v1alpha1.WebhookEndpoint, c ownConsumer, since time.Time) (bool, error) {
	info := c.info
	if info.NumAckPending > 0 {
		return false, nil
	}
	if c.deliveries {
		left, err := set.MoveRetries(ctx, js, ep.Name)
		if err != nil || left > 0 {
			return false, err
		}
		return info.NumPending == 0, nil
	}
	if info.NumPending == 0 {
		return true, nil
	}
	// The first event stored at or after since: everything before it was delivered once the
	// consumer's delivered position is past it.
	rd, err := streamread.Open(ctx, js.Conn(), js, c.stream)
	if err != nil {
		return false, err
	}
	first, err := rd.ForwardFrom(ctx, c.filter, since, 1)
	if err != nil {
		return false, err
	}
	if len(first) == 0 {
		return info.Delivered.Stream >= rd.LastSeq, nil
	}
	return info.Delivered.Stream+1 >= first[0].Seq, nil
}
