package dispatcher

import (
	"encoding/json"
	"runtime"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// A dispatcher's cached endpoint keeps what it reads (the lane, secretsVersion, the Ready
// condition's reason, its own health and conditions, the re-enable annotation) and drops the
// rest of the controller's status and what the API server adds.
func TestTheCachedEndpointKeepsWhatTheDispatcherReads(t *testing.T) {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cond := func(typ, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: msg, ObservedGeneration: 3, LastTransitionTime: now}
	}
	ep := &v1alpha1.WebhookEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "shop", Generation: 3,
			Annotations:   map[string]string{v1alpha1.AnnotationEnable: "2026-12-07T00:00:00Z", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: v1alpha1.WebhookEndpointSpec{URL: "https://example.com/hooks"},
		Status: v1alpha1.WebhookEndpointStatus{
			ObservedGeneration: 3, SigningSecretName: "orders-signing", SecretsVersion: "abc", RetryPolicyName: "default",
			DeliverySubject: "webhooks.deliveries.shop.orders", ConsumerName: "ep-orders", Lane: "Shared", SharedSince: &now,
			DrainingConsumers: []string{"events/ep-orders"}, Dispatcher: &v1alpha1.DispatcherStatus{Name: "webhook-dispatcher", Replicas: 2},
			Health: &v1alpha1.DeliveryHealth{Delivered: 7, CircuitState: v1alpha1.CircuitClosed},
			Conditions: []metav1.Condition{
				cond(v1alpha1.ConditionReady, v1alpha1.ReasonQuotaExceeded, "the namespace's quota holds it back"),
				cond(v1alpha1.ConditionStorageLimitReached, "Full", "the delivery log is full"),
				cond(v1alpha1.ConditionCircuitOpen, v1alpha1.ReasonCircuitOpen, "opened at ..."),
				cond(v1alpha1.ConditionDisabled, v1alpha1.ReasonEnabled, "deliveries are attempted"),
			},
		},
	}
	out, err := keepReadStatus(ep)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*v1alpha1.WebhookEndpoint)
	st := got.Status
	if st.SecretsVersion != "abc" || st.Lane != "Shared" || !st.SharedSince.Equal(&now) || len(st.DrainingConsumers) != 1 ||
		st.Health == nil || st.Health.Delivered != 7 || got.Spec.URL == "" || got.Annotations[v1alpha1.AnnotationEnable] == "" {
		t.Errorf("what the dispatcher reads was dropped: %+v", got)
	}
	if st.SigningSecretName != "" || st.RetryPolicyName != "" || st.DeliverySubject != "" || st.ConsumerName != "" ||
		st.Dispatcher != nil || st.ObservedGeneration != 0 || got.ManagedFields != nil || len(got.Annotations) != 1 {
		t.Errorf("what the dispatcher does not read is kept: %+v", got)
	}
	if len(st.Conditions) != 3 || meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionStorageLimitReached) != nil {
		t.Fatalf("conditions kept: %+v", st.Conditions)
	}
	if r := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); r.Reason != v1alpha1.ReasonQuotaExceeded || r.Status != metav1.ConditionTrue || r.Message != "" {
		t.Errorf("the Ready condition kept: %+v", r)
	}
	for _, typ := range []string{v1alpha1.ConditionCircuitOpen, v1alpha1.ConditionDisabled} {
		if c := meta.FindStatusCondition(st.Conditions, typ); c == nil || c.Message == "" || !c.LastTransitionTime.Equal(&now) || c.ObservedGeneration != 3 {
			t.Errorf("the dispatcher's own condition %s is not kept whole (its status writer compares it): %+v", typ, c)
		}
	}
}

// BenchmarkCachedEndpointBytes is the heap one cached WebhookEndpoint holds in a dispatcher,
// decoded from the JSON of an endpoint as an installation has it (the controller's status of a
// Ready endpoint, the dispatcher's health and conditions): as decoded (what the informer kept
// before keepReadStatus) and as cached now.
//
//	go test ./dispatcher -run '^$' -bench CachedEndpointBytes -benchtime 1x
func BenchmarkCachedEndpointBytes(b *testing.B) {
	raw := []byte(`{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookEndpoint","metadata":{"name":"e000499","namespace":"se-0004","uid":"67bd0555-b8d8-46b1-938d-1ba3dbe61757","resourceVersion":"4684","generation":1,"creationTimestamp":"2026-12-07T00:27:48Z","finalizers":["webhook-operator.io/finalizer"]},` +
		`"spec":{"url":"http://127.0.0.1:40123/hooks/e000499","eventTypes":["e000499.>"],"maxInFlight":50,"ordering":{"mode":"BestEffort"},"timeout":"10s"},` +
		`"status":{"observedGeneration":1,"signingSecretName":"e000499-signing","secretsVersion":"3f2a9c41d07be615","retryPolicyName":"default","deliverySubject":"webhooks.deliveries.se-0004.e000499","consumerName":"intake-se-0004","lane":"Shared","sharedSince":"2026-12-07T00:28:26Z",` +
		`"dispatcher":{"name":"webhook-dispatcher","replicas":1,"availableReplicas":1},` +
		`"health":{"attempts":0,"circuitState":"Closed","consecutiveFailures":0,"deadLettered":0,"delivered":0,"failures":0,"filtered":0,"pending":0,"updatedAt":"2026-12-07T00:28:30Z","window":"1h0m0s"},` +
		`"conditions":[{"type":"Ready","status":"True","reason":"Ready","observedGeneration":1,"lastTransitionTime":"2026-12-07T00:28:26Z","message":"consumer intake-se-0004 delivers webhooks.deliveries.se-0004.e000499 through Deployment webhook-dispatcher (1/1 available)"},` +
		`{"type":"StorageLimitReached","status":"False","reason":"WithinLimits","observedGeneration":1,"lastTransitionTime":"2026-12-07T00:28:26Z","message":"dead-letter stream webhooks-se-0004-dead-letters (limit 1.0 GiB), deliveries stream webhooks-se-0004-deliveries (limit 1.0 GiB) and delivery log webhooks-se-0004-attempts (limit 1.0 GiB) have room"},` +
		`{"type":"CircuitOpen","status":"False","reason":"Closed","observedGeneration":1,"lastTransitionTime":"2026-12-07T00:28:30Z","message":"the circuit is closed"},` +
		`{"type":"Disabled","status":"False","reason":"Enabled","observedGeneration":1,"lastTransitionTime":"2026-12-07T00:28:30Z","message":"deliveries are attempted"}]}}`)
	const n = 2000
	measure := func(transform func(any) (any, error)) float64 {
		kept := make([]any, n)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range kept {
			ep := &v1alpha1.WebhookEndpoint{}
			if err := json.Unmarshal(raw, ep); err != nil {
				b.Fatal(err)
			}
			o, err := transform(ep)
			if err != nil {
				b.Fatal(err)
			}
			kept[i] = o
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(kept)
		return float64(after.HeapAlloc-before.HeapAlloc) / n
	}
	for range b.N {
		b.ReportMetric(measure(func(o any) (any, error) { return o, nil }), "B/endpoint-as-decoded")
		b.ReportMetric(measure(keepReadStatus), "B/endpoint-as-cached")
	}
}
