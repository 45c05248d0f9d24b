package dispatcher_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Deleting an endpoint loses nothing, and its dispatcher (its one dead-letter writer) writes
// every dead letter: the events queued for it, the delivery it was attempting, its retries
// scheduled for tomorrow, a delivery no router wrote (named after where it is stored) and one
// whose dead letter would exceed the server's maximum payload (its payload cut and marked) all
// end as endpoint_deleted dead letters, once each, and none of the queued ones is sent.
// Another endpoint of the namespace delivers as before and loses nothing. Both ride the shared
// lane. The finalizer's part is the test's here, as controllers' finalize does it: wait until
// nothing of the endpoint is queued, parked or scheduled (streams.Set.SharedLaneResidue), let
// it go.
func TestDeletedEndpointIsDeadLetteredByItsDispatcher(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	release := make(chan struct{})
	rcv := newReceiver(t, func(r testenv.Request) testenv.Response {
		switch {
		case strings.HasPrefix(r.ID, "evt_retry_"):
			return testenv.Response{Status: 500, Body: "tomorrow"}
		case r.ID == "evt_inflight":
			select {
			case <-release:
			case <-time.After(time.Minute):
			}
			return testenv.Response{Status: 500, Body: "failed while its endpoint was deleted"}
		}
		return testenv.Response{}
	})
	ref := e.policy("daily", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 24 * time.Hour}}, CircuitBreaker: noCircuit()})
	// One at a time, so that what comes after the one in flight waits.
	e.endpoint("gone", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref, MaxInFlight: ptr[int32](1),
		EventTypes: []v1alpha1.EventTypePattern{"order.>"}})
	e.endpoint("keep", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"invoice.>"}})
	e.dispatcher("d1")

	want := map[string]bool{}
	for i := range 3 {
		id := fmt.Sprintf("evt_retry_%d", i)
		e.publish("order.created", id, []byte(`{}`))
		want[records.DeliveryID(id, e.ns, "gone")] = true
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return e.stored(e.set.ScheduleFilter("gone")) == 3 },
		"the retries are not scheduled: %v", lazy(e.dump))
	e.publish("order.created", "evt_inflight", []byte(`{}`))
	want[records.DeliveryID("evt_inflight", e.ns, "gone")] = true
	testenv.Eventually(t, 20*time.Second, func() bool { return rcv.RequestsByID()["evt_inflight"] == 1 }, "evt_inflight is not attempted")
	for i := range 5 {
		id := fmt.Sprintf("evt_queued_%d", i)
		e.publish("order.created", id, []byte(`{}`))
		want[records.DeliveryID(id, e.ns, "gone")] = true
	}
	raw, err := e.js.Publish(ctx, e.set.QueueSubject("gone"), []byte(`{"raw":true}`))
	if err != nil {
		t.Fatal(err)
	}
	rawID := records.DeliveryIDAt(e.set.DeliveriesStream(), raw.Sequence, "gone")
	want[rawID] = true
	huge := nats.NewMsg(e.set.QueueSubject("gone"))
	hugeID := records.DeliveryID("evt_huge", e.ns, "gone")
	records.SetDeliveryMeta(huge.Header, records.DeliveryMeta{DeliveryID: hugeID, EventID: "evt_huge", EventType: "order.created",
		Namespace: e.ns, Endpoint: "gone", Created: time.Now(), Attempts: 1})
	huge.Header.Set(records.HeaderMsgID, hugeID)
	huge.Data = bytes.Repeat([]byte("x"), int(e.nc.MaxPayload())-records.HeaderSize(huge.Header)-64)
	if _, err := e.js.PublishMsg(ctx, huge); err != nil {
		t.Fatal(err)
	}
	want[hugeID] = true
	e.publish("invoice.created", "evt_keep_before", []byte(`{}`))

	// The deletion, as the API server makes it while a finalizer holds the endpoint.
	ep := e.get("gone")
	deleteHeld(t, e, ep)
	// Once the dispatcher sees a change made after the deletion it sees the deletion too (one
	// informer, in order): then the one in flight fails.
	keep := e.get("keep")
	patch := client.MergeFrom(keep.DeepCopy())
	keep.Spec.Headers = []v1alpha1.HTTPHeader{{Name: "X-Seen", Value: "after-deletion"}}
	if err := e.k8s.Patch(ctx, keep, patch); err != nil {
		t.Fatal(err)
	}
	probes := 0
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, r := range rcv.Requests() {
			if strings.HasPrefix(r.ID, "evt_keep_probe_") && r.Header.Get("X-Seen") == "after-deletion" {
				return true
			}
		}
		e.publish("invoice.created", fmt.Sprintf("evt_keep_probe_%d", probes), []byte(`{}`))
		probes++
		return false
	}, "the dispatcher does not see the change of keep")
	close(release)

	byID := map[string]records.DeadLetter{}
	testenv.Eventually(t, 30*time.Second, func() bool {
		clear(byID)
		for _, dl := range e.deadLetters() {
			if _, dup := byID[dl.DeliveryID]; dup {
				t.Errorf("delivery %s dead-lettered twice", dl.DeliveryID)
			}
			byID[dl.DeliveryID] = dl
		}
		return len(byID) >= len(want)
	}, "%d dead letters, want %d: %v%v", lazyN(func() int { return len(byID) }), len(want), lazy(func() string {
		var b strings.Builder
		for id, dl := range byID {
			fmt.Fprintf(&b, "\n%s %s %s", id, dl.EventID, dl.Reason)
		}
		for id := range want {
			fmt.Fprintf(&b, "\nwant %s", id)
		}
		return b.String()
	}), lazy(e.dump))
	for id, dl := range byID {
		if !want[id] || dl.Reason != records.ReasonEndpointDeleted || dl.Namespace != e.ns || dl.Endpoint != "gone" {
			t.Errorf("unexpected dead letter %s: %+v", id, dl)
		}
	}
	if _, ok := byID[rawID]; !ok {
		t.Errorf("the delivery no router wrote is not named after where it is stored (%s)", rawID)
	}
	if !byID[hugeID].PayloadTruncated {
		t.Errorf("the near-max-payload delivery's dead letter is not cut and marked: %+v", byID[hugeID])
	}
	for id, n := range rcv.RequestsByID() {
		if strings.HasPrefix(id, "evt_queued_") || id == "evt_huge" || n > 1 {
			t.Errorf("%s was sent %d times", id, n)
		}
	}

	// A retry scheduled for tomorrow that reaches the stream with no word to the dispatcher
	// (an attempt in flight whose note raced with the holder's last read of the schedule) is
	// dead-lettered too: a deleted endpoint's holder reads its scheduled retries again.
	lateID := records.DeliveryID("evt_late", e.ns, "gone")
	wait, target := e.set.RetryTarget("gone", lateID, streams.LaneShared)
	late := records.NewDelivery(wait, nats.Header{}, []byte(`{}`), records.DeliveryMeta{DeliveryID: lateID, EventID: "evt_late",
		EventType: "order.created", Namespace: e.ns, Endpoint: "gone", Created: time.Now(), Attempts: 1})
	late.Header.Set("Nats-Schedule", "@at "+time.Now().Add(24*time.Hour).UTC().Format(time.RFC3339Nano))
	late.Header.Set("Nats-Schedule-Target", target)
	if _, err := e.js.PublishMsg(ctx, late); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, dl := range e.deadLetters() {
			if dl.DeliveryID == lateID {
				return dl.Reason == records.ReasonEndpointDeleted
			}
		}
		return false
	}, "the retry scheduled without a word is not dead-lettered: %v", lazy(e.dump))
	if n := rcv.RequestsByID()["evt_late"]; n != 0 {
		t.Errorf("evt_late was sent %d times", n)
	}

	// The finalizer's wait: nothing of the endpoint is left in the deliveries stream; then
	// the endpoint goes with its finalizer.
	testenv.Eventually(t, 10*time.Second, func() bool {
		n, err := e.set.SharedLaneResidue(ctx, e.js, "gone")
		return err == nil && n == 0
	}, "messages of the deleted endpoint are left in the deliveries stream: %v", lazy(e.dump))
	ep = e.get("gone")
	patch = client.MergeFrom(ep.DeepCopy())
	controllerutil.RemoveFinalizer(ep, controllers.Finalizer)
	if err := e.k8s.Patch(ctx, ep, patch); err != nil {
		t.Fatal(err)
	}

	e.publish("invoice.created", "evt_keep_after", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool {
		got := rcv.RequestsByID()
		return got["evt_keep_before"] == 1 && got["evt_keep_after"] == 1
	}, "the other endpoint does not deliver: %v", lazy(func() string { return strings.Join(sortedKeys(rcv.RequestsByID()), ",") }))
	for _, dl := range e.deadLetters() {
		if dl.Endpoint == "keep" {
			t.Errorf("the other endpoint's delivery was dead-lettered: %+v", dl)
		}
	}
}

// A deleted shared-lane endpoint's retries scheduled for tomorrow wait on their schedule
// subjects, read by no consumer: none is sent ahead of its time, and once its dispatcher sees
// the deletion each is dead-lettered (endpoint_deleted) and its schedule removed.
func TestScheduledRetriesOfADeletedEndpointAreDeadLetteredNotSent(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, testenv.Failing)
	ref := e.policy("daily", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 24 * time.Hour}}, CircuitBreaker: noCircuit()})
	e.endpoint("late", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref})
	e.dispatcher("d1")
	for i := range 3 {
		e.publish("a", fmt.Sprintf("evt_%d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return e.stored(e.set.ScheduleFilter("late")) == 3 },
		"the retries are not scheduled: %v", lazy(e.dump))
	ep := e.get("late")
	deleteHeld(t, e, ep)
	t.Cleanup(func() {
		ep := e.get("late")
		patch := client.MergeFrom(ep.DeepCopy())
		controllerutil.RemoveFinalizer(ep, controllers.Finalizer)
		_ = e.k8s.Patch(context.Background(), ep, patch)
	})
	var dls []records.DeadLetter
	testenv.Eventually(t, 20*time.Second, func() bool { dls = e.deadLetters(); return len(dls) >= 3 }, "not dead-lettered: %v", lazy(e.dump))
	for _, dl := range dls {
		if dl.Reason != records.ReasonEndpointDeleted {
			t.Errorf("dead letter %s: reason %s, want %s", dl.DeliveryID, dl.Reason, records.ReasonEndpointDeleted)
		}
	}
	for id, n := range rcv.RequestsByID() {
		if n != 1 {
			t.Errorf("%s was sent %d times", id, n)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return e.stored(e.set.ScheduleFilter("late")) == 0 },
		"the dead-lettered retries are still scheduled: %v", lazy(e.dump))
}

// The retries an earlier version scheduled on an endpoint's own lane, moved by the controller
// onto the shared lane's schedules when the endpoint joined it (streams.Set.MoveRetries), are
// dead-lettered like the shared lane's own once the endpoint is deleted, by a dispatcher that
// started after the move: none stays behind for the finalizer to wait on.
func TestMovedRetriesOfADeletedEndpointAreDeadLettered(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rcv := newReceiver(t, testenv.Failing)
	ref := e.policy("daily", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 24 * time.Hour}}, CircuitBreaker: noCircuit()})
	e.endpoint("late", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref})
	due := time.Now().Add(24 * time.Hour).UTC()
	for i := range 3 {
		// What the earlier version scheduled after a first attempt failed.
		id := fmt.Sprintf("evt_%d", i)
		meta := records.DeliveryMeta{DeliveryID: records.DeliveryID(id, e.ns, "late"), EventID: id, EventType: "a", Namespace: e.ns,
			Endpoint: "late", Attempts: 1, Created: time.Now()}
		msg := records.NewDelivery(e.set.RetrySubject("late", meta.DeliveryID), nats.Header{}, []byte(`{}`), meta)
		msg.Header.Set("Nats-Schedule", "@at "+due.Format(time.RFC3339Nano))
		msg.Header.Set("Nats-Schedule-Target", e.set.DeliverySubject("late"))
		msg.Header.Set(records.HeaderMsgID, meta.DeliveryID+"/retry/1")
		if _, err := e.js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	if left, err := e.set.MoveRetries(ctx, e.js, "late"); err != nil || left != 0 {
		t.Fatalf("moving the retries: %d left, %v", left, err)
	}
	if n := e.stored(e.set.ScheduleFilter("late")); n != 3 {
		t.Fatalf("%d retries on the shared lane's schedules, want 3", n)
	}
	e.dispatcher("d1")
	ep := e.get("late")
	deleteHeld(t, e, ep)
	t.Cleanup(func() {
		ep := e.get("late")
		patch := client.MergeFrom(ep.DeepCopy())
		controllerutil.RemoveFinalizer(ep, controllers.Finalizer)
		_ = e.k8s.Patch(context.Background(), ep, patch)
	})
	testenv.Eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) >= 3 }, "not dead-lettered: %v", lazy(e.dump))
	testenv.Eventually(t, 10*time.Second, func() bool { return e.stored(e.set.ScheduleFilter("late")) == 0 },
		"the dead-lettered retries are still scheduled: %v", lazy(e.dump))
	if n := len(rcv.RequestsByID()); n != 0 {
		t.Errorf("%d retries due tomorrow were sent", n)
	}
}

// stored counts the messages of the deliveries stream on subject (a filter).
func (e *env) stored(subject string) uint64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, e.set.DeliveriesStream())
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		e.t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// deleteHeld deletes ep as the API server does while the controller's finalizer holds it: it
// stays, with a deletion timestamp.
func deleteHeld(t *testing.T, e *env, ep *v1alpha1.WebhookEndpoint) {
	t.Helper()
	ctx := context.Background()
	patch := client.MergeFrom(ep.DeepCopy())
	controllerutil.AddFinalizer(ep, controllers.Finalizer)
	if err := e.k8s.Patch(ctx, ep, patch); err != nil {
		t.Fatal(err)
	}
	if err := e.k8s.Delete(ctx, ep); err != nil {
		t.Fatal(err)
	}
}

// A PerKey endpoint is deleted as a best-effort one is. Its receiver answers 503: the first
// events wait here for a retry due in an hour, behind a circuit that opened, and those that
// came after it (hundreds) are held in the deliveries stream. Deleted, every one of them is dead-lettered
// as endpoint_deleted (once each, none sent again) and its consumers are empty, ready for the
// finalizer: none waits for its retry, and what the keyed path took is given back, so the
// deleting endpoint pulls what is left.
func TestDeletedPerKeyEndpointIsDeadLetteredByItsDispatcher(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	rcv := newReceiver(t, func(testenv.Request) testenv.Response { return testenv.Response{Status: 503, Body: "down"} })
	ref := e.policy("hourly", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: time.Hour}},
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 5, OpenDuration: dur(time.Hour)}})
	e.endpoint("ordered", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref, MaxInFlight: ptr[int32](5),
		Ordering: &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{JSONField: "seq"}}})
	e.dispatcher("d1")

	// More are held than a PerKey worker keeps requested from a consumer (512): the deleting
	// endpoint must ask for the rest.
	const first, n = 8, 600
	for i := range first {
		e.publish("order.created", fmt.Sprintf("evt_%02d", i), []byte(fmt.Sprintf(`{"seq":%d}`, i)))
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		h := e.get("ordered").Status.Health
		return h != nil && h.CircuitState == v1alpha1.CircuitOpen
	}, "the circuit does not open: %v", lazy(e.dump))
	for i := first; i < n; i++ {
		e.publish("order.created", fmt.Sprintf("evt_%02d", i), []byte(fmt.Sprintf(`{"seq":%d}`, i)))
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return e.stored(e.set.DeliverySubject("ordered")) == n-first },
		"the events after the circuit opened are not held: %v", lazy(e.dump))
	sent := rcv.Stats().Requests

	ep := e.get("ordered")
	deleteHeld(t, e, ep)
	t.Cleanup(func() {
		ep := e.get("ordered")
		patch := client.MergeFrom(ep.DeepCopy())
		controllerutil.RemoveFinalizer(ep, controllers.Finalizer)
		_ = e.k8s.Patch(context.Background(), ep, patch)
	})
	if ok, err := e.set.RetireDeliveriesConsumer(ctx, e.js, "ordered", streams.EndpointConsumerOptionsFor(&ep.Spec)); err != nil || !ok {
		t.Fatalf("retiring the deliveries consumer: %v, %v", ok, err)
	}
	byID := map[string]records.DeadLetter{}
	testenv.Eventually(t, 30*time.Second, func() bool {
		clear(byID)
		for _, dl := range e.deadLetters() {
			if _, dup := byID[dl.EventID]; dup {
				t.Errorf("%s dead-lettered twice", dl.EventID)
			}
			byID[dl.EventID] = dl
		}
		return len(byID) >= n
	}, "%d of %d dead-lettered: %v", lazyN(func() int { return len(byID) }), n, lazy(e.dump))
	for i := range n {
		id := fmt.Sprintf("evt_%02d", i)
		if dl, ok := byID[id]; !ok || dl.Reason != records.ReasonEndpointDeleted {
			t.Errorf("%s: dead letter %+v, want one with reason %s", id, dl, records.ReasonEndpointDeleted)
		}
	}
	if got := rcv.Stats().Requests; got != sent {
		t.Errorf("%d requests after the deletion", got-sent)
	}
	for _, stream := range []string{e.set.EventsStream(), e.set.DeliveriesStream()} {
		var info *jetstream.ConsumerInfo
		testenv.Eventually(t, 10*time.Second, func() bool {
			c, err := e.js.Consumer(ctx, stream, e.set.EndpointConsumer("ordered"))
			if err != nil {
				return false
			}
			info = c.CachedInfo()
			return info.NumPending == 0 && info.NumAckPending == 0
		}, "the consumer on %s is not empty: %v", stream, lazy(func() string { return fmt.Sprintf("%+v", info) }))
	}
}
