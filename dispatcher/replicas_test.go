package dispatcher_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/leases"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Three replicas share one namespace's work: each holds a third of the partitions (partition
// p belongs to the (p mod 3)th replica by name), delivers the PerKey endpoints of its
// partitions and nobody else's, and takes part in delivering the best-effort endpoint, whose
// consumer every replica pulls from. Counted from each replica's own metrics.
func TestThreeReplicasEachDoAThirdOfTheWork(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		time.Sleep(2 * time.Millisecond) // slow enough that every replica's pulls are served
		return testenv.Response{Status: 200}
	})
	e.endpoint("sink", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"be.*"}, MaxInFlight: ptr[int32](30)})
	const ordered = 12
	for i := range ordered {
		e.endpoint(fmt.Sprintf("ordered-%02d", i), v1alpha1.WebhookEndpointSpec{URL: rcv.URL(),
			EventTypes: []v1alpha1.EventTypePattern{v1alpha1.EventTypePattern(fmt.Sprintf("pk.%02d", i))},
			Ordering:   &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{Header: "X-Key"}}})
	}
	ids := []string{"r0", "r1", "r2"}
	regs := map[string]*prometheus.Registry{}
	for _, id := range ids {
		regs[id] = prometheus.NewRegistry()
		e.dispatcher(id, func(o *dispatcher.Options) { o.Replicas = 3; o.Registry = regs[id] })
	}
	// Wait until every partition is held by the replica it belongs to.
	ctx := context.Background()
	kv, err := e.js.KeyValue(ctx, e.set.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	owner := func(p int) string { return ids[p%len(ids)] }
	testenv.Eventually(t, 30*time.Second, func() bool {
		for p := range dispatcher.DefaultPartitions {
			entry, err := kv.Get(ctx, streams.LeaseKey("", p))
			if err != nil || string(entry.Value()) != owner(p) {
				return false
			}
		}
		return true
	}, "the partitions did not settle on their replicas")

	const n = 900
	for i := range n {
		e.publish("be.evt", fmt.Sprintf("evt_be_%04d", i), []byte(`{}`))
		e.publish(fmt.Sprintf("pk.%02d", i%ordered), fmt.Sprintf("evt_pk_%04d", i), []byte(`{}`), "X-Key", fmt.Sprint(i%7))
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return len(rcv.RequestsByID()) == 2*n }, "delivered %d of %d", lazyN(func() int { return len(rcv.RequestsByID()) }), 2*n)

	for i := range ordered {
		ep := fmt.Sprintf("ordered-%02d", i)
		want := owner(leases.PartitionOf(ep, dispatcher.DefaultPartitions))
		for _, id := range ids {
			got := counterSum(t, regs[id], "webhook_deliveries_total", ep)
			if id == want && got == 0 {
				t.Errorf("%s holds the partition of %s and delivered none of it", id, ep)
			}
			if id != want && got != 0 {
				t.Errorf("%s delivered %v of %s, whose partition %s holds", id, got, ep, want)
			}
		}
	}
	total := 0.0
	be := map[string]float64{}
	for _, id := range ids {
		be[id] = counterSum(t, regs[id], "webhook_deliveries_total", "sink")
		total += be[id]
	}
	for _, id := range ids {
		t.Logf("%s: %.0f of the best-effort endpoint's %.0f deliveries, events taken %.0f", id, be[id], total,
			counterSum(t, regs[id], "webhook_events_routed_total", ""))
		if be[id] < total/6 {
			t.Errorf("%s delivered %.0f of the best-effort endpoint's %.0f: replicas do not share its consumer", id, be[id], total)
		}
	}
}
