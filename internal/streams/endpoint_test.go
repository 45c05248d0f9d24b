package streams_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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

func TestEndpointEventsConsumerConfig(t *testing.T) {
	set := streams.DefaultConfig().For("shop")
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	opts := streams.EndpointConsumerOptions{MaxInFlight: 20, Timeout: 5 * time.Second}
	cc := set.EndpointEventsConsumerConfig("shop", "orders", []string{"order.created", "order.*"}, opts, streams.ConsumerStart{Time: at})
	if cc.Durable != "ep_shop_orders" || cc.FilterSubject != "webhooks.shop.order.*" || len(cc.FilterSubjects) != 0 ||
		cc.MaxAckPending != 20 || cc.AckWait != 20*time.Second || cc.DeliverPolicy != jetstream.DeliverByStartTimePolicy || !cc.OptStartTime.Equal(at) {
		t.Errorf("own consumer: %+v", cc)
	}
	// Patterns JetStream cannot filter without overlap: every event of the namespace.
	cc = set.EndpointEventsConsumerConfig("crm", "audit", []string{"order.*", "*.created"}, opts, streams.ConsumerStart{Seq: 42})
	if cc.Durable != "ep_crm_audit" || cc.FilterSubject != "webhooks.shop.>" || cc.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || cc.OptStartSeq != 42 {
		t.Errorf("a source namespace's consumer: %+v", cc)
	}
	cc = set.EndpointEventsConsumerConfig("shop", "two", []string{"a.x", "b.>"}, opts, streams.ConsumerStart{})
	if cc.FilterSubject != "" || len(cc.FilterSubjects) != 2 || cc.DeliverPolicy != jetstream.DeliverNewPolicy {
		t.Errorf("two filters: %+v", cc)
	}
	if _, exact := set.EventFilters([]string{"order.*", "*.created"}); exact {
		t.Error("overlapping patterns are exact filters")
	}
}

func TestHoldRoom(t *testing.T) {
	for _, tc := range []struct {
		name                                 string
		bytes, msgs, size, maxBytes, maxMsgs int64
		want                                 bool
	}{
		{"unbounded", 1 << 40, 1 << 30, 1 << 20, 0, 0, true},
		{"empty", 0, 0, 1000, 10000, 100, true},
		{"below 80%, the copy crosses it", 7900, 10, 500, 10000, 100, true},
		{"at 80% of the bytes", 8000, 10, 1, 10000, 100, false},
		{"the copy would pass 90%", 7000, 10, 2001, 10000, 100, false},
		{"the copy reaches 90%", 7000, 10, 2000, 10000, 100, true},
		{"at 80% of the messages", 0, 80, 1, 10000, 100, false},
		{"below 80% of the messages", 0, 79, 1, 10000, 100, true},
	} {
		if got := streams.HoldRoom(tc.bytes, tc.msgs, tc.size, tc.maxBytes, tc.maxMsgs); got != tc.want {
			t.Errorf("%s: HoldRoom = %v, want %v", tc.name, got, tc.want)
		}
	}
}
