package dispatcher_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/leases"
	"github.com/webhook-operator/webhook-operator/internal/records"
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

	// The two kinds of events are mixed at random, as a namespace's traffic is: a strict
	// alternation would meet the server's round robin over the replicas' pull requests in step
	// (every second message of the intake consumer is an ordered endpoint's event, which the
	// replica that takes it leaves to that endpoint's own consumer), and one replica could be
	// handed none of the best-effort events.
	const n = 900
	rng := rand.New(rand.NewPCG(3, 32))
	for be, pk := 0, 0; be < n || pk < n; {
		if pk == n || (be < n && rng.IntN(2) == 0) {
			e.publish("be.evt", fmt.Sprintf("evt_be_%04d", be), []byte(`{}`))
			be++
			continue
		}
		e.publish(fmt.Sprintf("pk.%02d", pk%ordered), fmt.Sprintf("evt_pk_%04d", pk), []byte(`{}`), "X-Key", fmt.Sprint(pk%7))
		pk++
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

// maxInFlight holds across replicas and across an endpoint's consumers: two replicas deliver
// new events (its consumer on the events stream) while retries come due from their message
// schedules and replays arrive (its consumer on the deliveries stream), and the receiver never
// has more of the endpoint's requests at once than maxInFlight. Both replicas take part.
func TestMaxInFlightHoldsAcrossReplicasAndConsumers(t *testing.T) {
	e := newEnv(t)
	var inflight, most atomic.Int64
	rcv := newReceiver(t, func(r testenv.Request) testenv.Response {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(25 * time.Millisecond) // a receiver that takes its time: requests overlap
		if strings.HasPrefix(r.ID, "evt_retry_") && r.Attempt == 1 {
			return testenv.Response{Status: 503, Body: "again later"}
		}
		return testenv.Response{}
	})
	// The retry waits longer than the dispatcher waits in place: a message schedule brings it
	// back through the deliveries stream.
	ref := e.policy("later", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 2500 * time.Millisecond}}, CircuitBreaker: noCircuit()})
	const limit = 4
	e.endpoint("busy", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref, MaxInFlight: ptr[int32](limit)})
	regs := map[string]*prometheus.Registry{"a": prometheus.NewRegistry(), "b": prometheus.NewRegistry()}
	for id, reg := range regs {
		e.dispatcher(id, func(o *dispatcher.Options) { o.Replicas, o.Registry = 2, reg })
	}

	const n, everyRetry, everyReplay = 300, 5, 2
	want := map[string]int{}
	for i := range n {
		id := fmt.Sprintf("evt_%03d", i)
		if i%everyRetry == 0 {
			id = fmt.Sprintf("evt_retry_%03d", i)
		}
		e.publish("order.created", id, []byte(`{}`))
		want[id] = 1
		if i%everyRetry == 0 {
			want[id] = 2
		}
		if i%everyReplay == 0 {
			// A replay, as the replay engine writes it: a delivery of its own in the
			// deliveries stream, pointing at the original.
			replayed := fmt.Sprintf("evt_replayed_%03d", i)
			msg := records.NewDelivery(e.set.DeliveryTarget("busy", streams.LaneShared), nats.Header{}, []byte(`{}`), records.DeliveryMeta{
				DeliveryID: "whdl_replay_" + replayed, EventID: replayed, EventType: "order.created", Namespace: e.ns, Endpoint: "busy",
				Created: time.Now(), ReplayOf: "whdl_original_" + replayed})
			if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
				t.Fatal(err)
			}
			want[replayed] = 1
		}
	}
	testenv.Eventually(t, 90*time.Second, func() bool {
		got := rcv.RequestsByID()
		for id, k := range want {
			if got[id] < k {
				return false
			}
		}
		return true
	}, "delivered %d of %d events, replays and retries%v", lazyN(func() int { return len(rcv.RequestsByID()) }), len(want), lazy(e.dump))
	if m := most.Load(); m > limit {
		t.Errorf("the receiver had %d of the endpoint's requests at once, want at most maxInFlight (%d)", m, limit)
	}
	for id, reg := range regs {
		if got := counterSum(t, reg, "webhook_deliveries_total", "busy"); got == 0 {
			t.Errorf("replica %s delivered none of the endpoint's deliveries", id)
		}
	}
	t.Logf("at most %d requests at once (maxInFlight %d)", most.Load(), limit)
}
