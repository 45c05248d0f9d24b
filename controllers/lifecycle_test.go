package controllers_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// Deleting an endpoint loses nothing: its queued deliveries, the one a dispatcher was
// attempting, and its retries scheduled for tomorrow all move to the dead-letter stream with
// reason endpoint_deleted; its consumer goes; and as the namespace's last endpoint it takes
// the shared dispatcher, its RBAC, its router and the NATS credentials with it.
func TestDeletionDeadLettersPendingDeliveriesAndLeavesNoOrphans(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "orders.v1"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "orders.v1", "True/Ready")

	want := map[string]bool{}
	for i := range 5 {
		want[publishDelivery(t, ns, "orders.v1", fmt.Sprintf("evt_queued_%d", i))] = true
	}
	for i := range 3 {
		want[scheduleRetry(t, ns, "orders.v1", fmt.Sprintf("evt_retry_%d", i))] = true
	}
	// A dispatcher is in the middle of attempting one: fetched, not acknowledged.
	cons, err := testJS.Consumer(ctx, layout.For(ns).DeliveriesStream(), layout.For(ns).EndpointConsumer("orders.v1"))
	g.Expect(err).NotTo(HaveOccurred())
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	g.Expect(err).NotTo(HaveOccurred())
	inFlight := <-batch.Messages()
	g.Expect(inFlight).NotTo(BeNil())
	// Another endpoint's delivery in the same namespace is not touched.
	create(t, endpoint(ns, "other"))
	eventuallyReady(t, ns, "other", "True/Ready")
	publishDelivery(t, ns, "other", "evt_other")

	g.Expect(k8s.Delete(ctx, endpoint(ns, "orders.v1"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orders.v1"}, &v1alpha1.WebhookEndpoint{})
		g.Expect(err).To(MatchError(ContainSubstring("not found")))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	got := deadLetters(t, ns, "orders.v1")
	g.Expect(got).To(HaveLen(len(want)))
	for id, dl := range got {
		g.Expect(want).To(HaveKey(id))
		g.Expect(dl.Reason).To(Equal(records.ReasonEndpointDeleted))
		g.Expect(dl.Namespace).To(Equal(ns))
		g.Expect(dl.Endpoint).To(Equal("orders.v1"))
		g.Expect(dl.EventID).To(HavePrefix("evt_"))
	}
	g.Expect(pendingOn(g, ns, layout.For(ns).DeliverySubject("orders.v1"))).To(BeZero())
	g.Expect(pendingOn(g, ns, layout.For(ns).RetryFilter("orders.v1"))).To(BeZero())
	g.Expect(pendingOn(g, ns, layout.For(ns).DeliverySubject("other"))).To(BeEquivalentTo(1))
	names := consumerNames(g, layout.For(ns).DeliveriesStream())
	g.Expect(names).NotTo(ContainElement(layout.For(ns).EndpointConsumer("orders.v1")))
	g.Expect(names).NotTo(ContainElement(layout.For(ns).DrainConsumer("orders.v1")))
	g.Eventually(func(g Gomega) {
		g.Expect(eventReasons(g, ns, "orders.v1")).To(ContainElement("DeadLettered"))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	g.Expect(k8s.Delete(ctx, endpoint(ns, "other"))).To(Succeed())
	expectNoDispatcherLeft(t, ns)
	g.Expect(deadLetters(t, ns, "other")).To(HaveLen(1))
}

// The finalizer's dead letters are made by the record contract (internal/records): a message
// on the delivery subject that no router wrote is named after where it is stored, as a
// dispatcher would name it, and a delivery whose dead letter would exceed the server's maximum
// payload is stored with its payload cut and marked, instead of holding the deletion forever.
func TestDeletionDeadLettersFollowTheRecordContract(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "big"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "big", "True/Ready")
	set := layout.For(ns)

	raw, err := testJS.Publish(ctx, set.DeliverySubject("big"), []byte(`{"raw":true}`))
	g.Expect(err).NotTo(HaveOccurred())
	huge := nats.NewMsg(set.DeliverySubject("big"))
	setMeta(huge, ns, "big", "evt_huge")
	huge.Header.Set(records.HeaderMsgID, records.DeliveryID("evt_huge", ns, "big"))
	huge.Data = bytes.Repeat([]byte("x"), int(testJS.Conn().MaxPayload())-records.HeaderSize(huge.Header)-64)
	_, err = testJS.PublishMsg(ctx, huge)
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(k8s.Delete(ctx, endpoint(ns, "big"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "big"}, &v1alpha1.WebhookEndpoint{})
		g.Expect(err).To(MatchError(ContainSubstring("not found")))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	got := deadLetters(t, ns, "big")
	g.Expect(got).To(HaveLen(2))
	rawDL, ok := got[records.DeliveryIDAt(set.DeliveriesStream(), raw.Sequence, "big")]
	g.Expect(ok).To(BeTrue(), "the unnamed delivery is named after its place in the stream: %v", got)
	g.Expect(rawDL.Namespace).To(Equal(ns))
	g.Expect(rawDL.Endpoint).To(Equal("big"))
	hugeDL, ok := got[records.DeliveryID("evt_huge", ns, "big")]
	g.Expect(ok).To(BeTrue(), "dead letters: %v", got)
	g.Expect(hugeDL.PayloadTruncated).To(BeTrue())
	g.Expect(hugeDL.Reason).To(Equal(records.ReasonEndpointDeleted))
}

// Stopping nats-server turns Ready False with NATSUnavailable, on endpoints already wired and on
// new ones, without blocking the controller; starting it again recovers all of them, with no
// restart of the controller.
func TestNATSOutageIsReportedAndRecovered(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	create(t, endpoint(ns, "steady"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "steady", "True/Ready")

	natsSrv.Stop()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = natsSrv.Start()
		}
	})
	eventuallyReady(t, ns, "steady", "False/"+v1alpha1.ReasonNATSUnavailable)
	create(t, endpoint(ns, "newcomer"))
	ep := eventuallyReady(t, ns, "newcomer", "False/"+v1alpha1.ReasonNATSUnavailable)
	g.Expect(ep.Finalizers).NotTo(BeEmpty())
	// Work that needs no NATS goes on: another namespace's endpoint gets its dispatcher.
	other := newNamespace(t)
	create(t, endpoint(other, "elsewhere"))
	eventuallyReady(t, other, "elsewhere", "False/"+v1alpha1.ReasonNATSUnavailable)
	g.Eventually(func() error {
		return k8s.Get(context.Background(), types.NamespacedName{Namespace: other, Name: "webhook-dispatcher"}, &appsv1.Deployment{})
	}).
		WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	g.Expect(natsSrv.Start()).To(Succeed())
	restarted = true
	eventuallyReady(t, ns, "steady", "True/Ready")
	eventuallyReady(t, ns, "newcomer", "True/Ready")
	g.Expect(consumerExists(g, layout.For(ns).DeliveriesStream(), layout.For(ns).EndpointConsumer("newcomer"))).To(BeTrue())
	g.Eventually(func(g Gomega) {
		g.Expect(consumerExists(g, layout.For(other).EventsStream(), layout.For(other).EndpointConsumer("elsewhere"))).To(BeTrue())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// deadLetters reads every dead letter of one endpoint, by delivery id.
func deadLetters(t *testing.T, ns, ep string) map[string]records.DeadLetter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := testJS.OrderedConsumer(ctx, layout.For(ns).DeadLetterStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{layout.For(ns).DeadLetterFilter(ep)},
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]records.DeadLetter{}
	for {
		batch, err := c.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			dl, err := records.ParseDeadLetter(m.Headers())
			if err != nil {
				t.Fatal(err)
			}
			if _, dup := out[dl.DeliveryID]; dup {
				t.Errorf("delivery %s dead-lettered twice", dl.DeliveryID)
			}
			out[dl.DeliveryID] = dl
		}
		if n == 0 {
			return out
		}
	}
}

// pendingOn counts the messages of namespace ns's deliveries stream on subject (a filter).
func pendingOn(g Gomega, ns, subject string) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := testJS.Stream(ctx, layout.For(ns).DeliveriesStream())
	g.Expect(err).NotTo(HaveOccurred())
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	g.Expect(err).NotTo(HaveOccurred())
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// The streams are created again when they go missing (a NATS server that lost its storage):
// the next reconcile that needs them finds them gone and creates them, with the configured
// limits, before wiring the endpoint.
func TestStreamsAreCreatedAgainWhenMissing(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns := newNamespace(t)
	create(t, endpoint(ns, "first"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "first", "True/Ready")
	g.Eventually(func() error { return testJS.DeleteStream(ctx, layout.For(ns).DeliveriesStream()) }).
		WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	create(t, endpoint(ns, "after-loss"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "after-loss", "True/Ready")
	s, err := testJS.Stream(ctx, layout.For(ns).DeliveriesStream())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.CachedInfo().Config.MaxConsumers).To(Equal(layout.MaxConsumers))
	g.Expect(s.CachedInfo().Config.Retention).To(Equal(jetstream.WorkQueuePolicy))
	g.Expect(consumerExists(g, layout.For(ns).DeliveriesStream(), layout.For(ns).EndpointConsumer("after-loss"))).To(BeTrue())
}

// A large backlog is moved in batches, over several reconciles if need be, and completely.
func TestDeletionMovesALargeBacklog(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ns := newNamespace(t)
	create(t, endpoint(ns, "busy"))
	eventuallyReady(t, ns, "busy", "False/"+v1alpha1.ReasonDispatcherUnavailable)
	const queued, retries = 3000, 500
	for i := range queued + retries {
		msg := nats.NewMsg(layout.For(ns).DeliverySubject("busy"))
		eventID := fmt.Sprintf("evt_%05d", i)
		if i >= queued {
			msg = nats.NewMsg(layout.For(ns).RetrySubject("busy", records.DeliveryID(eventID, ns, "busy")))
			msg.Header.Set("Nats-Schedule", "@at "+time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
			msg.Header.Set("Nats-Schedule-Target", layout.For(ns).DeliverySubject("busy"))
		}
		setMeta(msg, ns, "busy", eventID)
		msg.Data = []byte(`{}`)
		if _, err := testJS.PublishMsgAsync(msg); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-testJS.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishing the backlog timed out")
	}
	g.Expect(k8s.Delete(ctx, endpoint(ns, "busy"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "busy"}, &v1alpha1.WebhookEndpoint{})
		g.Expect(err).To(MatchError(ContainSubstring("not found")))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(deadLetters(t, ns, "busy")).To(HaveLen(queued + retries))
	g.Expect(pendingOn(g, ns, layout.For(ns).DeliverySubject("busy"))).To(BeZero())
	g.Expect(pendingOn(g, ns, layout.For(ns).RetryFilter("busy"))).To(BeZero())
	expectNoDispatcherLeft(t, ns)
}
