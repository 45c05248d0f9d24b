package streams

import (
	"context"
	"errors"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// EndpointConsumerOptionsFor are the settings of an endpoint's spec that shape its consumer.
// The API server has defaulted them; the schema's defaults (v1alpha1's Default) fill them in
// for a spec that did not pass through it.
func EndpointConsumerOptionsFor(spec *v1alpha1.WebhookEndpointSpec) EndpointConsumerOptions {
	s := spec.DeepCopy()
	s.Default()
	return EndpointConsumerOptions{
		MaxInFlight: int(*s.MaxInFlight),
		Timeout:     s.Timeout.Duration,
		PerKey:      s.Ordering.Mode == v1alpha1.OrderingPerKey,
	}
}

// EventPatterns are an endpoint's event-type patterns.
func EventPatterns(spec *v1alpha1.WebhookEndpointSpec) []string {
	out := make([]string, len(spec.EventTypes))
	for i, p := range spec.EventTypes {
		out[i] = string(p)
	}
	return out
}

// EnsureEventsConsumer creates the consumer through which endpoint of namespace reader reads
// s's events (EndpointEventsConsumerConfig), starting at start, or brings an existing one to
// the endpoint's patterns and settings: where it started and its position stay.
func (s Set) EnsureEventsConsumer(ctx context.Context, js jetstream.JetStream, reader, endpoint string, patterns []string, o EndpointConsumerOptions, start ConsumerStart) error {
	want := s.EndpointEventsConsumerConfig(reader, endpoint, patterns, o, start)
	cur, err := js.Consumer(ctx, s.EventsStream(), want.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		_, err = js.CreateConsumer(ctx, s.EventsStream(), want)
		if errors.Is(err, jetstream.ErrConsumerExists) {
			return nil // created meanwhile by another reconcile
		}
		return err
	}
	if err != nil {
		return err
	}
	have := cur.CachedInfo().Config
	want.DeliverPolicy, want.OptStartSeq, want.OptStartTime = have.DeliverPolicy, have.OptStartSeq, have.OptStartTime
	if have.FilterSubject == want.FilterSubject && slices.Equal(have.FilterSubjects, want.FilterSubjects) &&
		have.MaxAckPending == want.MaxAckPending && have.AckWait == want.AckWait && have.Description == want.Description {
		return nil
	}
	_, err = js.UpdateConsumer(ctx, s.EventsStream(), want)
	return err
}

// EnsureDeliveriesConsumer creates or updates endpoint's consumer on the deliveries stream.
func (s Set) EnsureDeliveriesConsumer(ctx context.Context, js jetstream.JetStream, endpoint string, o EndpointConsumerOptions) error {
	_, err := js.CreateOrUpdateConsumer(ctx, s.DeliveriesStream(), s.EndpointConsumerConfig(endpoint, o))
	return err
}

// RetiringConsumerConfig is endpoint's consumer on the deliveries stream once the endpoint is
// being deleted: besides its deliveries it takes its scheduled retries (RetryFilter) long
// before they are due, so that its dispatcher dead-letters those too (acknowledging a message
// schedule removes it).
func (s Set) RetiringConsumerConfig(endpoint string, o EndpointConsumerOptions) jetstream.ConsumerConfig {
	cc := s.EndpointConsumerConfig(endpoint, o)
	cc.Description = "webhook-operator: what is left for deleted " + s.ns + "/" + endpoint
	cc.FilterSubject = ""
	cc.FilterSubjects = []string{s.DeliverySubject(endpoint), s.RetryFilter(endpoint)}
	return cc
}

// RetireDeliveriesConsumer gives endpoint's consumer on the deliveries stream its
// RetiringConsumerConfig, resumes it should a WebhookQuota have paused it, and rewinds it to the
// stream's start: a wider filter takes effect where the consumer is, past the retries
// scheduled earlier. On a work-queue stream what is still stored on its subjects is what
// nobody acknowledged, so the rewound consumer brings exactly that, the messages a dispatcher
// holds unacknowledged at this moment included (they come again: at least once). The drain
// consumer of an earlier version goes first (no two consumers of a work-queue stream may
// overlap); that version had deleted the endpoint's consumer, which is then created again. It
// reports false when there was no consumer to retire.
func (s Set) RetireDeliveriesConsumer(ctx context.Context, js jetstream.JetStream, endpoint string, o EndpointConsumerOptions) (bool, error) {
	stream := s.DeliveriesStream()
	err := js.DeleteConsumer(ctx, stream, s.DrainConsumer(endpoint))
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, err
	}
	cc := s.RetiringConsumerConfig(endpoint, o)
	var c jetstream.Consumer
	if err == nil {
		c, err = js.CreateOrUpdateConsumer(ctx, stream, cc)
	} else {
		c, err = js.UpdateConsumer(ctx, stream, cc)
	}
	if errors.Is(err, jetstream.ErrConsumerDoesNotExist) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if c.CachedInfo().Paused { // an update keeps the pause
		if _, err := js.ResumeConsumer(ctx, stream, cc.Durable); err != nil {
			return false, err
		}
	}
	_, err = js.ResetConsumerToSequence(ctx, stream, cc.Durable, 1)
	return true, err
}
