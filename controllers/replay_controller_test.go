package controllers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// replayWorld is a namespace with one endpoint whose streams the controller created, and
// what the dispatcher would have stored in them.
type replayWorld struct {
	t  *testing.T
	ns string
	testenv.Stored
}

func newReplayWorld(t *testing.T, endpoints ...string) *replayWorld {
	t.Helper()
	ns := newNamespace(t)
	for _, ep := range endpoints {
		create(t, endpoint(ns, ep))
	}
	for _, ep := range endpoints {
		// Wired up to the dispatcher: the namespace's streams and the consumer exist.
		eventuallyReady(t, ns, ep, "False/"+v1alpha1.ReasonDispatcherUnavailable)
	}
	return &replayWorld{t: t, ns: ns, Stored: testenv.Stored{T: t, JS: testJS, Set: layout.For(ns)}}
}

// deadLetters dead-letters n deliveries of ep (reason), and returns their delivery ids.
func (w *replayWorld) deadLetters(ep string, n int, reason string) []string {
	at := time.Now().Add(-time.Hour).UTC()
	var ids []string
	for i := range n {
		m := w.Delivery(ep, fmt.Sprintf("evt_%s_%s_%d", ep, reason, i), uint64(i+1), at)
		ids = append(ids, w.DeadLetter(m, 3, reason, fmt.Sprintf(`{"n":%d}`, i), at, nil).DeliveryID)
	}
	return ids
}

// replays are the replayed deliveries waiting on ep's subject: original delivery id to count.
func (w *replayWorld) replays(ep string) map[string]int {
	out := map[string]int{}
	for _, m := range w.Msgs(w.Set.DeliveriesStream(), w.Set.WaitingFilter(ep)) {
		out[records.ParseDeliveryMeta(m.Header).ReplayOf]++
	}
	return out
}

func (w *replayWorld) replay(name string, change ...func(*v1alpha1.WebhookReplay)) *v1alpha1.WebhookReplay {
	wr := &v1alpha1.WebhookReplay{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name},
		Spec: v1alpha1.WebhookReplaySpec{EndpointRef: v1alpha1.LocalObjectReference{Name: "crm"}}}
	for _, c := range change {
		c(wr)
	}
	return wr
}

// conditionOf is a condition of a replay as "Status/Reason", or "".
func conditionOf(wr *v1alpha1.WebhookReplay, typ string) string {
	c := meta.FindStatusCondition(wr.Status.Conditions, typ)
	if c == nil {
		return ""
	}
	return string(c.Status) + "/" + c.Reason
}

// eventuallyComplete waits until the replay's Complete condition is want for its generation.
func eventuallyComplete(t *testing.T, ns, name, want string) *v1alpha1.WebhookReplay {
	t.Helper()
	wr := &v1alpha1.WebhookReplay{}
	NewWithT(t).Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, wr)).To(Succeed())
		g.Expect(conditionOf(wr, v1alpha1.ConditionComplete)).To(Equal(want), "Complete of %s/%s: %+v", ns, name, wr.Status)
		g.Expect(wr.Status.ObservedGeneration).To(Equal(wr.Generation))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	return wr
}

// applyYAML server-side applies a manifest as kubectl apply --server-side would.
func applyYAML(t *testing.T, ns, doc string) {
	t.Helper()
	u := &unstructured.Unstructured{}
	NewWithT(t).Expect(u.UnmarshalJSON([]byte(doc))).To(Succeed())
	u.SetNamespace(ns)
	NewWithT(t).Expect(k8s.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("kubectl"), client.ForceOwnership)).To(Succeed())
}

// A WebhookReplay applied twice replays each dead letter of its endpoint once and reports
// Complete with its counts; created again under the same name (its idempotency key) it
// replays nothing new; deleting one deletes no delivery.
func TestWebhookReplayAppliedTwiceReplaysOnce(t *testing.T) {
	w := newReplayWorld(t, "crm", "orders")
	ids := w.deadLetters("crm", 5, records.ReasonExhausted)
	w.deadLetters("orders", 2, records.ReasonExhausted)
	doc := `{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookReplay","metadata":{"name":"fix-1"},"spec":{"endpointRef":{"name":"crm"}}}`
	applyYAML(t, w.ns, doc)
	applyYAML(t, w.ns, doc)

	wr := eventuallyComplete(t, w.ns, "fix-1", "True/"+v1alpha1.ReasonReplayed)
	g := NewWithT(t)
	g.Expect(wr.Status.Selected).To(BeEquivalentTo(5))
	g.Expect(wr.Status.Replayed).To(BeEquivalentTo(5))
	g.Expect(wr.Status.Skipped + wr.Status.Failed).To(BeZero())
	g.Expect(conditionOf(wr, v1alpha1.ConditionReady)).To(Equal("True/" + v1alpha1.ReasonReplayed))
	g.Expect(meta.FindStatusCondition(wr.Status.Conditions, v1alpha1.ConditionReconciling)).To(BeNil())
	g.Expect(wr.Status.CompletedAt).NotTo(BeNil())
	got := w.replays("crm")
	g.Expect(got).To(HaveLen(5))
	for _, id := range ids {
		g.Expect(got[id]).To(Equal(1), "replays of %s", id)
	}
	g.Expect(w.replays("orders")).To(BeEmpty(), "a replay targets its endpoint only")
	expectHealth(t, w.ns, "fix-1", &v1alpha1.WebhookReplay{}, status.CurrentStatus, "Healthy")
	// Its completion is announced once as an operational event in the namespace's events.
	completed := w.Msgs(w.Set.EventsStream(), w.Set.EventSubject(records.OpsReplayCompleted))
	g.Expect(completed).To(HaveLen(1))
	var ev records.OpsEvent
	g.Expect(json.Unmarshal(completed[0].Data, &ev)).To(Succeed())
	g.Expect(ev.Data).To(And(HaveKeyWithValue("replay", "fix-1"), HaveKeyWithValue("replayed", BeNumerically("==", 5))))

	// Applied again once complete: nothing changes.
	applyYAML(t, w.ns, doc)
	g.Consistently(func() map[string]int { return w.replays("crm") }).WithTimeout(time.Second).WithPolling(100 * time.Millisecond).Should(HaveLen(5))

	// Deleted: its deliveries stay. Created again with the same name: every one is skipped.
	g.Expect(k8s.Delete(context.Background(), wr)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(context.Background(), client.ObjectKeyFromObject(wr), &v1alpha1.WebhookReplay{}))
	}).WithTimeout(timeout).Should(BeTrue())
	g.Expect(w.replays("crm")).To(HaveLen(5))
	applyYAML(t, w.ns, doc)
	wr = eventuallyComplete(t, w.ns, "fix-1", "True/"+v1alpha1.ReasonReplayed)
	g.Expect([]int64{wr.Status.Selected, wr.Status.Replayed, wr.Status.Skipped}).To(Equal([]int64{5, 0, 5}))
	g.Expect(w.replays("crm")).To(Equal(got))

	// Another name, only one reason: those dead letters only.
	disabled := w.deadLetters("crm", 2, records.ReasonEndpointDisabled)
	create(t, w.replay("fix-2", func(wr *v1alpha1.WebhookReplay) {
		wr.Spec.Reasons = []v1alpha1.DeadLetterReason{records.ReasonEndpointDisabled}
	}))
	wr = eventuallyComplete(t, w.ns, "fix-2", "True/"+v1alpha1.ReasonReplayed)
	g.Expect([]int64{wr.Status.Selected, wr.Status.Replayed}).To(Equal([]int64{2, 2}))
	got = w.replays("crm")
	g.Expect(got).To(HaveLen(7))
	g.Expect(got[disabled[0]] + got[disabled[1]]).To(Equal(2))
}

// A replay with a rate creates at most that many deliveries per batch: watching every write of
// its status shows the counts grow by the rate (the time between batches is not asserted).
func TestWebhookReplayHonoursItsRateInBatches(t *testing.T) {
	w := newReplayWorld(t, "crm")
	w.deadLetters("crm", 7, records.ReasonExhausted)
	wc, err := client.NewWithWatch(cp.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	seen := func(name string, rate *int32) []int64 {
		watcher, err := wc.Watch(ctx, &v1alpha1.WebhookReplayList{}, client.InNamespace(w.ns),
			client.MatchingFields{"metadata.name": name})
		if err != nil {
			t.Fatal(err)
		}
		defer watcher.Stop()
		create(t, w.replay(name, func(wr *v1alpha1.WebhookReplay) { wr.Spec.RatePerSecond = rate }))
		var counts []int64
		for ev := range watcher.ResultChan() {
			if ev.Type == watch.Error {
				t.Fatalf("watch: %v", ev.Object)
			}
			wr := ev.Object.(*v1alpha1.WebhookReplay)
			if n := wr.Status.Replayed; len(counts) == 0 || counts[len(counts)-1] != n {
				counts = append(counts, n)
			}
			if meta.IsStatusConditionTrue(wr.Status.Conditions, v1alpha1.ConditionComplete) {
				return counts
			}
		}
		t.Fatalf("the watch ended before %s completed: %v", name, counts)
		return nil
	}
	if got := seen("slow", ptr(int32(3))); fmt.Sprint(got) != "[0 3 6 7]" {
		t.Errorf("replayed counts seen with ratePerSecond 3: %v, want [0 3 6 7]", got)
	}
	if got := seen("fast", nil); fmt.Sprint(got) != "[0 7]" {
		t.Errorf("replayed counts seen without a rate: %v, want [0 7]", got)
	}
}

// A replay to a disabled endpoint is refused with the reason on the resource (Stalled: kstatus
// Failed, Argo CD Degraded) and creates nothing; once a person re-enables the endpoint it
// proceeds and completes.
func TestWebhookReplayIsRefusedWhileTheEndpointIsDisabled(t *testing.T) {
	w := newReplayWorld(t, "crm")
	w.deadLetters("crm", 3, records.ReasonEndpointDisabled)
	setDisabled(t, w.ns, "crm", true)
	create(t, w.replay("after-fix"))

	wr := eventuallyComplete(t, w.ns, "after-fix", "False/"+v1alpha1.ReasonEndpointDisabled)
	g := NewWithT(t)
	g.Expect(conditionOf(wr, v1alpha1.ConditionStalled)).To(Equal("True/" + v1alpha1.ReasonEndpointDisabled))
	g.Expect(meta.FindStatusCondition(wr.Status.Conditions, v1alpha1.ConditionComplete).Message).To(And(
		ContainSubstring("is disabled since"), ContainSubstring("kubectl webhooks enable crm"), ContainSubstring("proceeds then")))
	expectHealth(t, w.ns, "after-fix", &v1alpha1.WebhookReplay{}, status.FailedStatus, "Degraded")
	g.Expect(w.replays("crm")).To(BeEmpty())

	setDisabled(t, w.ns, "crm", false)
	wr = eventuallyComplete(t, w.ns, "after-fix", "True/"+v1alpha1.ReasonReplayed)
	g.Expect(wr.Status.Replayed).To(BeEquivalentTo(3))
	g.Expect(meta.FindStatusCondition(wr.Status.Conditions, v1alpha1.ConditionStalled)).To(BeNil())
	g.Expect(w.replays("crm")).To(HaveLen(3))
}

// A completed replay is deleted once its TTL has passed; its deliveries stay.
func TestCompletedWebhookReplaysAreGarbageCollected(t *testing.T) {
	w := newReplayWorld(t, "crm")
	w.deadLetters("crm", 2, records.ReasonExhausted)
	create(t, w.replay("short-lived", func(wr *v1alpha1.WebhookReplay) {
		wr.Annotations = map[string]string{v1alpha1.AnnotationTTLAfterComplete: "1s"}
	}))
	create(t, w.replay("kept", func(wr *v1alpha1.WebhookReplay) {
		wr.Annotations = map[string]string{v1alpha1.AnnotationTTLAfterComplete: "1h"}
	}))
	eventuallyComplete(t, w.ns, "kept", "True/"+v1alpha1.ReasonReplayed)
	g := NewWithT(t)
	g.Eventually(func() bool {
		err := k8s.Get(context.Background(), types.NamespacedName{Namespace: w.ns, Name: "short-lived"}, &v1alpha1.WebhookReplay{})
		return apierrors.IsNotFound(err)
	}).WithTimeout(timeout).WithPolling(interval).Should(BeTrue(), "the completed replay is deleted after its TTL")
	g.Expect(w.replays("crm")).To(And(HaveLen(2), HaveEach(2)), "the deliveries of both replays stay (two names: two replays of each)")
	g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: w.ns, Name: "kept"}, &v1alpha1.WebhookReplay{})).To(Succeed())
}

// setDisabled sets or clears the endpoint's Disabled condition as the dispatcher does (its own
// field manager).
func setDisabled(t *testing.T, ns, name string, disabled bool) {
	t.Helper()
	st, reason := "False", v1alpha1.ReasonEnabled
	if disabled {
		st, reason = "True", v1alpha1.ReasonConsecutiveFailures
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("WebhookEndpoint"))
	u.SetNamespace(ns)
	u.SetName(name)
	NewWithT(t).Expect(unstructured.SetNestedSlice(u.Object, []any{map[string]any{
		"type": v1alpha1.ConditionDisabled, "status": st, "reason": reason,
		"message": "10 consecutive failed attempts", "lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
	}}, "status", "conditions")).To(Succeed())
	NewWithT(t).Expect(k8s.Status().Apply(context.Background(), client.ApplyConfigurationFromUnstructured(u),
		client.FieldOwner(dispatcher.FieldManager), client.ForceOwnership)).To(Succeed())
}
