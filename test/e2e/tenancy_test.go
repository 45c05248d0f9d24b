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

	"github.com/webhook-operator/webhook-operator/internal/records"
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
	// The namespace's intake consumer exists once the controller wired the endpoint: events
	// from then on are its.
	testenv.Eventually(t, 120*time.Second, func() error {
		_, err := adminJS.Consumer(context.Background(), set.EventsStream(), streams.IntakeConsumer(ns))
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
		info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(set.WaitingFilter("orders")))
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

// A producer of the namespace (its ServiceAccount bound to the shipped producer role, through
// the auth callout) publishes an event carrying the operator's delivery headers, as issue 20
// found one could: a delivery id, an event id, three attempts made, a test mark and a replay
// pointer. NATS permissions cannot filter on headers, so the server takes the event; the
// dispatcher takes it as an event. The receiver gets it under its own id as attempt 1, then,
// failed once, as attempt 2 (a retry, not a test delivery's dead letter), never as a replay,
// and the delivery log names the delivery the event makes.
func TestProducerCannotForgeDeliveryHeaders(t *testing.T) {
	ctx := context.Background()
	const ns, id = "e2e-forge", "forge_evt_1"
	u := newUser(t, ns)
	rcv := u.receiver("orders")
	rcv.SetResponder(func(r testenv.Request) testenv.Response {
		if r.Attempt == 1 {
			return testenv.Response{Status: 503, Body: "first attempts fail"}
		}
		return testenv.Response{}
	})
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: thrice}
spec:
  schedule: [0s, 1s, 1s]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: orders}
spec:
  url: %s
  eventTypes: [order.*]
  retryPolicyRef: {name: thrice}
`, rcv.URL()))
	u.waitReady("orders")

	producer, err := stack.Producer(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := connectAs(producer, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.close()
	js, err := jetstream.New(pc.nc)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(streams.DefaultConfig().For(ns).EventSubject("order.created"))
	msg.Header.Set(records.HeaderMsgID, id)
	for k, v := range map[string]string{records.HDeliveryID: "whdl_f", records.HEventID: "forged", records.HAttempts: "3",
		records.HTest: "true", records.HReplayOf: "whdl_forged"} {
		msg.Header.Set(k, v)
	}
	msg.Data = []byte(`{"order_id":"ord_1"}`)
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("the producer's publish: %v", err)
	}

	want := records.DeliveryID(id, ns, "orders")
	testenv.Eventually(t, 60*time.Second, func() error {
		var p page[logEntry]
		u.json(&p, "kubectl", "webhooks", "log", "orders")
		for _, e := range p.Data {
			if e.ID == want && e.Status == records.StateSucceeded {
				if e.EventID != id || e.Attempts != 2 || e.Test || e.ReplayOfID != "" {
					t.Errorf("the delivery log's entry %+v: want event %s delivered at attempt 2, no test, no replay", e, id)
				}
				return nil
			}
		}
		return fmt.Errorf("the log has no successful delivery %s: %+v (receiver %+v)", want, p.Data, rcv.Stats())
	}, "")
	var attempts []int
	for _, r := range rcv.Requests() {
		if r.ID != id {
			t.Errorf("the receiver got webhook-id %q (attempt %d), want %s", r.ID, r.Attempt, id)
		}
		if v := r.Header.Get(records.SendReplayOf); v != "" {
			t.Errorf("the receiver got webhook-replay-of %q", v)
		}
		for k := range r.Header {
			if strings.HasPrefix(strings.ToLower(k), "whk-") {
				t.Errorf("the receiver got the operator's header %s", k)
			}
		}
		attempts = append(attempts, r.Attempt)
	}
	if fmt.Sprint(attempts) != "[1 2]" {
		t.Errorf("the receiver got attempts %v, want [1 2]", attempts)
	}
	var dls page[deadLetter]
	u.json(&dls, "kubectl", "webhooks", "dlq", "list", "orders")
	if len(dls.Data) != 0 {
		t.Errorf("dead letters: %+v", dls.Data)
	}
}
