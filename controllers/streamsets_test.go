package controllers_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/gomega"
	gomegatypes "github.com/onsi/gomega/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/names"
)

// streamsOf reports which of namespace ns's streams (and its bucket's stream) exist.
func streamsOf(g Gomega, ns string) map[string]bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	set := layout.For(ns)
	out := map[string]bool{}
	for _, name := range append(set.Streams(), "KV_"+set.Bucket()) {
		_, err := testJS.Stream(ctx, name)
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			g.Expect(err).NotTo(HaveOccurred())
		}
		out[name] = err == nil
	}
	return out
}

func allStreams(exist bool) gomegatypes.GomegaMatcher {
	return WithTransform(func(m map[string]bool) []bool {
		var out []bool
		for _, v := range m {
			out = append(out, v)
		}
		return out
	}, HaveEach(exist))
}

// deadLetterCount counts the messages of ns's dead-letter stream.
func deadLetterCount(g Gomega, ns string) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := testJS.Stream(ctx, layout.For(ns).DeadLetterStream())
	g.Expect(err).NotTo(HaveOccurred())
	return s.CachedInfo().State.Msgs
}

func streamsConfigMap(g Gomega, ns string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{}
	g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: names.StreamsConfigMap}, cm)).To(Succeed())
	return cm
}

func expectGone(g Gomega, obj interface {
	GetNamespace() string
	GetName() string
}, into *corev1.ConfigMap) {
	err := k8s.Get(context.Background(), types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}, into)
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "still there: %v", err)
}

// A namespace's streams and bucket come with its first endpoint, bounded as configured, with
// the labelled ConfigMap that stands for them; they are not removed with the last endpoint (the
// log and dead letters stay readable). Deleting the ConfigMap of a namespace without endpoints
// removes them, so an endpoint created there later starts from empty streams. A ConfigMap
// deleted while endpoints live is created again and the streams are kept.
func TestNamespaceStreamsLifecycle(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	g.Expect(streamsOf(g, ns)).To(allStreams(false))
	create(t, endpoint(ns, "orders"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "orders", "True/Ready")
	g.Expect(streamsOf(g, ns)).To(allStreams(true))

	cm := streamsConfigMap(g, ns)
	g.Expect(cm.Labels).To(HaveKeyWithValue(names.LabelManagedBy, names.LabelManagedByValue))
	g.Expect(cm.Finalizers).To(ContainElement(controllers.StreamsFinalizer))
	g.Expect(cm.Data).To(HaveKeyWithValue("eventsStream", "WEBHOOKS_"+ns))
	g.Expect(cm.Data).To(HaveKeyWithValue("bucket", "webhook-operator-"+ns))
	for _, want := range []struct {
		stream string
		bytes  int64
	}{
		{layout.For(ns).EventsStream(), layout.EventsMaxBytes},
		{layout.For(ns).AttemptsStream(), layout.AttemptsMaxBytes},
		{layout.For(ns).DeadLetterStream(), layout.DeadLetterMaxBytes},
	} {
		s, err := testJS.Stream(ctx, want.stream)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(s.CachedInfo().Config.MaxBytes).To(Equal(want.bytes), want.stream)
	}

	// A dead letter of the old tenant.
	_, err := testJS.Publish(ctx, layout.For(ns).DeadLetterSubject("orders", "whdl_old"), []byte("old tenant"))
	g.Expect(err).NotTo(HaveOccurred())

	// The ConfigMap deleted while the endpoint lives: streams kept, ConfigMap created again.
	g.Expect(k8s.Delete(ctx, cm)).To(Succeed())
	g.Eventually(func(g Gomega) {
		again := streamsConfigMap(g, ns)
		g.Expect(again.UID).NotTo(Equal(cm.UID))
		g.Expect(again.DeletionTimestamp.IsZero()).To(BeTrue())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(deadLetterCount(g, ns)).To(BeEquivalentTo(1))

	// The last endpoint goes; the streams stay.
	g.Expect(k8s.Delete(ctx, endpoint(ns, "orders"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orders"}, &v1alpha1.WebhookEndpoint{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(streamsOf(g, ns)).To(allStreams(true))
	g.Expect(deadLetterCount(g, ns)).To(BeEquivalentTo(1))

	// Deleting the ConfigMap of a namespace without endpoints removes the streams and bucket.
	g.Expect(k8s.Delete(ctx, streamsConfigMap(g, ns))).To(Succeed())
	g.Eventually(func(g Gomega) {
		expectGone(g, cm, &corev1.ConfigMap{})
		g.Expect(streamsOf(g, ns)).To(allStreams(false))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	// A new endpoint there starts from empty streams. (The old endpoint's generated signing
	// Secret goes with it, as the garbage collector, which envtest does not run, would do.)
	g.Expect(k8s.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orders-signing"}})).To(Succeed())
	create(t, endpoint(ns, "orders"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "orders", "True/Ready")
	g.Expect(streamsOf(g, ns)).To(allStreams(true))
	g.Expect(deadLetterCount(g, ns)).To(BeZero())
	streamsConfigMap(g, ns)
}

// A namespace being deleted takes its streams and bucket with it, once its endpoints are gone.
// envtest runs no namespace controller, so a deleted namespace stays Terminating for ever; the
// test does what that controller does: it deletes the namespace's objects, the streams
// ConfigMap before the endpoints.
func TestNamespaceDeletionRemovesItsStreams(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "orders"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "orders", "True/Ready")
	publishQueued(t, ns, "orders", "evt_pending")

	g.Expect(k8s.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	cm := streamsConfigMap(g, ns)
	g.Expect(k8s.Delete(ctx, cm)).To(Succeed())
	// The endpoint lives on for now: the streams wait for it (its pending delivery is moved to
	// the dead-letter stream when it goes).
	g.Consistently(func(g Gomega) {
		g.Expect(streamsOf(g, ns)).To(allStreams(true))
		g.Expect(streamsConfigMap(g, ns).DeletionTimestamp.IsZero()).To(BeFalse())
	}).WithTimeout(3 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

	g.Expect(k8s.Delete(ctx, endpoint(ns, "orders"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orders"}, &v1alpha1.WebhookEndpoint{})
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
		expectGone(g, cm, &corev1.ConfigMap{})
		g.Expect(streamsOf(g, ns)).To(allStreams(false))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// A stream of an earlier layout that captures the namespace's events (the shared WEBHOOKS
// stream of v1alpha1's first releases captured webhooks.>) keeps the namespace's streams from
// being created: Ready says which stream and what to do, and the endpoint is wired once it is
// gone.
func TestLegacyStreamConflictIsReported(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	// Only this namespace's subjects, so that the suite's other namespaces are not disturbed.
	legacy := "LEGACY_" + strings.ReplaceAll(ns, "-", "_")
	_, err := testJS.CreateStream(ctx, jetstream.StreamConfig{Name: legacy, Subjects: []string{"webhooks." + ns + ".>"}})
	g.Expect(err).NotTo(HaveOccurred())
	create(t, endpoint(ns, "orders"))
	markAvailable(t, ns, "webhook-dispatcher")
	ep := eventuallyReady(t, ns, "orders", "False/"+v1alpha1.ReasonNATSUnavailable)
	g.Eventually(func(g Gomega) {
		ep = getEndpoint(g, ns, "orders")
		msg := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady).Message
		g.Expect(msg).To(ContainSubstring("stream WEBHOOKS_" + ns + " cannot be created: stream " + legacy + " already captures"))
		g.Expect(msg).To(ContainSubstring("nats stream rm " + legacy))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	g.Expect(testJS.DeleteStream(ctx, legacy)).To(Succeed())
	eventuallyReady(t, ns, "orders", "True/Ready")
}
