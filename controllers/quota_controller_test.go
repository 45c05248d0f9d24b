package controllers_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

func quotaOf(ep *v1alpha1.WebhookEndpoint) string {
	c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionQuotaLimitReached)
	if c == nil {
		return ""
	}
	return string(c.Status) + "/" + c.Reason
}

func i32(v int32) *int32 { return &v }

// A namespace's WebhookQuota holds back, by creation order, the endpoints beyond its count
// (not Ready, QuotaExceeded, no consumer), a dedicated dispatcher beyond its count (no
// Deployment), bounds the namespace's streams, reports usage; lowered, it pauses the consumers
// of the endpoints it no longer admits; deleted, everything is as without it.
func TestWebhookQuotaHoldsBackWhatIsBeyondItsLimits(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	dlqBound := resource.MustParse("64Ki")
	q := &v1alpha1.WebhookQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.QuotaName},
		Spec: v1alpha1.WebhookQuotaSpec{MaxEndpoints: i32(2), DedicatedDispatchers: &v1alpha1.DedicatedDispatcherQuota{Max: i32(0)},
			Storage: &v1alpha1.StorageQuota{DeadLetters: &dlqBound}}}
	create(t, q)
	for _, name := range []string{"a", "b", "c"} {
		create(t, endpoint(ns, name))
	}
	markAvailable(t, ns, names.SharedDispatcher)
	eventuallyReady(t, ns, "a", "True/Ready")
	eventuallyReady(t, ns, "b", "True/Ready")
	c := eventuallyReady(t, ns, "c", "False/"+v1alpha1.ReasonQuotaExceeded)
	g.Expect(quotaOf(c)).To(Equal("True/" + v1alpha1.ReasonEndpointLimit))
	g.Expect(meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConditionReady).Message).To(ContainSubstring("spec.maxEndpoints"))
	g.Expect(quotaOf(getEndpoint(g, ns, "a"))).To(Equal("False/" + v1alpha1.ReasonWithinQuota))
	set := layout.For(ns)
	g.Expect(consumerExists(g, set.EventsStream(), set.EndpointConsumer("c"))).To(BeFalse(), "an endpoint held back got a consumer")

	// The streams carry the quota's bound.
	g.Eventually(func(g Gomega) {
		s, err := testJS.Stream(ctx, set.DeadLetterStream())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.CachedInfo().Config.MaxBytes).To(Equal(dlqBound.Value()))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	// Room for c, not for a dedicated dispatcher.
	g.Eventually(func() error {
		cur := &v1alpha1.WebhookQuota{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.QuotaName}, cur); err != nil {
			return err
		}
		cur.Spec.MaxEndpoints = i32(5)
		return k8s.Update(ctx, cur)
	}).WithTimeout(timeout).Should(Succeed())
	eventuallyReady(t, ns, "c", "True/Ready")
	create(t, endpoint(ns, "d", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true} }))
	d := eventuallyReady(t, ns, "d", "False/"+v1alpha1.ReasonQuotaExceeded)
	g.Expect(quotaOf(d)).To(Equal("True/" + v1alpha1.ReasonDedicatedDispatcherLimit))
	g.Consistently(func() bool {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.Dispatcher(d)}, &appsv1.Deployment{})
		return apierrors.IsNotFound(err)
	}).WithTimeout(2*interval*10).Should(BeTrue(), "a dedicated dispatcher the quota does not allow was made")

	g.Eventually(func(g Gomega) {
		cur := &v1alpha1.WebhookQuota{}
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.QuotaName}, cur)).To(Succeed())
		st := cur.Status
		g.Expect(st.Endpoints).NotTo(BeNil())
		g.Expect(st.Endpoints.Used).To(Equal(int64(3)))
		g.Expect(*st.Endpoints.Limit).To(Equal(int64(5)))
		g.Expect(st.DeliveriesInFlight.Used).To(Equal(int64(150)))
		g.Expect(st.HeldBack).To(HaveLen(1))
		g.Expect(st.HeldBack[0].Endpoint).To(Equal("d"))
		g.Expect(meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionLimitReached)).To(BeTrue())
		g.Expect(meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionReady)).To(BeTrue(), "%+v", st.Conditions)
		g.Expect(st.Storage).NotTo(BeNil())
		g.Expect(st.Storage.DeadLetters.Limit.Value()).To(Equal(dlqBound.Value()))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	// The same figures in the controller's /metrics.
	for _, want := range []quotaSeries{
		{"webhook_quota_limit", "resource", "endpoints", 5},
		{"webhook_quota_used", "resource", "endpoints", 3},
		{"webhook_quota_limit", "resource", "dedicated_dispatchers", 0},
		{"webhook_quota_used", "resource", "deliveries_in_flight", 150},
		{"webhook_quota_limit", "resource", "storage_dead_letters", float64(dlqBound.Value())},
		{"webhook_quota_held_back_endpoints", "reason", v1alpha1.ReasonDedicatedDispatcherLimit, 1},
		{"webhook_quota_held_back_endpoints", "reason", v1alpha1.ReasonEndpointLimit, 0},
	} {
		testenv.Eventually(t, timeout, func() bool { v, ok := quotaGauge(t, ns, want); return ok && v == want.value },
			"%s{%s=%q} of namespace %s is not %v", want.name, want.label, want.labelValue, ns, want.value)
	}

	// Lowered below what is used: the newest endpoints are held back, their consumers paused.
	g.Eventually(func() error {
		cur := &v1alpha1.WebhookQuota{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.QuotaName}, cur); err != nil {
			return err
		}
		cur.Spec.MaxEndpoints = i32(1)
		return k8s.Update(ctx, cur)
	}).WithTimeout(timeout).Should(Succeed())
	eventuallyReady(t, ns, "a", "True/Ready")
	eventuallyReady(t, ns, "b", "False/"+v1alpha1.ReasonQuotaExceeded)
	eventuallyReady(t, ns, "c", "False/"+v1alpha1.ReasonQuotaExceeded)
	// b rides the shared lane: it has no consumer of its own to pause; its dispatcher holds
	// what arrives for it while its Ready condition says QuotaExceeded, as for a suspended one.
	for _, stream := range []string{set.EventsStream(), set.DeliveriesStream()} {
		g.Expect(consumerExists(g, stream, set.EndpointConsumer("b"))).To(BeFalse(), "b has a consumer of its own on %s", stream)
	}

	// Without the quota: every endpoint is admitted again, its consumers resumed, the
	// installation's bounds back, and the quota's condition gone.
	g.Expect(k8s.Delete(ctx, q)).To(Succeed())
	for _, name := range []string{"a", "b", "c"} {
		ep := eventuallyReady(t, ns, name, "True/Ready")
		g.Eventually(func(g Gomega) {
			g.Expect(quotaOf(getEndpoint(g, ns, ep.Name))).To(BeEmpty())
		}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	}
	g.Eventually(func(g Gomega) {
		s, err := testJS.Stream(ctx, set.DeadLetterStream())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.CachedInfo().Config.MaxBytes).To(Equal(opts.Config.Streams.DeadLetterMaxBytes))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	markAvailable(t, ns, names.Dispatcher(d))
	eventuallyReady(t, ns, "d", "True/Ready")
	// Without a quota, the namespace has no quota series.
	testenv.Eventually(t, timeout, func() bool {
		_, ok := quotaGauge(t, ns, quotaSeries{"webhook_quota_used", "resource", "endpoints", 0})
		return !ok
	}, "namespace %s still has quota series without its quota", ns)
}

// Without a WebhookQuota the installation's bound on endpoints per namespace
// (--max-endpoints-per-namespace) holds as a quota's maxEndpoints does: the newest endpoint
// beyond it is Ready False QuotaExceeded, says which flag bounds it and gets no consumer, the
// earlier ones are served; deleting an earlier one admits it.
func TestInstallationBoundsEndpointsWithoutAQuota(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	bound := int(opts.MaxEndpointsPerNamespace)
	g.Expect(bound).To(BeNumerically(">", 0))
	name := func(i int) string { return fmt.Sprintf("e%03d", i) }
	for i := range bound + 1 {
		create(t, endpoint(ns, name(i)))
	}
	markAvailable(t, ns, names.SharedDispatcher)
	last := name(bound)
	held := eventuallyReady(t, ns, last, "False/"+v1alpha1.ReasonQuotaExceeded)
	g.Expect(quotaOf(held)).To(Equal("True/" + v1alpha1.ReasonEndpointLimit))
	g.Expect(meta.FindStatusCondition(held.Status.Conditions, v1alpha1.ConditionReady).Message).To(
		ContainSubstring(fmt.Sprintf("the installation allows %d endpoints per namespace (--max-endpoints-per-namespace)", bound)))
	g.Expect(held.Status.Lane).To(BeEmpty(), "an endpoint held back joined the shared lane")
	first := eventuallyReady(t, ns, name(0), "True/Ready")
	g.Expect(quotaOf(first)).To(BeEmpty(), "an admitted endpoint without a quota has no quota condition")

	g.Expect(k8s.Delete(ctx, endpoint(ns, name(0)))).To(Succeed())
	eventuallyReady(t, ns, last, "True/Ready")
	g.Eventually(func(g Gomega) {
		g.Expect(quotaOf(getEndpoint(g, ns, last))).To(BeEmpty())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(getEndpoint(g, ns, last).Status.Lane).To(Equal("Shared"))
}

// quotaSeries is one gauge of the quota metrics of a namespace.
type quotaSeries struct {
	name, label, labelValue string
	value                   float64
}

// quotaGauge reads a quota gauge of namespace ns from the controller's metrics registry.
func quotaGauge(t *testing.T, ns string, s quotaSeries) (float64, bool) {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != s.name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == ns && labels[s.label] == s.labelValue {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// A dead-letter stream full at the quota's bound raises StorageLimitReached on the endpoints
// (naming the quota as what to raise) and LimitReached on the quota.
func TestWebhookQuotaStorageBoundRaisesTheConditions(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	bound := resource.MustParse("64Ki")
	readyUnderQuota(t, ns, v1alpha1.StorageQuota{DeadLetters: &bound}, "orders")
	set := layout.For(ns)
	g.Eventually(func(g Gomega) {
		s, err := testJS.Stream(ctx, set.DeadLetterStream())
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.CachedInfo().Config.MaxBytes).To(Equal(bound.Value()))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	body := make([]byte, 1<<10)
	refused := false
	for i := 0; i < 100 && !refused; i++ {
		_, err := testJS.Publish(ctx, set.DeadLetterSubject("orders", fmt.Sprintf("whdl_%d", i)), body)
		refused = err != nil
	}
	g.Expect(refused).To(BeTrue(), "the dead-letter stream refused nothing beyond its %s bound", bound.String())
	g.Eventually(func(g Gomega) {
		ep := getEndpoint(g, ns, "orders")
		g.Expect(storageOf(ep)).To(Equal("True/" + v1alpha1.ReasonDeadLetterStreamFull))
		c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionStorageLimitReached)
		g.Expect(c.Message).To(ContainSubstring("WebhookQuota"))
		g.Expect(c.Message).To(ContainSubstring("spec.storage.deadLetters"))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	eventuallyQuotaStorageLimit(t, ns, set.DeadLetterStream())
}

// A quota's deliveries bound lowered below what the stream holds loses nothing: the stream
// keeps a bound that holds it (it discards its oldest beyond its bound), and gets the quota's
// once it has drained.
func TestLoweredQuotaDeliveriesBoundLosesNothing(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	bound := resource.MustParse("64Ki")
	readyUnderQuota(t, ns, v1alpha1.StorageQuota{Deliveries: &bound}, "orders")
	set := layout.For(ns)
	maxBytes := func(g Gomega) (int64, jetstream.StreamState) {
		s, err := testJS.Stream(ctx, set.DeliveriesStream())
		g.Expect(err).NotTo(HaveOccurred())
		return s.CachedInfo().Config.MaxBytes, s.CachedInfo().State
	}
	g.Eventually(func(g Gomega) {
		b, _ := maxBytes(g)
		g.Expect(b).To(Equal(bound.Value()))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	body := make([]byte, 1<<10)
	for range 40 {
		_, err := testJS.Publish(ctx, set.DeliverySubject("orders"), body)
		g.Expect(err).NotTo(HaveOccurred())
	}
	lowered := resource.MustParse("16Ki")
	g.Eventually(func(g Gomega) {
		q := &v1alpha1.WebhookQuota{}
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.QuotaName}, q)).To(Succeed())
		q.Spec.Storage.Deliveries = &lowered
		g.Expect(k8s.Update(ctx, q)).To(Succeed())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	// The quota reconciler updates the stream: its bound comes down, not below what it holds.
	g.Eventually(func(g Gomega) {
		b, st := maxBytes(g)
		g.Expect(b).To(BeNumerically("<", bound.Value()))
		g.Expect(b).To(BeNumerically(">", int64(st.Bytes)))
		g.Expect(st.Msgs).To(BeEquivalentTo(40))
		g.Expect(st.FirstSeq).To(BeEquivalentTo(1))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	s, err := testJS.Stream(ctx, set.DeliveriesStream())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.Purge(ctx)).To(Succeed())
	g.Eventually(func(g Gomega) {
		b, _ := maxBytes(g)
		g.Expect(b).To(Equal(lowered.Value()))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}
