package dispatcher_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Three endpoints of one namespace ride the shared lane, one intake consumer for all: a dead
// one (every attempt fails, its circuit opens) and a slow one (its requests are held open until
// the test lets them go) do not hold up the healthy one, which gets every event while the slow
// one still holds its first requests. What they cannot take now is parked for them, so the
// intake consumer holds only a bounded share of unacknowledged events for the slow one, not
// its backlog; the slow one gets everything once it answers, and the dead one's events wait,
// parked, in its pending count.
func TestSharedLaneIsolatesADeadAndASlowEndpoint(t *testing.T) {
	e := newEnv(t)
	const n = 300
	healthy := newReceiver(t, nil)
	release := make(chan struct{})
	var slowOpen atomic.Int64
	slow := newReceiver(t, func(testenv.Request) testenv.Response {
		slowOpen.Add(1)
		defer slowOpen.Add(-1)
		<-release
		return testenv.Response{Status: 200}
	})
	t.Cleanup(func() { closeOnce(release) })
	dead := newReceiver(t, testenv.Failing)
	ref := e.policy("patient", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: time.Hour}},
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 3, OpenDuration: dur(time.Hour), SuccessesToClose: 1}})
	healthy.Trust(e.endpoint("healthy", v1alpha1.WebhookEndpointSpec{URL: healthy.URL()}))
	slow.Trust(e.endpoint("slow", v1alpha1.WebhookEndpointSpec{URL: slow.URL(), MaxInFlight: ptr[int32](2), Timeout: dur(2 * time.Minute)}))
	e.endpoint("dead", v1alpha1.WebhookEndpointSpec{URL: dead.URL(), RetryPolicyRef: ref})
	e.dispatcher("d1")

	for i := range n {
		e.publish("order.created", fmt.Sprintf("evt_%03d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return len(healthy.RequestsByID()) == n },
		"the healthy endpoint got %d of %d events%v", lazyN(func() int { return len(healthy.RequestsByID()) }), n, lazy(e.dump))
	if got := slow.Stats().Requests; got > 2 {
		t.Errorf("the slow endpoint, maxInFlight 2, had %d requests open at once", got)
	}
	if slowOpen.Load() == 0 {
		t.Fatal("the slow endpoint's requests were answered before the healthy endpoint finished: the test proves nothing")
	}
	// The intake consumer holds unacknowledged only what the slow endpoint took in (its share
	// and a short queue); the rest of its events are parked.
	ctx := context.Background()
	c, err := e.js.Consumer(ctx, e.set.EventsStream(), streams.IntakeConsumer(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		info, err := c.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending <= 64
	}, "the intake consumer holds the slow endpoint's backlog: %v", lazy(e.dump))
	testenv.Eventually(t, 20*time.Second, func() bool { return e.stored(e.set.ParkSubject("slow")) > 0 },
		"nothing of the slow endpoint is parked: %v", lazy(e.dump))
	// Its status is written apart from the deliveries (batched, rate-limited): wait for it.
	testenv.Eventually(t, 20*time.Second, func() bool {
		h := e.get("dead").Status.Health
		return h != nil && h.CircuitState == v1alpha1.CircuitOpen
	}, "the dead endpoint's circuit is not open: %v", lazy(func() string { return fmt.Sprint(e.get("dead").Status.Health) }))

	closeOnce(release)
	testenv.Eventually(t, 60*time.Second, func() bool { return len(slow.RequestsByID()) == n },
		"the slow endpoint got %d of %d events once it answered%v", lazyN(func() int { return len(slow.RequestsByID()) }), n, lazy(e.dump))
	for id, k := range slow.RequestsByID() {
		if k != 1 {
			t.Errorf("%s reached the slow endpoint %d times", id, k)
		}
	}
	// The dead endpoint's events wait for it, parked, and its status counts them.
	testenv.Eventually(t, 20*time.Second, func() bool {
		h := e.get("dead").Status.Health
		return h != nil && h.Pending >= n-3
	}, "the dead endpoint's pending does not count its parked events: %v", lazy(func() string { return fmt.Sprint(e.get("dead").Status.Health) }))
}

// An endpoint that had consumers of its own (a version before the shared lane, or its own lane
// before a spec change) moves to the shared lane while events flow: its own consumers, listed
// as draining, deliver what was stored before it joined (sharedSince), events and the
// deliveries its deliveries consumer held; the intake delivers what was stored since. Every
// event and delivery reaches the receiver exactly once, and the draining consumers end empty
// (the controller then deletes them).
func TestAnEndpointMovesToTheSharedLaneWithoutLossOrDuplicate(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rcv := newReceiver(t, nil)
	spec := v1alpha1.WebhookEndpointSpec{URL: rcv.URL()}
	rcv.Trust(e.endpoint("moving", spec))
	ep := e.get("moving")
	// Its own consumers, as the earlier version made them, from its creation on.
	e.ownConsumers(ep)
	const before, held, after = 100, 5, 100
	for i := range before {
		e.publish("order.created", fmt.Sprintf("evt_before_%03d", i), []byte(`{}`))
	}
	for i := range held {
		// What the earlier version held in the deliveries stream for it.
		id := fmt.Sprintf("evt_held_%d", i)
		msg := records.NewDelivery(e.set.DeliverySubject("moving"), nats.Header{}, []byte(`{}`), records.DeliveryMeta{
			DeliveryID: records.DeliveryID(id, e.ns, "moving"), EventID: id, EventType: "order.created", Namespace: e.ns,
			Endpoint: "moving", Created: time.Now()})
		if _, err := e.js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	// The upgrade: it joins the shared lane now, its own consumers draining.
	time.Sleep(10 * time.Millisecond) // a stored time strictly after the last event before
	joined := metav1.NewTime(time.Now())
	ep = e.get("moving")
	patch := client.MergeFrom(ep.DeepCopy())
	ep.Status.Lane, ep.Status.SharedSince = streams.LaneShared.String(), &joined
	ep.Status.DrainingConsumers = []string{e.set.EventsStream() + "/" + e.set.EndpointConsumer("moving"),
		e.set.DeliveriesStream() + "/" + e.set.EndpointConsumer("moving")}
	if err := e.k8s.Status().Patch(ctx, ep, patch); err != nil {
		t.Fatal(err)
	}
	e.dispatcher("d1")
	for i := range after {
		e.publish("order.created", fmt.Sprintf("evt_after_%03d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return len(rcv.RequestsByID()) == before+held+after },
		"delivered %d of %d%v", lazyN(func() int { return len(rcv.RequestsByID()) }), before+held+after, lazy(e.dump))
	for _, name := range []string{e.set.EventsStream(), e.set.DeliveriesStream()} {
		c, err := e.js.Consumer(ctx, name, e.set.EndpointConsumer("moving"))
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, func() bool {
			info, err := c.Info(ctx)
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0
		}, "the draining consumer on %s is not empty: %v", name, lazy(e.dump))
	}
	for id, k := range rcv.RequestsByID() {
		if k != 1 {
			t.Errorf("%s reached the receiver %d times", id, k)
		}
	}
	// Drained, its own consumers are deleted and the status says so (the controller's part):
	// the pending count its status shows is read again, with nothing delivered meanwhile. While
	// it drained, its own events consumer also counted the events stored since, which the
	// intake delivered.
	for _, name := range []string{e.set.EventsStream(), e.set.DeliveriesStream()} {
		if err := e.js.DeleteConsumer(ctx, name, e.set.EndpointConsumer("moving")); err != nil {
			t.Fatal(err)
		}
	}
	ep = e.get("moving")
	patch = client.MergeFrom(ep.DeepCopy())
	ep.Status.DrainingConsumers = nil
	if err := e.k8s.Status().Patch(ctx, ep, patch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		h := e.get("moving").Status.Health
		return h != nil && h.Pending == 0 && h.Delivered == before+held+after
	}, "the status after draining: %+v", lazy(func() string { return fmt.Sprintf("%+v", e.get("moving").Status.Health) }))
}

// An endpoint joins the shared lane when its status says so (status.sharedSince, which the
// controller writes after the endpoint was created): a status-only update, which the
// dispatcher otherwise ignores, brings it onto the lane's routes at once. Before, an endpoint
// the dispatcher saw before its status was written stayed off the routes until the periodic
// resync minutes later, and its events were acknowledged for nobody meanwhile (seen in the
// scale-endpoints bench: 28 of 97 endpoints got their event within two minutes).
func TestAnEndpointJoinsTheSharedLaneWhenItsStatusSaysSo(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rcv := newReceiver(t, func(testenv.Request) testenv.Response { return testenv.Response{} })
	e.endpoint("first", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"first.>"}})
	e.dispatcher("d1")
	// "late" is created as the API server has it before the controller's status write.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: names.SigningSecret("late"),
		Annotations: map[string]string{consent.AllowedEndpoints: "late"}}, StringData: map[string]string{names.SigningSecretKey: newSecret()}}
	if err := e.k8s.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	late := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "late"},
		Spec: v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"late.>"}}}
	if err := e.k8s.Create(ctx, late); err != nil {
		t.Fatal(err)
	}
	// One informer brings endpoints in order: once "after" (created next) is delivered to, the
	// dispatcher has seen "late" without its status.
	e.endpoint("after", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"after.>"}})
	e.publish("after.ping", "evt_after", []byte(`{}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return rcv.RequestsByID()["evt_after"] == 1 }, "the endpoint created after was not delivered to")

	e.consumers(e.get("late")) // the controller's status write: status.sharedSince
	e.publish("late.ping", "evt_late", []byte(`{}`))
	// Well within the periodic resync (5 minutes).
	testenv.Eventually(t, 30*time.Second, func() bool { return rcv.RequestsByID()["evt_late"] == 1 },
		"the endpoint on the shared lane since its status said so did not get its event: %v", lazy(e.dump))
}

// A backlog (events stored before the dispatcher starts) of an endpoint that delivers as fast
// as the intake brings them is delivered without a write: what its worker has no room for yet
// waits a moment for room, instead of being parked and read back (two writes and a move each,
// which made a backlog drain at a tenth of the rate). The deliveries stream stays empty.
func TestABacklogOfAFastEndpointIsNotParked(t *testing.T) {
	// Its worker takes 2*64+16 views at once; the rest of the backlog waits for room.
	backlogIsNotParked(t, 400, 64, nil)
}

// backlogIsNotParked stores n events for an endpoint of maxInFlight answering with respond,
// starts the dispatcher, waits for every event to arrive, and fails the test if anything was
// written to the deliveries stream (parked and moved).
func backlogIsNotParked(t *testing.T, n int, maxInFlight int32, respond testenv.Responder) {
	t.Helper()
	e := newEnv(t)
	rcv := newReceiver(t, respond)
	rcv.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), MaxInFlight: ptr(maxInFlight)}))
	for i := range n {
		e.publish("order.created", fmt.Sprintf("evt_%03d", i), []byte(`{}`))
	}
	e.dispatcher("d1")
	testenv.Eventually(t, 60*time.Second, func() bool { return len(rcv.RequestsByID()) == n },
		"the endpoint got %d of %d events%v", lazyN(func() int { return len(rcv.RequestsByID()) }), n, lazy(e.dump))
	if w := deliveriesWritten(t, e); w != 0 {
		t.Errorf("the backlog was written to the deliveries stream (%d messages: parked and moved): %v", w, lazy(e.dump))
	}
}

// deliveriesWritten is how many messages the namespace's deliveries stream ever stored.
func deliveriesWritten(t *testing.T, e *env) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, e.set.DeliveriesStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// A backlog of an endpoint that delivers steadily but slower than the intake brings its
// events (each answer takes 100 ms, eight at a time) waits for room in memory while its worker
// drains, not only a quarter of a second: nothing is parked. Before, every view that waited
// 250 ms was parked (written, moved and read back), though the endpoint was keeping on.
func TestASteadilyDrainingBacklogIsNotParked(t *testing.T) {
	// Its worker takes 2*8+16 views at once; the other 88 wait for room, about a second.
	backlogIsNotParked(t, 120, 8, func(testenv.Request) testenv.Response { return testenv.Response{Delay: 100 * time.Millisecond} })
}

// While an endpoint that has consumers of its own is not on the shared lane yet (no
// status.sharedSince: the controller waits until its dispatcher has rolled out, and meanwhile
// a dispatcher of the earlier version delivers from those consumers), a dispatcher of this
// version takes no event from them: the earlier one delivers each once, none of them taken
// here only to be handed back. Once sharedSince is set, this one delivers them.
func TestADispatcherLeavesConsumersOfItsOwnAloneUntilTheEndpointJoinsTheSharedLane(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rcv := newReceiver(t, nil)
	rcv.Trust(e.endpoint("moving", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.>"}}))
	other := newReceiver(t, nil)
	other.Trust(e.endpoint("other", v1alpha1.WebhookEndpointSpec{URL: other.URL(), EventTypes: []v1alpha1.EventTypePattern{"invoice.>"}}))
	ep := e.get("moving")
	e.ownConsumers(ep)
	patch := client.MergeFrom(ep.DeepCopy())
	ep.Status.Lane, ep.Status.SharedSince = streams.LaneShared.String(), nil
	ep.Status.DrainingConsumers = []string{e.set.EventsStream() + "/" + e.set.EndpointConsumer("moving"),
		e.set.DeliveriesStream() + "/" + e.set.EndpointConsumer("moving")}
	if err := e.k8s.Status().Patch(ctx, ep, patch); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		e.publish("order.created", fmt.Sprintf("evt_%02d", i), []byte(`{}`))
	}
	e.dispatcher("d1")
	// The dispatcher serves the namespace (the other endpoint gets its event), and for two
	// seconds more takes nothing from moving's own events consumer.
	e.publish("invoice.paid", "evt_other", []byte(`{}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return len(other.RequestsByID()) == 1 }, "the other endpoint's event%v", lazy(e.dump))
	own, err := e.js.Consumer(ctx, e.set.EventsStream(), e.set.EndpointConsumer("moving"))
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		info, err := own.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Delivered.Consumer > 0 || len(rcv.RequestsByID()) > 0 {
			t.Fatalf("the dispatcher took %d events from the consumer of its own (%d delivered) of an endpoint not on the shared lane yet",
				info.Delivered.Consumer, len(rcv.RequestsByID()))
		}
	}
	// It joins the shared lane: what was stored before comes from its own consumer, once.
	ep = e.get("moving")
	patch = client.MergeFrom(ep.DeepCopy())
	joined := metav1.NewTime(time.Now())
	ep.Status.SharedSince = &joined
	if err := e.k8s.Status().Patch(ctx, ep, patch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return len(rcv.RequestsByID()) == n },
		"delivered %d of %d%v", lazyN(func() int { return len(rcv.RequestsByID()) }), n, lazy(e.dump))
	for id, k := range rcv.RequestsByID() {
		if k != 1 {
			t.Errorf("%s reached the receiver %d times", id, k)
		}
	}
}
