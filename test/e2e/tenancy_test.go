package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// The exfiltration endpoint of issue 13 on the real stack, where the dispatcher runs as its
// ServiceAccount with the Role the controller wrote: an endpoint whose header comes from a
// Secret that does not consent to it (a tenant's Secret that consents to another endpoint
// only, or the signing Secret the operator generated for another endpoint) is refused, with
// the reason in `kubectl get whe`, and its receiver never gets a request, while the namespace's
// consenting endpoint, served by the same dispatcher, gets every event with its header.
func TestExfiltrationEndpointRefused(t *testing.T) {
	u := newUser(t, "e2e-leak")
	good, err := testenv.NewReceiver(testenv.ReceiverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	leak, err := testenv.NewReceiver(testenv.ReceiverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer leak.Close()
	const token = "Bearer crm-0nly-t0ken-s3cret"
	u.apply(fmt.Sprintf(`
apiVersion: v1
kind: Secret
metadata: {name: crm-token, annotations: {webhook-operator.io/allowed-endpoints: crm}}
stringData: {token: %q}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: crm}
spec:
  url: %[2]s
  eventTypes: [order.*]
  headersFrom: [{name: Authorization, secretKeyRef: {name: crm-token, key: token}}]
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: leak}
spec:
  url: %[3]s
  eventTypes: [order.*]
  headersFrom: [{name: X-Leak, secretKeyRef: {name: crm-token, key: token}}]
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: leak-signing}
spec:
  url: %[3]s
  eventTypes: [order.*]
  headersFrom: [{name: X-Leak, secretKeyRef: {name: crm-signing, key: secret}}]
`, token, good.URL(), leak.URL()))
	u.waitReady("crm")
	u.must(nil, "kubectl", "wait", "--timeout=120s", `--for=jsonpath={.status.conditions[?(@.type=="Ready")].reason}=SecretNotAllowed`, "whe/leak", "whe/leak-signing")
	for ep, why := range map[string]string{
		"leak":         "Secret e2e-leak/crm-token (spec.headersFrom[X-Leak]) does not consent to endpoint leak",
		"leak-signing": "Secret e2e-leak/crm-signing (spec.headersFrom[X-Leak]) is an object the operator manages",
	} {
		msg := u.must(nil, "kubectl", "get", "whe", ep, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)
		if !strings.Contains(msg, why) {
			t.Errorf("%s: Ready message %q, want %q", ep, msg, why)
		}
	}

	ids := []string{"leak_evt_1", "leak_evt_2", "leak_evt_3"}
	for _, id := range ids {
		u.publish("order.created", id, `{"order_id":"ord_1"}`)
	}
	receive(t, good, ids...)
	for _, r := range good.Requests() {
		if got := r.Header.Get("Authorization"); got != token {
			t.Errorf("crm's request %s has Authorization %q", r.ID, got)
		}
	}
	// The same dispatcher routed the same events for the refused endpoints: nothing reached
	// their receiver, so neither Secret's value left the cluster.
	if n := len(leak.Requests()); n != 0 {
		t.Fatalf("the refused endpoints' receiver got %d requests (X-Leak %q)", n, leak.Requests()[0].Header.Get("X-Leak"))
	}
}
