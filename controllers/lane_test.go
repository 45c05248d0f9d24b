package controllers_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// An endpoint with consumers of its own (an earlier version made them) joins the shared lane
// only once every pod of its dispatcher is of this version. Until then a dispatcher of the
// earlier version delivers whatever those consumers hold, and a shared lane delivering the
// same events would send them twice (make test-cluster's upgrade step counted up to 86 of 600
// while the dispatchers rolled). So status.sharedSince stays unset and the consumers are
// listed as draining while the Deployment has not rolled out, or a pod of the earlier template
// is still stopping; once it has, the endpoint joins the shared lane, and the consumers, which
// hold nothing, go.
func TestAnEndpointLeavesConsumersOfItsOwnOnceItsDispatcherRolledOut(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	set := layout.For(ns)

	// The namespace's dispatcher exists (another endpoint made it) and has not rolled out:
	// envtest runs no deployment controller, so its status is empty.
	create(t, endpoint(ns, "first"))
	dep := &appsv1.Deployment{}
	g.Eventually(func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, dep)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(dep.Spec.Template.Annotations).To(HaveKeyWithValue(names.AnnotationSharedLane, names.AnnotationSharedLaneValue))

	// orders' consumers of its own, as an earlier version made them.
	g.Expect(set.Ensure(ctx, testJS)).To(Succeed())
	opts := streams.EndpointConsumerOptions{MaxInFlight: 10, Timeout: 10 * time.Second}
	g.Expect(set.EnsureDeliveriesConsumer(ctx, testJS, "orders", opts)).To(Succeed())
	g.Expect(set.EnsureEventsConsumer(ctx, testJS, ns, "orders", []string{"order.*"}, opts, streams.ConsumerStart{Time: time.Now()})).To(Succeed())
	own := []string{
		set.DeliveriesStream() + "/" + set.EndpointConsumer("orders"),
		set.EventsStream() + "/" + streams.EndpointConsumerOf(ns, "orders"),
	}
	create(t, endpoint(ns, "orders"))

	waiting := func(why string) {
		t.Helper()
		g.Eventually(func(g Gomega) {
			ep := getEndpoint(g, ns, "orders")
			g.Expect(ep.Status.Lane).To(Equal("Shared"))
			g.Expect(ep.Status.DrainingConsumers).To(ConsistOf(own))
		}).WithTimeout(timeout).WithPolling(interval).Should(Succeed(), why)
		g.Consistently(func(g Gomega) {
			ep := getEndpoint(g, ns, "orders")
			g.Expect(ep.Status.SharedSince).To(BeNil(), "joined the shared lane while %s", why)
			g.Expect(ep.Status.DrainingConsumers).To(ConsistOf(own))
			for _, c := range []string{set.EndpointConsumer("orders"), streams.EndpointConsumerOf(ns, "orders")} {
				stream := set.DeliveriesStream()
				if c != set.EndpointConsumer("orders") {
					stream = set.EventsStream()
				}
				g.Expect(consumerExists(g, stream, c)).To(BeTrue(), "%s went while %s", c, why)
			}
		}).WithTimeout(3*time.Second).WithPolling(interval).Should(Succeed(), why)
	}
	waiting("the dispatcher has not rolled out")

	// Rolled out, but a pod of the earlier template is still stopping (available changes,
	// so the endpoint is reconciled again).
	g.Eventually(func() error {
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, d); err != nil {
			return err
		}
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1,
			ReadyReplicas: 1, AvailableReplicas: 1, TerminatingReplicas: ptr(int32(1))}
		return k8s.Status().Update(ctx, d)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	waiting("a pod of the earlier template is stopping")

	markAvailable(t, ns, "webhook-dispatcher")
	g.Eventually(func(g Gomega) {
		ep := getEndpoint(g, ns, "orders")
		g.Expect(ep.Status.SharedSince).NotTo(BeNil())
		g.Expect(ep.Status.SharedSince.Time).To(BeTemporally(">", ep.CreationTimestamp.Time.Add(5*time.Second)), "joins the shared lane once rolled out, not at its creation")
		g.Expect(ep.Status.DrainingConsumers).To(BeEmpty())
		g.Expect(consumerExists(g, set.DeliveriesStream(), set.EndpointConsumer("orders"))).To(BeFalse())
		g.Expect(consumerExists(g, set.EventsStream(), streams.EndpointConsumerOf(ns, "orders"))).To(BeFalse())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// The moment an endpoint with consumers of its own joins the shared lane is a whole second:
// the status keeps whole seconds, and the namespace's intake consumer starts exactly there, so
// the events stored in that second's fraction are the intake's or the own consumers', never
// neither's (make test-cluster's upgrade step lost 7 of 600 that way).
func TestTheIntakeStartsWhereAnEndpointJoinedTheSharedLane(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	set := layout.For(ns)
	g.Expect(set.Ensure(ctx, testJS)).To(Succeed())
	opts := streams.EndpointConsumerOptions{MaxInFlight: 10, Timeout: 10 * time.Second}
	g.Expect(set.EnsureDeliveriesConsumer(ctx, testJS, "orders", opts)).To(Succeed())
	g.Expect(set.EnsureEventsConsumer(ctx, testJS, ns, "orders", []string{"order.*"}, opts, streams.ConsumerStart{Time: time.Now()})).To(Succeed())
	// The first endpoint of its namespace: no dispatcher runs yet, so it joins at once.
	create(t, endpoint(ns, "orders"))
	var since time.Time
	g.Eventually(func(g Gomega) {
		ep := getEndpoint(g, ns, "orders")
		g.Expect(ep.Status.SharedSince).NotTo(BeNil())
		since = ep.Status.SharedSince.Time
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	intake, err := testJS.Consumer(ctx, set.EventsStream(), streams.IntakeConsumer(ns))
	g.Expect(err).NotTo(HaveOccurred())
	start := intake.CachedInfo().Config.OptStartTime
	g.Expect(start).NotTo(BeNil())
	g.Expect(start.Equal(since)).To(BeTrue(), "the intake starts at %s, the endpoint joined at %s", start, since)
}
