package streams

import v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"

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
