package streams_test

import (
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

func TestEndpointConsumerOptionsFor(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec v1alpha1.WebhookEndpointSpec
		want streams.EndpointConsumerOptions
	}{
		{"not defaulted by an API server", v1alpha1.WebhookEndpointSpec{},
			streams.EndpointConsumerOptions{MaxInFlight: int(v1alpha1.DefaultMaxInFlight), Timeout: v1alpha1.DefaultTimeout}},
		{"set", v1alpha1.WebhookEndpointSpec{MaxInFlight: new(int32(3)), Timeout: &metav1.Duration{Duration: time.Minute},
			Ordering: &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey}},
			streams.EndpointConsumerOptions{MaxInFlight: 3, Timeout: time.Minute, PerKey: true}},
	} {
		before := tc.spec.DeepCopy()
		if got := streams.EndpointConsumerOptionsFor(&tc.spec); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		if !reflect.DeepEqual(&tc.spec, before) {
			t.Errorf("%s: the spec was changed", tc.name)
		}
	}
}
