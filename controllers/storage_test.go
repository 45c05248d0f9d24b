package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// storageOf is the endpoint's StorageLimitReached condition as "Status/Reason", or "".
func storageOf(ep *v1alpha1.WebhookEndpoint) string {
	c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionStorageLimitReached)
	if c == nil {
		return ""
	}
	return string(c.Status) + "/" + c.Reason
}

// A full dead-letter stream shows on every endpoint of its namespace as StorageLimitReached
// True, naming the stream, what happens now and the installation's flag, while Ready stays
// True; once the stream is purged the condition turns False again.
func TestStorageLimitReachedFollowsTheDeadLetterStream(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "orders"))
	create(t, endpoint(ns, "billing"))
	markAvailable(t, ns, "webhook-dispatcher")
	for _, name := range []string{"orders", "billing"} {
		eventuallyReady(t, ns, name, "True/Ready")
	}
	eventuallyStorage := func(want string) {
		t.Helper()
		eventuallyStorageOf(t, ns, want, "a full dead-letter stream is a warning, not a reason for Ready False", "orders", "billing")
	}
	eventuallyStorage("False/" + v1alpha1.ReasonWithinLimits)

	set := opts.Config.Streams.For(ns)
	limit := opts.Config.Streams.DeadLetterMaxBytes
	// Large dead letters (below the server's 1 MB payload limit) fill the default 64 MiB bound
	// in about 130 writes.
	body := []byte(strings.Repeat("x", 512<<10))
	refused := false
	for i := 0; i < int(limit)/len(body)+16 && !refused; i++ {
		_, err := testJS.Publish(ctx, set.DeadLetterSubject("orders", fmt.Sprintf("whdl_%d", i)), body)
		refused = err != nil
	}
	g.Expect(refused).To(BeTrue(), "the dead-letter stream (%d bytes) refused no dead letter", limit)

	eventuallyStorage("True/" + v1alpha1.ReasonDeadLetterStreamFull)
	c := meta.FindStatusCondition(getEndpoint(g, ns, "billing").Status.Conditions, v1alpha1.ConditionStorageLimitReached)
	for _, want := range []string{set.DeadLetterStream(), resource.NewQuantity(limit, resource.BinarySI).String(), "New dead letters are refused", "stays queued", "kubectl webhooks replay", "--dead-letter-max-bytes"} {
		g.Expect(c.Message).To(ContainSubstring(want))
	}
	g.Expect(c.Status).To(Equal(metav1.ConditionTrue))

	s, err := testJS.Stream(ctx, set.DeadLetterStream())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.Purge(ctx)).To(Succeed())
	eventuallyStorage("False/" + v1alpha1.ReasonWithinLimits)
}

// A deliveries stream at its hold threshold (80% of its bound, here a WebhookQuota's, with
// which the stream must still be created) shows on every endpoint of its namespace as
// StorageLimitReached True DeliveriesStreamFull, naming the stream, that held events wait in
// the events stream and the quota to raise, while Ready stays True; the quota says
// LimitReached; once the stream empties the condition turns False again.
func TestStorageLimitReachedFollowsTheDeliveriesStream(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	bound := resource.MustParse("64Ki")
	readyUnderQuota(t, ns, v1alpha1.StorageQuota{Deliveries: &bound}, "orders", "billing")
	set := opts.Config.Streams.For(ns)
	g.Eventually(func(g Gomega) {
		s, err := testJS.Stream(ctx, set.DeliveriesStream())
		g.Expect(err).NotTo(HaveOccurred())
		c := s.CachedInfo().Config
		g.Expect(c.MaxBytes).To(Equal(bound.Value()))
		g.Expect(c.Discard).To(Equal(jetstream.DiscardOld), "nats-server refuses DiscardNew with message schedules")
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	eventuallyStorage := func(want string) {
		t.Helper()
		eventuallyStorageOf(t, ns, want, "a full deliveries stream is a warning, not a reason for Ready False", "orders", "billing")
	}
	eventuallyStorage("False/" + v1alpha1.ReasonWithinLimits)

	// Held copies of 1 KiB up to just below the threshold leave the condition False; the one
	// that crosses it turns it True.
	body := make([]byte, 1<<10)
	s, err := testJS.Stream(ctx, set.DeliveriesStream())
	g.Expect(err).NotTo(HaveOccurred())
	threshold := uint64(bound.Value()) * streams.DeliveriesHoldPercent / 100
	n := 0
	bytes := func() uint64 {
		info, err := s.Info(ctx)
		g.Expect(err).NotTo(HaveOccurred())
		return info.State.Bytes
	}
	for bytes()+2<<10 < threshold {
		_, err := testJS.Publish(ctx, set.DeliverySubject("orders"), body)
		g.Expect(err).NotTo(HaveOccurred())
		n++
	}
	g.Consistently(func(g Gomega) {
		g.Expect(storageOf(getEndpoint(g, ns, "orders"))).To(Equal("False/" + v1alpha1.ReasonWithinLimits))
	}).WithTimeout(3 * time.Second).WithPolling(interval).Should(Succeed())
	for bytes() < threshold {
		_, err := testJS.Publish(ctx, set.DeliverySubject("orders"), body)
		g.Expect(err).NotTo(HaveOccurred())
		n++
	}
	t.Logf("%d copies of 1 KiB: %d of %d bytes", n, bytes(), bound.Value())

	eventuallyStorage("True/" + v1alpha1.ReasonDeliveriesStreamFull)
	c := meta.FindStatusCondition(getEndpoint(g, ns, "billing").Status.Conditions, v1alpha1.ConditionStorageLimitReached)
	for _, want := range []string{set.DeliveriesStream(), "64Ki", "events stream", "none is dropped", "spec.storage.deliveries"} {
		g.Expect(c.Message).To(ContainSubstring(want))
	}
	eventuallyQuotaStorageLimit(t, ns, set.DeliveriesStream())

	g.Expect(s.Purge(ctx)).To(Succeed())
	eventuallyStorage("False/" + v1alpha1.ReasonWithinLimits)
}

// readyUnderQuota creates namespace ns's WebhookQuota with storage bounds and the endpoints,
// and waits until they are Ready.
func readyUnderQuota(t *testing.T, ns string, storage v1alpha1.StorageQuota, endpoints ...string) {
	t.Helper()
	create(t, &v1alpha1.WebhookQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.QuotaName},
		Spec: v1alpha1.WebhookQuotaSpec{Storage: &storage}})
	for _, name := range endpoints {
		create(t, endpoint(ns, name))
	}
	markAvailable(t, ns, names.SharedDispatcher)
	for _, name := range endpoints {
		eventuallyReady(t, ns, name, "True/Ready")
	}
}

// eventuallyStorageOf waits until each endpoint's StorageLimitReached reads want while Ready
// stays True (why says why it must).
func eventuallyStorageOf(t *testing.T, ns, want, why string, endpoints ...string) {
	t.Helper()
	g := NewWithT(t)
	for _, name := range endpoints {
		g.Eventually(func(g Gomega) {
			ep := getEndpoint(g, ns, name)
			g.Expect(storageOf(ep)).To(Equal(want), "conditions of %s/%s: %+v", ns, name, ep.Status.Conditions)
			g.Expect(readyOf(ep)).To(Equal("True/Ready"), why)
		}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	}
}

// eventuallyQuotaStorageLimit waits until namespace ns's quota says LimitReached True
// StorageLimit, naming stream.
func eventuallyQuotaStorageLimit(t *testing.T, ns, stream string) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		q := &v1alpha1.WebhookQuota{}
		g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: v1alpha1.QuotaName}, q)).To(Succeed())
		c := meta.FindStatusCondition(q.Status.Conditions, v1alpha1.ConditionLimitReached)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(v1alpha1.ReasonStorageLimit))
		g.Expect(c.Message).To(ContainSubstring(stream))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// A namespace whose stream bounds do not fit in the NATS servers' storage (its WebhookQuota
// asks for an events stream larger than the test server's max_file_store of 256 GiB) shows on
// its endpoints as Ready False InsufficientStorage, saying what to raise or lower, not as NATS
// being unavailable; once the bound fits, the streams are made and the endpoint turns Ready.
func TestStreamBoundsBeyondTheServersStorageSayWhatToChange(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	huge := resource.MustParse("512Gi")
	create(t, &v1alpha1.WebhookQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.QuotaName},
		Spec: v1alpha1.WebhookQuotaSpec{Storage: &v1alpha1.StorageQuota{Events: &huge}}})
	create(t, endpoint(ns, "orders"))
	ep := eventuallyReady(t, ns, "orders", "False/"+v1alpha1.ReasonInsufficientStorage)
	msg := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady).Message
	for _, want := range []string{"namespace " + ns, "max_file_store", "WebhookQuota spec.storage", "insufficient storage"} {
		g.Expect(msg).To(ContainSubstring(want))
	}

	// The bound lowered: the streams are made and the endpoint turns Ready.
	g.Eventually(func(g Gomega) {
		q := &v1alpha1.WebhookQuota{}
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.QuotaName}, q)).To(Succeed())
		small := resource.MustParse("1Mi")
		q.Spec.Storage.Events = &small
		g.Expect(k8s.Update(ctx, q)).To(Succeed())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	markAvailable(t, ns, names.SharedDispatcher)
	eventuallyReady(t, ns, "orders", "True/Ready")
	s, err := testJS.Stream(ctx, opts.Config.Streams.For(ns).EventsStream())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.CachedInfo().Config.MaxBytes).To(Equal(int64(1 << 20)))
}

// A WebhookQuota raised beyond what the NATS servers' storage can reserve says so on its Ready
// condition (InsufficientStorage, what to change) while the namespace's streams keep their
// bounds and its endpoints stay Ready; lowered again, it is Applied.
func TestAQuotaRaisedBeyondTheServersStorageSaysWhatToChange(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	small := resource.MustParse("1Mi")
	readyUnderQuota(t, ns, v1alpha1.StorageQuota{Events: &small}, "orders")
	setEvents := func(q resource.Quantity) {
		t.Helper()
		g.Eventually(func(g Gomega) {
			quo := &v1alpha1.WebhookQuota{}
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.QuotaName}, quo)).To(Succeed())
			quo.Spec.Storage.Events = &q
			g.Expect(k8s.Update(ctx, quo)).To(Succeed())
		}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	}
	quotaReady := func(reason string, says ...string) {
		t.Helper()
		g.Eventually(func(g Gomega) {
			quo := &v1alpha1.WebhookQuota{}
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: v1alpha1.QuotaName}, quo)).To(Succeed())
			c := meta.FindStatusCondition(quo.Status.Conditions, v1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(reason), c.Message)
			for _, s := range says {
				g.Expect(c.Message).To(ContainSubstring(s))
			}
		}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	}
	eventsBound := func() int64 {
		t.Helper()
		s, err := testJS.Stream(ctx, opts.Config.Streams.For(ns).EventsStream())
		g.Expect(err).NotTo(HaveOccurred())
		return s.CachedInfo().Config.MaxBytes
	}

	setEvents(resource.MustParse("512Gi"))
	quotaReady(v1alpha1.ReasonInsufficientStorage, "max_file_store", "namespace "+ns)
	g.Expect(eventsBound()).To(Equal(int64(1<<20)), "the stream keeps the bound it had")
	eventuallyReady(t, ns, "orders", "True/Ready")

	setEvents(resource.MustParse("2Mi"))
	quotaReady(v1alpha1.ReasonApplied)
	g.Eventually(eventsBound).WithTimeout(timeout).WithPolling(interval).Should(Equal(int64(2 << 20)))
}
