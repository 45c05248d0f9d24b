package e2e

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestDeliveryWalkthrough: apply an endpoint with a signing Secret, wait until Ready, publish,
// and follow the deliveries with status and a paged delivery log; the receiver verifies every
// signature and gets every matching event once.
func TestDeliveryWalkthrough(t *testing.T) {
	u := newUser(t, "e2e-deliver")
	rcv, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: testenv.SecretKey(stack.Client, u.ns, "shop-signing", "secret")})
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	u.apply(fmt.Sprintf(`
apiVersion: v1
kind: Secret
metadata: {name: shop-signing}
stringData: {secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: shop}
spec:
  url: %s
  eventTypes: [order.*]
  signing: {secretRef: {name: shop-signing, key: secret}}
`, rcv.URL()))
	u.waitReady("shop")

	var ids []string
	for i := 1; i <= 7; i++ {
		id := fmt.Sprintf("ord_evt_%d", i)
		ids = append(ids, id)
		u.publish("order.created", id, fmt.Sprintf(`{"order_id":"ord_%d","total":%d}`, i, 10*i))
	}
	// Publishing an event id again is de-duplicated by JetStream.
	again := u.run(nil, "kubectl", "webhooks", "publish", "order.created", "--id", "ord_evt_1", "--data", `{"order_id":"ord_1","total":10}`)
	if again.code != 0 || !strings.Contains(again.stdout, "duplicate") {
		t.Errorf("publishing ord_evt_1 again: exit %d, %q; want a reported duplicate", again.code, again.stdout+again.stderr)
	}
	// An event type the endpoint does not want.
	u.publish("user.created", "user_evt_1", `{"user_id":"u_1"}`)

	receive(t, rcv, ids...)
	st := rcv.Stats()
	if st.BadSignatures != 0 {
		t.Errorf("%d requests had a bad signature", st.BadSignatures)
	}
	if rcv.Count("user_evt_1") != 0 {
		t.Error("an event of a type the endpoint does not subscribe to was delivered")
	}
	if n := rcv.Count("ord_evt_1"); n != 1 {
		t.Errorf("ord_evt_1, published twice, was delivered %d times", n)
	}
	if body := string(rcv.Body("ord_evt_3")); !strings.Contains(body, `"ord_3"`) {
		t.Errorf("ord_evt_3 arrived as %q", body)
	}

	// The dispatcher reports health on the endpoint at a bounded rate.
	testenv.Eventually(t, 60*time.Second, func() error {
		var s endpointStatus
		u.json(&s, "kubectl", "webhooks", "status", "shop")
		if s.State != "Active" || s.Delivered != int64(len(ids)) || s.Pending != 0 {
			return fmt.Errorf("status %+v, want Active with %d delivered and none pending", s, len(ids))
		}
		return nil
	}, "")
	table := u.must(nil, "kubectl", "get", "whe", "shop")
	if !strings.Contains(table, "100.0%") || !strings.Contains(table, "True") {
		t.Errorf("kubectl get whe shows no full success:\n%s", table)
	}

	t.Run("the delivery log pages with --status, --limit and --after", func(t *testing.T) {
		var seen []string
		after := ""
		pages := 0
		for {
			args := []string{"webhooks", "log", "shop", "--status", "succeeded", "--limit", "3"}
			if after != "" {
				args = append(args, "--after", after)
			}
			var p page[logEntry]
			u.json(&p, "kubectl", args...)
			pages++
			for _, e := range p.Data {
				if e.Status != "succeeded" || e.Attempts != 1 {
					t.Errorf("entry %+v: want succeeded at the first attempt", e)
				}
				seen = append(seen, e.EventID)
			}
			if !p.HasMore {
				break
			}
			if p.NextCursor == "" || pages > 5 {
				t.Fatalf("page %d: hasMore without a usable cursor (%q)", pages, p.NextCursor)
			}
			after = p.NextCursor
		}
		sort.Strings(seen)
		if pages != 3 || !slices.Equal(seen, ids) {
			t.Errorf("%d pages of %v, want 3 pages of %v", pages, seen, ids)
		}
		// Newest first, and the table says how to go on.
		text := u.must(nil, "kubectl", "webhooks", "log", "shop", "--limit", "2")
		if !strings.Contains(text, "succeeded") || !strings.Contains(text, "order.created") {
			t.Errorf("log table:\n%s", text)
		}
		if !strings.Contains(text, "--after") {
			t.Errorf("the log table does not say how to see more:\n%s", text)
		}
		var pending page[logEntry]
		u.json(&pending, "kubectl", "webhooks", "log", "shop", "--status", "pending")
		if len(pending.Data) != 0 {
			t.Errorf("pending deliveries left: %+v", pending.Data)
		}
	})

	t.Run("a one-shot test delivery reaches this endpoint and is reported", func(t *testing.T) {
		var res struct {
			EventID string `json:"eventId"`
			Outcome struct {
				State string `json:"state"`
				Test  bool   `json:"test"`
			} `json:"outcome"`
		}
		u.json(&res, "kubectl", "webhooks", "test", "shop", "--type", "order.created", "--data", `{"order_id":"ord_test"}`, "--wait")
		if res.Outcome.State != "succeeded" || !res.Outcome.Test || rcv.Count(res.EventID) != 1 {
			t.Errorf("test delivery %+v; the receiver got it %d times", res, rcv.Count(res.EventID))
		}
		if st := rcv.Stats(); st.BadSignatures != 0 {
			t.Errorf("%d requests had a bad signature", st.BadSignatures)
		}
	})
}

// TestDeadLettersAndReplay: a failing receiver turns deliveries into dead letters; dlq list and
// show describe them; once the receiver works, a replay delivers, and an idempotency key used
// twice makes one delivery.
func TestDeadLettersAndReplay(t *testing.T) {
	u := newUser(t, "e2e-dlq")
	rcv, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: testenv.SecretKey(stack.Client, u.ns, "billing-signing", "secret")})
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	rcv.SetResponder(testenv.Failing)
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: twice}
spec:
  schedule: [0s, 1s]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: billing}
spec:
  url: %s
  eventTypes: [invoice.>]
  retryPolicyRef: {name: twice}
`, rcv.URL()))
	u.waitReady("billing")
	events := []string{"inv_evt_1", "inv_evt_2", "inv_evt_3"}
	for i, id := range events {
		u.publish("invoice.issued", id, fmt.Sprintf(`{"invoice":"in_%d"}`, i+1))
	}

	byEvent := map[string]deadLetter{}
	testenv.Eventually(t, 60*time.Second, func() error {
		var p page[deadLetter]
		u.json(&p, "kubectl", "webhooks", "dlq", "list", "billing")
		for _, d := range p.Data {
			byEvent[d.EventID] = d
		}
		if len(byEvent) != len(events) {
			return fmt.Errorf("%d dead letters of %d", len(byEvent), len(events))
		}
		return nil
	}, "")
	for _, id := range events {
		d := byEvent[id]
		if d.Reason != "exhausted" || len(d.Attempts) != 2 {
			t.Errorf("dead letter of %s: reason %q after %d attempts, want exhausted after 2", id, d.Reason, len(d.Attempts))
		}
	}
	if st := rcv.Stats(); st.Refused < 2*len(events) || st.BadSignatures != 0 {
		t.Errorf("receiver stats %+v: want every attempt signed, %d refused", st, 2*len(events))
	}

	first := byEvent["inv_evt_1"].DeliveryID
	var shown deadLetter
	u.json(&shown, "kubectl", "webhooks", "dlq", "show", first)
	if shown.EventID != "inv_evt_1" || shown.LastResponse == nil || shown.LastResponse.StatusCode != 503 ||
		!strings.Contains(shown.LastResponse.Body, "failing on purpose") || !strings.Contains(string(shown.Payload), "in_1") {
		t.Errorf("dlq show %s: %+v", first, shown)
	}
	text := u.must(nil, "kubectl", "webhooks", "dlq", "show", first)
	for _, want := range []string{"exhausted", "503", "inv_evt_1", "kubectl webhooks replay billing --id " + first} {
		if !strings.Contains(text, want) {
			t.Errorf("dlq show does not mention %q:\n%s", want, text)
		}
	}
	if r := u.run(nil, "kubectl", "webhooks", "dlq", "show", "whdl_00000000000000000000000000"); r.code != 4 {
		t.Errorf("dlq show of an unknown id: exit %d, want 4 (not found)", r.code)
	}

	rcv.SetResponder(nil)
	var rep replayReport
	u.json(&rep, "kubectl", "webhooks", "replay", "billing", "--id", first, "--idempotency-key", "fix-1")
	if rep.Created != 1 || len(rep.Results) != 1 || rep.Results[0].Original != first {
		t.Fatalf("first replay: %+v", rep)
	}
	replayID := rep.Results[0].DeliveryID
	u.json(&rep, "kubectl", "webhooks", "replay", "billing", "--id", first, "--idempotency-key", "fix-1")
	if rep.Created != 0 || rep.Already != 1 || !rep.Results[0].IdempotentReplay || rep.Results[0].DeliveryID != replayID {
		t.Fatalf("the same key again: %+v, want the earlier replay %s reported", rep, replayID)
	}
	receive(t, rcv, "inv_evt_1")

	// The delivery log shows one replay of the original, delivered.
	testenv.Eventually(t, 30*time.Second, func() error {
		var p page[logEntry]
		u.json(&p, "kubectl", "webhooks", "log", "billing", "--limit", "100")
		var replays []logEntry
		for _, e := range p.Data {
			if e.ReplayOfID == first {
				replays = append(replays, e)
			}
		}
		if len(replays) != 1 || replays[0].Status != "succeeded" || replays[0].ID != replayID {
			return fmt.Errorf("replays of %s in the log: %+v, want one succeeded (%s)", first, replays, replayID)
		}
		return nil
	}, "")

	// --since replays the other two (and the first again, without a key: a new delivery).
	u.json(&rep, "kubectl", "webhooks", "replay", "billing", "--since", "1h")
	if rep.Created != len(events) {
		t.Errorf("replay --since 1h: %+v, want %d created", rep, len(events))
	}
	receive(t, rcv, events...)
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := rcv.Count("inv_evt_1"); n != 2 {
			return fmt.Errorf("inv_evt_1 delivered %d times, want 2 (one keyed replay, one unkeyed)", n)
		}
		return nil
	}, "")
	if n := rcv.Count("inv_evt_2"); n != 1 {
		t.Errorf("inv_evt_2 delivered %d times, want 1", n)
	}
}

// TestAutoDisableAndEnable: consecutive failures disable an endpoint; what arrives meanwhile is
// dead-lettered as endpoint_disabled and cannot be replayed; `kubectl webhooks enable` brings it
// back, deliveries resume, and replays deliver the rest: the receiver gets every event.
func TestAutoDisableAndEnable(t *testing.T) {
	u := newUser(t, "e2e-disable")
	rcv, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: testenv.SecretKey(stack.Client, u.ns, "fragile-signing", "secret")})
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	rcv.SetResponder(testenv.Failing)
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: once}
spec:
  schedule: [0s]
  circuitBreaker: {consecutiveFailures: 0}
  autoDisable: {consecutiveFailures: 3}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: fragile}
spec:
  url: %s
  eventTypes: [ticket.*]
  retryPolicyRef: {name: once}
`, rcv.URL()))
	u.waitReady("fragile")
	for i := 1; i <= 3; i++ {
		u.publish("ticket.opened", fmt.Sprintf("tkt_evt_%d", i), fmt.Sprintf(`{"ticket":%d}`, i))
	}
	u.must(nil, "kubectl", "wait", "--for=condition=Disabled", "--timeout=60s", "whe/fragile")
	var s endpointStatus
	u.json(&s, "kubectl", "webhooks", "status", "fragile")
	if s.State != "Disabled" {
		t.Errorf("status: %+v, want Disabled", s)
	}
	wide := u.must(nil, "kubectl", "get", "whe", "fragile", "-o", "wide")
	if !strings.Contains(wide, "True") {
		t.Errorf("kubectl get whe -o wide does not show Disabled:\n%s", wide)
	}

	u.publish("ticket.opened", "tkt_evt_4", `{"ticket":4}`)
	var disabledDL string
	testenv.Eventually(t, 60*time.Second, func() error {
		var p page[deadLetter]
		u.json(&p, "kubectl", "webhooks", "dlq", "list", "fragile")
		for _, d := range p.Data {
			if d.EventID == "tkt_evt_4" {
				if d.Reason != "endpoint_disabled" || len(d.Attempts) != 0 {
					return fmt.Errorf("tkt_evt_4 dead-lettered as %q after %d attempts, want endpoint_disabled without an attempt", d.Reason, len(d.Attempts))
				}
				disabledDL = d.DeliveryID
				return nil
			}
		}
		return fmt.Errorf("tkt_evt_4 is not dead-lettered yet (%d dead letters)", len(p.Data))
	}, "")
	refused := u.run(nil, "kubectl", "webhooks", "replay", "fragile", "--id", disabledDL)
	if refused.code != 3 || !strings.Contains(refused.stderr, "kubectl webhooks enable fragile") {
		t.Errorf("replay to a disabled endpoint: exit %d, %q; want 3 (refused) with how to enable", refused.code, refused.stderr)
	}
	if rcv.Stats().Accepted != 0 {
		t.Fatalf("the receiver accepted something while failing: %+v", rcv.Stats())
	}

	rcv.SetResponder(nil)
	u.must(nil, "kubectl", "webhooks", "enable", "fragile")
	u.must(nil, "kubectl", "wait", "--for=condition=Disabled=false", "--timeout=60s", "whe/fragile")
	u.publish("ticket.opened", "tkt_evt_5", `{"ticket":5}`)
	receive(t, rcv, "tkt_evt_5")

	var rep replayReport
	u.json(&rep, "kubectl", "webhooks", "replay", "fragile", "--all", "--idempotency-key", "after-enable")
	if rep.Created != 4 {
		t.Errorf("replay --all: %+v, want the 4 dead letters replayed", rep)
	}
	receive(t, rcv, "tkt_evt_1", "tkt_evt_2", "tkt_evt_3", "tkt_evt_4", "tkt_evt_5")
	u.json(&rep, "kubectl", "webhooks", "replay", "fragile", "--all", "--idempotency-key", "after-enable")
	if rep.Created != 0 || rep.Already != 4 {
		t.Errorf("replay --all with the same key again: %+v, want nothing new", rep)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		u.json(&s, "kubectl", "webhooks", "status", "fragile")
		if s.State != "Active" || s.Delivered != 5 {
			return fmt.Errorf("status %+v, want Active with 5 delivered", s)
		}
		return nil
	}, "")
}

// TestDedicatedDispatcher: an endpoint asking for its own dispatcher gets its own Deployment,
// which the local stack runs as its own process with its own ServiceAccount; deleting the
// endpoint removes the Deployment, and the process goes with it.
func TestDedicatedDispatcher(t *testing.T) {
	u := newUser(t, "e2e-dedicated")
	rcv, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: testenv.SecretKey(stack.Client, u.ns, "audit-signing", "secret")})
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: audit}
spec:
  url: %s
  eventTypes: [">"]
  dispatcher: {dedicated: true, replicas: 1}
`, rcv.URL()))
	u.waitReady("audit")
	const dep = "webhook-dispatcher-audit"
	sa := u.must(nil, "kubectl", "get", "deploy", dep, "-o", "jsonpath={.spec.template.spec.serviceAccountName} {.status.availableReplicas}")
	if sa != dep+" 1" {
		t.Errorf("Deployment %s: service account and available replicas %q, want %q", dep, sa, dep+" 1")
	}
	pods := stack.Runner.Pods(u.ns, dep)
	if len(pods) != 1 {
		t.Fatalf("the runner runs %v for %s, want one replica", pods, dep)
	}
	u.publish("audit.login", "aud_evt_1", `{"user":"ada"}`)
	receive(t, rcv, "aud_evt_1")

	var procs []localstack.Process
	all, err := localstack.Descendants(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range all {
		for _, pid := range pods {
			if p.PID == pid {
				procs = append(procs, p)
			}
		}
	}
	if len(procs) != 1 {
		t.Fatalf("no process found for %v", pods)
	}
	u.must(nil, "kubectl", "delete", "whe", "audit", "--timeout=120s")
	testenv.Eventually(t, 60*time.Second, func() error {
		if r := u.run(nil, "kubectl", "get", "deploy", dep); r.code == 0 {
			return fmt.Errorf("Deployment %s still exists", dep)
		}
		if n := len(stack.Runner.Pods(u.ns, dep)); n != 0 || procs[0].Alive() {
			return fmt.Errorf("%d replicas of %s still run (process %s alive: %v)", n, dep, procs[0], procs[0].Alive())
		}
		return nil
	}, "")
}
