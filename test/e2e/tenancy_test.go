package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/client-go/kubernetes"

	"github.com/webhook-operator/webhook-operator/internal/streams"
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

// A viewer reads the delivery log while the namespace's deliveries stream holds deliveries
// (here those of a suspended endpoint, which holds them there): exactly when the log is needed.
func TestViewerReadsTheLogOfHeldDeliveries(t *testing.T) {
	const ns = "e2e-held"
	u := newUser(t, ns)
	rcv := u.receiver("orders")
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: orders}
spec:
  url: %s
  eventTypes: [order.*]
  suspend: true
`, rcv.URL()))
	admin, adminJS, err := stack.ConnectAdmin(nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	set := streams.DefaultConfig().For(ns)
	// The endpoint's consumer exists once the controller wired it: events from then on are its.
	testenv.Eventually(t, 120*time.Second, func() error {
		_, err := adminJS.Consumer(context.Background(), set.EventsStream(), set.EndpointConsumer("orders"))
		return err
	}, "")
	ids := []string{"held_1", "held_2", "held_3"}
	for _, id := range ids {
		u.publish("order.created", id, `{"order_id":"ord_1"}`)
	}
	testenv.Eventually(t, 90*time.Second, func() error {
		st, err := adminJS.Stream(context.Background(), set.DeliveriesStream())
		if err != nil {
			return err
		}
		info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(set.DeliverySubject("orders")))
		if err != nil {
			return err
		}
		if info.State.Msgs < uint64(len(ids)) {
			return fmt.Errorf("the deliveries stream holds %d of orders' %d events", info.State.Msgs, len(ids))
		}
		return nil
	}, "")

	cs := kubernetes.NewForConfigOrDie(stack.ControlPlane.Config)
	grant(t, cs, ns, "viewer", "webhook-operator-viewer")
	r := pluginAs(t, tokenKubeconfig(t, cs, ns, "viewer"), ns, "log", "orders", "-o", "json")
	if r.code != 0 {
		t.Fatalf("kubectl webhooks log orders as a viewer: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var got page[logEntry]
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	listed := map[string]bool{}
	for _, e := range got.Data {
		listed[e.EventID] = true
	}
	for _, id := range ids {
		if !listed[id] {
			t.Errorf("the log does not list the held %s: %s", id, r.stdout)
		}
	}
	if n := len(rcv.Requests()); n != 0 {
		t.Errorf("the suspended endpoint's receiver got %d requests", n)
	}
}
