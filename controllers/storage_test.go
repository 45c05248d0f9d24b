package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
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
		for _, name := range []string{"orders", "billing"} {
			g.Eventually(func(g Gomega) {
				ep := getEndpoint(g, ns, name)
				g.Expect(storageOf(ep)).To(Equal(want), "conditions of %s/%s: %+v", ns, name, ep.Status.Conditions)
				g.Expect(readyOf(ep)).To(Equal("True/Ready"), "a full dead-letter stream is a warning, not a reason for Ready False")
			}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
		}
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
