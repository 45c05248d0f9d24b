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
