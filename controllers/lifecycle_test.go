package controllers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Deleting an endpoint waits for its dispatcher to empty its consumers (the dispatcher
// dead-letters what is queued, endpoint_deleted: dispatcher/lifecycle_test.go, with a real
// one; the controller writes no dead letter). While they hold something the endpoint stays,
// Ready False with reason Deleting saying how much is left, and so does its (dedicated)
// dispatcher; its deliveries consumer then also brings its retries
// scheduled for tomorrow, and consumers that were paused are resumed. Once what was
// queued is acknowledged (here by the test, as the dispatcher would) the consumers go and the
// endpoint with them; an event published after the deletion holds nothing up. Another
// endpoint's delivery is left alone, and the namespace's last endpoint takes its dispatcher
// with it.
func TestDeletionWaitsForTheDispatcherToEmptyTheConsumers(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ns := newNamespace(t)
	set := layout.For(ns)
	// With a dispatcher of its own, which nothing else keeps.
	create(t, endpoint(ns, "orders.v1", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true}
	}))
	// Another endpoint of the namespace, reading other events.
	create(t, endpoint(ns, "other", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.EventTypes = []v1alpha1.EventTypePattern{"invoice.*"}
	}))
	markAvailable(t, ns, names.DedicatedDispatcher("orders.v1"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "orders.v1", "True/Ready")
	eventuallyReady(t, ns, "other", "True/Ready")

	publishDelivery(t, ns, "orders.v1", "evt_queued")
	scheduleRetry(t, ns, "orders.v1", "evt_tomorrow")
	publishQueued(t, ns, "other", "evt_other")
	_, err := testJS.Publish(ctx, set.EventSubject("order.created"), []byte(`{}`))
	g.Expect(err).NotTo(HaveOccurred())
	// Paused, as a WebhookQuota (or, the events one, the finalizer of an earlier version)
	// leaves them.
	consumer := set.EndpointConsumer("orders.v1")
	for _, stream := range []string{set.EventsStream(), set.DeliveriesStream()} {
		_, err = testJS.PauseConsumer(ctx, stream, consumer, time.Now().Add(time.Hour))
		g.Expect(err).NotTo(HaveOccurred())
	}

	g.Expect(k8s.Delete(ctx, endpoint(ns, "orders.v1"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		ep := getEndpoint(g, ns, "orders.v1")
		c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(v1alpha1.ReasonDeleting))
		g.Expect(c.Message).To(ContainSubstring("2 deliveries and about 1 events"))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	// Published after the deletion: not the endpoint's, and not waited for.
	_, err = testJS.Publish(ctx, set.EventSubject("order.created"), []byte(`{}`))
	g.Expect(err).NotTo(HaveOccurred())
	g.Consistently(func(g Gomega) {
		g.Expect(getEndpoint(g, ns, "orders.v1").Finalizers).To(ContainElement(controllers.Finalizer))
		dedicated := names.DedicatedDispatcher("orders.v1")
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: dedicated}, &appsv1.Deployment{})).To(Succeed())
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: dedicated}, &corev1.ServiceAccount{})).To(Succeed())
	}).WithTimeout(2 * time.Second).WithPolling(interval).Should(Succeed())

	// The dispatcher's part: take what was queued and acknowledge it.
	take := func(stream string, want int) []string {
		c, err := testJS.Consumer(ctx, stream, consumer)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(c.CachedInfo().Paused).To(BeFalse())
		batch, err := c.Fetch(want, jetstream.FetchMaxWait(5*time.Second))
		g.Expect(err).NotTo(HaveOccurred())
		var subjects []string
		for m := range batch.Messages() {
			subjects = append(subjects, m.Subject())
			g.Expect(m.DoubleAck(ctx)).To(Succeed())
		}
		g.Expect(batch.Error()).NotTo(HaveOccurred())
		return subjects
	}
	g.Expect(take(set.DeliveriesStream(), 2)).To(ConsistOf(set.DeliverySubject("orders.v1"), HavePrefix(strings.TrimSuffix(set.RetryFilter("orders.v1"), ">"))))
	g.Expect(take(set.EventsStream(), 1)).To(HaveLen(1))

	g.Eventually(func(g Gomega) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orders.v1"}, &v1alpha1.WebhookEndpoint{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	for _, stream := range []string{set.EventsStream(), set.DeliveriesStream()} {
		g.Expect(consumerNames(g, stream)).NotTo(ContainElement(consumer))
	}
	g.Eventually(func(g Gomega) {
		g.Expect(eventReasons(g, ns, "orders.v1")).To(ContainElement("ConsumersDeleted"))
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.DedicatedDispatcher("orders.v1")}, &appsv1.Deployment{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "its dispatcher is left: %v", err)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(pendingOn(g, ns, set.QueueSubject("other"))).To(BeEquivalentTo(1))
	g.Expect(consumerNames(g, set.DeliveriesStream())).To(ContainElement(set.QueueConsumer()))

	// The last endpoint (of the shared lane) goes once the shared lane's dispatcher settled
	// what was queued for it and the events stored before its deletion (here the test, as the
	// dispatcher would), and takes the shared lane's consumers with it.
	for _, sc := range [][2]string{{set.DeliveriesStream(), set.QueueConsumer()}, {set.EventsStream(), streams.IntakeConsumer(ns)}} {
		c, err := testJS.Consumer(ctx, sc[0], sc[1])
		g.Expect(err).NotTo(HaveOccurred())
		batch, err := c.Fetch(10, jetstream.FetchMaxWait(2*time.Second))
		g.Expect(err).NotTo(HaveOccurred())
		for m := range batch.Messages() {
			g.Expect(m.DoubleAck(ctx)).To(Succeed())
		}
	}
	g.Expect(k8s.Delete(ctx, endpoint(ns, "other"))).To(Succeed())
	expectNoDispatcherLeft(t, ns)
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
	g.Expect(consumerExists(g, layout.For(ns).DeliveriesStream(), layout.For(ns).QueueConsumer())).To(BeTrue())
	g.Eventually(func(g Gomega) {
		g.Expect(consumerExists(g, layout.For(other).EventsStream(), streams.IntakeConsumer(other))).To(BeTrue())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
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
	g.Expect(consumerExists(g, layout.For(ns).DeliveriesStream(), layout.For(ns).QueueConsumer())).To(BeTrue())
}
