package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/client-go/kubernetes"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// tenantStreams reads a namespace's streams with the JetStream administrator's connection.
type tenantStreams struct {
	t   *testing.T
	js  jetstream.JetStream
	set streams.Set
}

func newTenantStreams(t *testing.T, ns string) *tenantStreams {
	t.Helper()
	nc, js, err := stack.ConnectAdmin(nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return &tenantStreams{t: t, js: js, set: streams.DefaultConfig().For(ns)}
}

// holding lists the streams of the namespace holding marker, reading every message back.
func (s *tenantStreams) holding(marker string) []string {
	return testenv.Stored{T: s.t, JS: s.js, Set: s.set}.Holding(marker)
}

// publish publishes an event as the ingress does (its own connection to the bus), for a
// namespace whose producers may not publish directly.
func (s *tenantStreams) publish(typ, id, body string) {
	s.t.Helper()
	msg := &nats.Msg{Subject: s.set.EventSubject(typ), Header: nats.Header{}, Data: []byte(body)}
	msg.Header.Set(records.HeaderMsgID, id)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.js.PublishMsg(ctx, msg); err != nil {
		s.t.Fatalf("publishing %s: %v", id, err)
	}
}

// directPublish publishes as the namespace's producer (a ServiceAccount bound to
// webhook-operator-producer) straight to the bus.
func directPublish(t *testing.T, ns, id string) error {
	t.Helper()
	nc, err := producerConn(t, ns)
	if err != nil {
		return fmt.Errorf("connecting: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer pcancel()
	_, err = js.Publish(pctx, streams.DefaultConfig().For(ns).EventSubject("order.created"), []byte(`{"direct":true}`), jetstream.WithMsgID(id))
	return err
}

// jsonpath runs kubectl get with a JSONPath output.
func (u *user) jsonpath(object, path string) string {
	u.t.Helper()
	return u.must(nil, "kubectl", "get", object, "-o", "jsonpath="+path)
}

// A WebhookQuota's limits hold on the real stack, and another namespace is unaffected while
// the first is at its limits: the platform team writes the quota and a's editor cannot change
// it; a's endpoint beyond the count is not Ready with the reason and gets nothing; a's
// producer may not publish to the bus directly while a rate is set; a's dead letters fill
// the quota's small bound and every endpoint says StorageLimitReached; b publishes directly,
// delivers, and keeps the installation's bounds.
func TestWebhookQuotaLimitsHoldAndBIsUnaffected(t *testing.T) {
	a, b := newUser(t, "quota-a"), newUser(t, "quota-b")
	a.apply(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookQuota
metadata: {name: default}
spec:
  maxEndpoints: 2
  eventsPerSecond: 1
  eventsBurst: 5
  storage: {deadLetters: 64Ki}
`)
	// Tenants read their quota; even a's editor (the namespace's admin role aggregates it)
	// cannot change it.
	cs := kubernetes.NewForConfigOrDie(stack.ControlPlane.Config)
	grant(t, cs, a.ns, "editor", "webhook-operator-editor")
	kc := tokenKubeconfig(t, cs, a.ns, "editor")
	kubectlAs := func(args ...string) result {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return runCommand(exec.CommandContext(ctx, testenv.Kubectl(), append([]string{"--kubeconfig", kc, "-n", a.ns}, args...)...))
	}
	if r := kubectlAs("get", "whq", "default"); r.code != 0 {
		t.Errorf("a's editor cannot read the quota: %s%s", r.stdout, r.stderr)
	}
	if r := kubectlAs("patch", "whq", "default", "--type=merge", "-p", `{"spec":{"maxEndpoints":100}}`); r.code == 0 || !strings.Contains(r.stderr, "forbidden") {
		t.Errorf("a's editor changed the quota: exit %d %s%s", r.code, r.stdout, r.stderr)
	}
	if r := kubectlAs("delete", "whq", "default"); r.code == 0 || !strings.Contains(r.stderr, "forbidden") {
		t.Errorf("a's editor deleted the quota: exit %d %s%s", r.code, r.stdout, r.stderr)
	}

	ok := a.receiver("orders")
	failing := a.receiver("crm")
	failing.SetResponder(testenv.Failing)
	extra := a.receiver("extra")
	a.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: once}
spec:
  schedule: [0s]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: orders}
spec: {url: %s, eventTypes: [order.*]}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: crm}
spec: {url: %s, eventTypes: [lead.*], retryPolicyRef: {name: once}}
`, ok.URL(), failing.URL()))
	a.waitReady("orders", "crm")
	// The quota admits the earliest created first and, among endpoints created in the same
	// second (creationTimestamp has seconds), by name: "extra" sorts before "orders", so it
	// is created once the clock has left the second orders and crm were created in.
	for _, ep := range []string{"whe/orders", "whe/crm"} {
		created, err := time.Parse(time.RFC3339, a.jsonpath(ep, "{.metadata.creationTimestamp}"))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(created.Add(time.Second)))
	}
	a.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: extra}
spec: {url: %s, eventTypes: [order.*]}
`, extra.URL()))
	a.must(nil, "kubectl", "wait", "--timeout=120s", `--for=jsonpath={.status.conditions[?(@.type=="Ready")].reason}=QuotaExceeded`, "whe/extra")
	if msg := a.jsonpath("whe/extra", `{.status.conditions[?(@.type=="Ready")].message}`); !strings.Contains(msg, "spec.maxEndpoints") {
		t.Errorf("extra's Ready message %q does not name the limit", msg)
	}
	if reason := a.jsonpath("whe/extra", `{.status.conditions[?(@.type=="QuotaLimitReached")].reason}`); reason != "EndpointLimit" {
		t.Errorf("extra's QuotaLimitReached reason %q", reason)
	}

	// A publish over the rate: NATS cannot hold a rate, so a's producer may not publish to
	// the bus at all (it publishes through the ingress, which holds it); b's may (below).
	if err := directPublish(t, a.ns, "direct-a"); err == nil {
		t.Error("a's producer published to the bus directly while a's quota sets a publish rate")
	}
	if r := a.run(nil, "kubectl", "webhooks", "publish", "order.created", "--id", "plugin-a", "--data", "{}"); r.code == 0 || !strings.Contains(r.stderr, "spec.eventsPerSecond") {
		t.Errorf("kubectl webhooks publish to the bus in a: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The rate covers the deliveries a's tenants write too: a test delivery to the bus is
	// refused, saying why (a WebhookReplay goes on, within the rate, by the controller).
	if r := a.run(nil, "kubectl", "webhooks", "test", "orders"); r.code == 0 || !strings.Contains(r.stderr, "spec.eventsPerSecond") {
		t.Errorf("kubectl webhooks test to the bus in a: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Through the ingress: a batch of a's burst (5) is accepted; the next one, within the
	// seconds its rate (1/s) needs to refill, is refused with 429 and Retry-After, and
	// nothing of it is stored.
	token := a.producer("pub", true)
	path := "/v1/namespaces/" + a.ns + "/events"
	batch := func(from int) []byte {
		var evs []string
		for i := from; i < from+5; i++ {
			evs = append(evs, fmt.Sprintf(`{"id":"rate-a-%d","type":"order.created","data":{}}`, i))
		}
		return []byte("[" + strings.Join(evs, ",") + "]")
	}
	if code, body := curl(t, path, token, batch(0), "-H", "Content-Type: application/json"); code != http.StatusAccepted {
		t.Errorf("a batch of a's burst through the ingress: %d %s", code, body)
	}
	stored := events(t, a.ns)
	code, body := curl(t, path, token, batch(5), "-H", "Content-Type: application/json", "-D", "/dev/stdout")
	if code != http.StatusTooManyRequests || !strings.Contains(body, "Retry-After") || !strings.Contains(body, "events per second") {
		t.Errorf("a batch over a's rate through the ingress: %d %s", code, body)
	}
	if after := events(t, a.ns); after != stored {
		t.Errorf("the refused batch stored %d events", after-stored)
	}

	// a's events (through the ingress's connection): orders gets its own, extra nothing; the
	// failing endpoint's dead letters fill a's 64Ki dead-letter bound.
	sa := newTenantStreams(t, a.ns)
	sa.publish("order.created", "ord-a-1", `{"order":1}`)
	for i := range 80 {
		sa.publish("lead.created", fmt.Sprintf("lead-%d", i), fmt.Sprintf(`{"lead":%d,"pad":%q}`, i, strings.Repeat("p", 1024)))
	}
	receive(t, ok, "ord-a-1")
	a.must(nil, "kubectl", "wait", "--timeout=150s", `--for=jsonpath={.status.conditions[?(@.type=="StorageLimitReached")].reason}=DeadLetterStreamFull`, "whe/orders", "whe/crm")
	if msg := a.jsonpath("whe/crm", `{.status.conditions[?(@.type=="StorageLimitReached")].message}`); !strings.Contains(msg, "spec.storage.deadLetters") {
		t.Errorf("crm's StorageLimitReached message %q does not name the quota", msg)
	}
	a.must(nil, "kubectl", "wait", "--timeout=120s", "--for=condition=LimitReached", "whq/default")
	if used := a.jsonpath("whq/default", "{.status.endpoints.used}/{.status.endpoints.limit}"); used != "2/2" {
		t.Errorf("the quota counts %s endpoints, want 2/2", used)
	}
	out := a.must(nil, "kubectl", "get", "whq")
	for _, want := range []string{"LIMITED", "ENDPOINTS", "IN-FLIGHT", "EVENTS/S", "default", "True"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get whq lacks %q:\n%s", want, out)
		}
	}

	// b, meanwhile: its endpoint delivers what its producer publishes, within the
	// installation's bounds, with no quota condition.
	rcvB := b.receiver("orders")
	b.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: orders}
spec: {url: %s, eventTypes: [order.*]}
`, rcvB.URL()))
	b.waitReady("orders")
	var ids []string
	for i := range 20 {
		id := fmt.Sprintf("ord-b-%d", i)
		ids = append(ids, id)
		b.publish("order.created", id, `{"tenant":"b"}`)
	}
	receive(t, rcvB, ids...)
	if err := directPublish(t, b.ns, "direct-b-2"); err != nil {
		t.Errorf("b's producer cannot publish directly: %v", err)
	}
	receive(t, rcvB, "direct-b-2")
	if r := b.run(nil, "kubectl", "webhooks", "test", "orders", "--wait"); r.code != 0 {
		t.Errorf("kubectl webhooks test in b, without a rate: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if c := b.jsonpath("whe/orders", `{.status.conditions[?(@.type=="QuotaLimitReached")].status}`); c != "" {
		t.Errorf("b's endpoint has a QuotaLimitReached condition %q without a quota", c)
	}
	if r := b.must(nil, "kubectl", "get", "whe", "orders", "-o", `jsonpath={.status.conditions[?(@.type=="StorageLimitReached")].reason}`); r == "DeadLetterStreamFull" {
		t.Error("b's endpoint says its dead letters are full")
	}
	sb := newTenantStreams(t, b.ns)
	dlq, err := sb.js.Stream(context.Background(), sb.set.DeadLetterStream())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dlq.CachedInfo().Config.MaxBytes, streams.DefaultConfig().DeadLetterMaxBytes; got != want {
		t.Errorf("b's dead-letter bound is %d, want the installation's %d", got, want)
	}
	if extra.Count("ord-a-1") != 0 {
		t.Error("the endpoint beyond a's quota received an event")
	}
}

// Payload retention on the real stack: a dead letter and its delivery-log record keep their
// payload until the endpoint's retention has passed, then only the attempt history, and
// `kubectl webhooks dlq show` says the payload expired.
func TestPayloadRetentionDropsPayloadsOnSchedule(t *testing.T) {
	u := newUser(t, "retention")
	rcv := u.receiver("crm")
	const marker = "ret-secret-7d1f"
	rcv.SetResponder(func(testenv.Request) testenv.Response {
		return testenv.Response{Status: 503, Body: "unknown customer " + marker}
	})
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: once}
spec:
  schedule: [0s]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: crm}
spec:
  url: %s
  eventTypes: [lead.*]
  retryPolicyRef: {name: once}
  payloadRetention: {deadLetters: 20s, deliveryLog: 20s}
`, rcv.URL()))
	u.waitReady("crm")
	u.publish("lead.created", "lead-ret-1", `{"email":"`+marker+`"}`)
	var dl deadLetter
	testenv.Eventually(t, 60*time.Second, func() error {
		var p page[deadLetter]
		u.json(&p, "kubectl", "webhooks", "dlq", "list", "crm")
		if len(p.Data) != 1 {
			return fmt.Errorf("%d dead letters", len(p.Data))
		}
		dl = p.Data[0]
		return nil
	}, "")
	s := newTenantStreams(t, u.ns)
	out := u.must(nil, "kubectl", "webhooks", "dlq", "show", dl.DeliveryID)
	expired := strings.Contains(out, "the payload has expired")
	if !expired && !strings.Contains(out, marker) {
		t.Errorf("dlq show of a fresh dead letter shows no payload:\n%s", out)
	}
	testenv.Eventually(t, 120*time.Second, func() error {
		if left := s.holding(marker); len(left) != 1 || left[0] != s.set.EventsStream() {
			return fmt.Errorf("the payload is stored in %v (want the events stream only, kept 72h)", left)
		}
		return nil
	}, "")
	out = u.must(nil, "kubectl", "webhooks", "dlq", "show", dl.DeliveryID)
	for _, want := range []string{"the payload has expired", "endpoint's payload retention", "Attempts (1)", "503"} {
		if !strings.Contains(out, want) {
			t.Errorf("dlq show after the retention lacks %q:\n%s", want, out)
		}
	}
	var shown struct {
		DeadLetteredAt   time.Time `json:"deadLetteredAt"`
		PayloadRemovedAt time.Time `json:"payloadRemovedAt"`
		PayloadRemoved   string    `json:"payloadRemoved"`
	}
	u.json(&shown, "kubectl", "webhooks", "dlq", "show", dl.DeliveryID)
	if shown.PayloadRemoved != records.PayloadExpired || shown.PayloadRemovedAt.Sub(shown.DeadLetteredAt) < 20*time.Second {
		t.Errorf("payload %q removed at %s, dead-lettered at %s: before its 20s retention", shown.PayloadRemoved, shown.PayloadRemovedAt, shown.DeadLetteredAt)
	}
	// It cannot be replayed: there is nothing to deliver.
	u.run(nil, "kubectl", "webhooks", "replay", "crm", "--id", dl.DeliveryID, "--idempotency-key", "ret-1", "--wait")
	if got := u.jsonpath("whr/ret-1", "{.status.skipped} {.status.problems[0].message}"); !strings.HasPrefix(got, "1 ") || !strings.Contains(got, "expired") {
		t.Errorf("the replay of a dead letter without its payload: %q", got)
	}
}

// A WebhookErasure of a set of event ids on the real stack leaves none of their payloads in
// any stream of the namespace (every message read back): delivered events, dead-lettered ones
// and those an endpoint holds; the other events are delivered as before, and the health
// counts do not change.
func TestWebhookErasureLeavesNoPayloadInAnyStream(t *testing.T) {
	u := newUser(t, "erasure")
	ok, failing, held := u.receiver("orders"), u.receiver("crm"), u.receiver("held")
	// The receivers echo what they got, as receivers often do in their error messages: the
	// delivery log's response bodies then hold the payload too.
	ok.SetResponder(func(r testenv.Request) testenv.Response { return testenv.Response{Body: "got " + string(r.Body)} })
	failing.SetResponder(func(r testenv.Request) testenv.Response {
		return testenv.Response{Status: 503, Body: "cannot take " + string(r.Body)}
	})
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: once}
spec:
  schedule: [0s]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: orders}
spec: {url: %s, eventTypes: [customer.*]}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: crm}
spec: {url: %s, eventTypes: [customer.*], retryPolicyRef: {name: once}}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: held}
spec: {url: %s, eventTypes: [customer.*], suspend: true}
`, ok.URL(), failing.URL(), held.URL()))
	u.waitReady("orders", "crm")
	const ana, bob = "ana-7f3a@example.com", "bob-91c2@example.com"
	erase := []string{"cus-ana-1", "cus-ana-2", "cus-ana-3"}
	keep := []string{"cus-bob-1", "cus-bob-2"}
	for _, id := range erase {
		u.publish("customer.updated", id, `{"email":"`+ana+`"}`)
	}
	for _, id := range keep {
		u.publish("customer.updated", id, `{"email":"`+bob+`"}`)
	}
	receive(t, ok, append(erase, keep...)...)
	s := newTenantStreams(t, u.ns)
	testenv.Eventually(t, 90*time.Second, func() error {
		if left := s.holding(ana); len(left) != 4 {
			return fmt.Errorf("the payload is in %v, want all four streams (events, held deliveries, the log's response bodies, dead letters)", left)
		}
		return nil
	}, "")
	delivered := func() string { return u.jsonpath("whe/orders", "{.status.health.delivered}") }
	testenv.Eventually(t, 60*time.Second, func() error {
		if d := delivered(); d != "5" {
			return fmt.Errorf("orders counts %s delivered, want 5", d)
		}
		return nil
	}, "")
	var dls page[deadLetter]
	u.json(&dls, "kubectl", "webhooks", "dlq", "list", "crm")
	anaDL := ""
	for _, d := range dls.Data {
		if d.EventID == erase[0] {
			anaDL = d.DeliveryID
		}
	}
	if anaDL == "" {
		t.Fatalf("no dead letter of %s: %+v", erase[0], dls.Data)
	}

	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookErasure
metadata: {name: ana}
spec:
  eventIDs: [%s]
`, strings.Join(erase, ", ")))
	u.must(nil, "kubectl", "wait", "--timeout=180s", "--for=condition=Complete", "whx/ana")
	if left := s.holding(ana); len(left) > 0 {
		t.Errorf("after the erasure the payload is still stored in %v", left)
	}
	if left := s.holding(bob); len(left) < 3 {
		t.Errorf("the other events' payloads are in %v only", left)
	}
	if got := u.jsonpath("whx/ana", "{.status.matched} {.status.erased.events}"); got != "3 3" {
		t.Errorf("the erasure matched and erased %q, want 3 3", got)
	}
	out := u.must(nil, "kubectl", "get", "whx")
	for _, want := range []string{"COMPLETE", "MATCHED", "DEAD-LETTERS", "ana", "True"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get whx lacks %q:\n%s", want, out)
		}
	}
	if out := u.must(nil, "kubectl", "webhooks", "dlq", "show", anaDL); !strings.Contains(out, "the payload was erased") {
		t.Errorf("dlq show of an erased dead letter:\n%s", out)
	}
	st := testenv.Stored{T: t, JS: s.js, Set: s.set}
	if ops := st.Msgs(s.set.EventsStream(), s.set.EventSubject(records.OpsErasureCompleted)); len(ops) != 1 || !strings.Contains(string(ops[0].Data), `"erasure":"ana"`) {
		t.Errorf("the erasure.completed operational events: %d", len(ops))
	}
	// Once the fold has read past every record, the rewritten ones included, the counts are
	// what they were.
	bus := natsauth.BusOf(streams.DefaultConfig())(u.ns)
	testenv.Eventually(t, 60*time.Second, func() error {
		a, err := s.js.Stream(context.Background(), s.set.AttemptsStream())
		if err != nil {
			return err
		}
		if folded, last := foldedThrough(t, s.js, bus), a.CachedInfo().State.LastSeq; folded < last {
			return fmt.Errorf("the fold is at %d of %d log records", folded, last)
		}
		return nil
	}, "")
	kv, err := s.js.KeyValue(context.Background(), s.set.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), streams.HealthKey("orders"))
	if err != nil {
		t.Fatal(err)
	}
	var counts struct {
		Delivered int64 `json:"delivered"`
	}
	if err := json.Unmarshal(e.Value(), &counts); err != nil || counts.Delivered != 5 {
		t.Errorf("orders' counts say %d delivered after the erasure (%v), want still 5", counts.Delivered, err)
	}
	if d := delivered(); d != "5" {
		t.Errorf("orders' status says %s delivered after the erasure, want still 5", d)
	}

	// Deliveries of other events go on: the held endpoint, resumed, gets bob's events and
	// none of ana's; a new event reaches orders.
	u.must(nil, "kubectl", "patch", "whe", "held", "--type=merge", "-p", `{"spec":{"suspend":false}}`)
	receive(t, held, keep...)
	u.publish("customer.updated", "cus-after", `{"email":"carol@example.com"}`)
	receive(t, ok, "cus-after")
	for _, id := range erase {
		if held.Count(id) != 0 {
			t.Errorf("the resumed endpoint received erased event %s", id)
		}
	}
}
