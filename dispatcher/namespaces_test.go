package dispatcher_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/cloudevent"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/replay"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// sibling is a new namespace on e's control plane and NATS server, with its own set of
// streams, as the controller creates them with its first endpoint.
func (e *env) sibling() *env {
	e.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "disp-"}}
	if err := e.k8s.Create(context.Background(), ns); err != nil {
		e.t.Fatal(err)
	}
	set := e.cfg.Streams.For(ns.Name)
	if err := set.Ensure(context.Background(), e.js); err != nil {
		e.t.Fatal(err)
	}
	cfg := e.cfg
	cfg.NATS.TokenFile, cfg.NATS.Namespace = dispatcherToken(e.t, ns.Name), ns.Name
	return &env{t: e.t, ns: ns.Name, nats: e.nats, nc: e.nc, js: e.js, cfg: cfg, set: set, k8s: e.k8s}
}

// An event id is unique per namespace: the same Nats-Msg-Id published in namespace b and then
// in namespace a is delivered in both (one namespace's event never suppresses another's), and
// each namespace's delivery log holds only its own attempts.
func TestSameEventIDInTwoNamespacesIsDeliveredInBoth(t *testing.T) {
	a := newEnv(t)
	b := a.sibling()
	rcvA, rcvB := newReceiver(t, nil), newReceiver(t, nil)
	rcvA.Trust(a.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcvA.URL()}))
	rcvB.Trust(b.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcvB.URL()}))
	a.dispatcher("a-0")
	b.dispatcher("b-0")

	b.publish("order.created", "order-1001", []byte(`{"tenant":"b"}`))
	a.publish("order.created", "order-1001", []byte(`{"tenant":"a"}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return rcvA.RequestsByID()["order-1001"] > 0 && rcvB.RequestsByID()["order-1001"] > 0 },
		"order-1001 reached a: %v, b: %v", rcvA.RequestsByID(), rcvB.RequestsByID())
	for name, r := range map[string]*testenv.Receiver{"a": rcvA, "b": rcvB} {
		for _, h := range r.Requests() {
			if string(h.Body) != `{"tenant":"`+name+`"}` {
				t.Errorf("namespace %s's receiver got %s", name, h.Body)
			}
		}
		if r.Stats().BadSignatures > 0 {
			t.Errorf("namespace %s's receiver saw bad signatures", name)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(a.logRecords("orders")) > 0 && len(b.logRecords("orders")) > 0 },
		"no delivery log records")
	for _, rec := range a.logRecords("orders") {
		if rec.Namespace != a.ns {
			t.Errorf("a's delivery log holds a record of %s", rec.Namespace)
		}
	}
}

// With cross-namespace sources allowed, an endpoint also reads each source namespace's events
// stream (through its dispatcher's intake consumer there, which the controller creates): an endpoint of a that
// names b in spec.sourceNamespaces gets b's events, and an event of b with the same id as one
// of a is a delivery of its own.
func TestEndpointReadsSourceNamespacesStreams(t *testing.T) {
	a := newEnv(t)
	a.cfg.AllowCrossNamespaceSources = true
	b := a.sibling()
	consentToReaders(t, b, a)
	rcv := newReceiver(t, nil)
	spec := v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), SourceNamespaces: []string{b.ns}, EventTypes: []v1alpha1.EventTypePattern{">"}}
	rcv.Trust(a.endpoint("audit", spec))
	// The shared lane reads b's stream through a's intake consumer there.
	if err := b.set.EnsureIntakeConsumer(context.Background(), a.js, a.ns, time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	a.dispatcher("a-0")

	a.publish("order.created", "order-1", []byte(`{"from":"a"}`))
	b.publish("order.created", "order-1", []byte(`{"from":"b"}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return rcv.Stats().Requests >= 2 }, "delivered %d of 2", lazyN(func() int { return rcv.Stats().Requests }))
	got := map[string]bool{}
	for _, h := range rcv.Requests() {
		got[string(h.Body)] = true
	}
	if !got[`{"from":"a"}`] || !got[`{"from":"b"}`] {
		t.Errorf("bodies delivered: %v", got)
	}
}

// A receiver tells an event of a source namespace from the reader's own by headers no
// producer sets, and their ids never collide: the reader's order-1 keeps webhook-id order-1,
// the source namespace's is <namespace>/order-1, the same on its retry (from a message
// schedule) and on the replay of its dead letter; webhook-source-namespace names where each
// was published and webhook-sequence counts in that namespace's stream; a CloudEvent's id is
// the webhook-id, and its source is the source namespace's whatever its producer set (here:
// the reader's own source).
func TestSourceNamespaceEventsAreToldApart(t *testing.T) {
	ctx := context.Background()
	a := newEnv(t)
	a.cfg.AllowCrossNamespaceSources = true
	b := a.sibling()
	consentToReaders(t, b, a)
	raw := newReceiver(t, func(r testenv.Request) testenv.Response {
		switch {
		case strings.Contains(string(r.Body), `"fail":"first"`) && r.Attempt == 1:
			return testenv.Response{Status: 500, Body: "the first attempt fails"}
		case strings.Contains(string(r.Body), `"fail":"always"`) && r.Header.Get("webhook-replay-of") == "":
			return testenv.Response{Status: 500, Body: "until replayed"}
		}
		return testenv.Response{}
	})
	ce := newReceiver(t, nil)
	ref := a.policy("twice", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 3 * time.Second}}, CircuitBreaker: noCircuit()})
	// A short timeout makes a short ack wait: the renewal of the dispatcher's connection for its
	// consumers in b leaves the pull requests made before it at the server, and what they take
	// comes again only after the ack wait.
	specs := map[string]v1alpha1.WebhookEndpointSpec{
		"audit":    {URL: raw.URL(), SourceNamespaces: []string{b.ns}, RetryPolicyRef: ref, Timeout: dur(time.Second)},
		"audit-ce": {URL: ce.URL(), SourceNamespaces: []string{b.ns}, Format: &v1alpha1.FormatSpec{Type: v1alpha1.FormatCloudEvents}, Timeout: dur(time.Second)},
	}
	raw.Trust(a.endpoint("audit", specs["audit"]))
	ce.Trust(a.endpoint("audit-ce", specs["audit-ce"]))
	for name, spec := range specs {
		b.readerConsumer(a, name, &spec)
	}
	a.dispatcher("a-0")
	// Once b's events arrive, the dispatcher's connection was renewed for its consumers there.
	seqs := map[string]uint64{} // webhook-id -> its sequence in its namespace's stream
	seqs[b.ns+"/order-0"] = b.publish("order.created", "order-0", []byte(`{"from":"b"}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return raw.Stats().Requests == 1 && ce.Stats().Requests == 1 },
		"b's first event is not delivered: %v", lazy(a.dump))

	seqs["order-0"] = a.publish("order.created", "order-0", []byte(`{"from":"a"}`))
	seqs["order-1"] = a.publish("order.created", "order-1", []byte(`{"from":"a"}`))
	seqs[b.ns+"/order-1"] = b.publish("order.created", "order-1", []byte(`{"from":"b","fail":"first"}`), cloudevent.HeaderSource, cloudevent.DefaultSource(a.ns))
	seqs[b.ns+"/order-2"] = b.publish("order.created", "order-2", []byte(`{"from":"b","fail":"always"}`))

	// b's order-2 fails until it is dead-lettered; its replay is accepted.
	var dl records.DeadLetter
	testenv.Eventually(t, 60*time.Second, func() bool {
		for _, d := range a.deadLetters() {
			if d.Endpoint == "audit" {
				dl = d
				return true
			}
		}
		return false
	}, "b's order-2 is not dead-lettered: %v%v", lazy(a.dump), lazy(func() string {
		var sb strings.Builder
		for _, r := range raw.Requests() {
			fmt.Fprintf(&sb, "\n%s attempt %d replay %q", r.ID, r.Attempt, r.Header.Get("webhook-replay-of"))
		}
		for _, rec := range a.logRecords("audit") {
			fmt.Fprintf(&sb, "\nlog %s %s attempt %d %s %s", rec.EventID, rec.EventNamespace, rec.Attempt, rec.State, rec.Response.Error)
		}
		return sb.String()
	}))
	if dl.EventID != "order-2" || dl.EventNamespace != b.ns {
		t.Errorf("dead letter of b's order-2: event %q of namespace %q", dl.EventID, dl.EventNamespace)
	}
	eng := &replay.Engine{JS: a.js, Set: a.set}
	sel := replay.Selection{Endpoint: "audit", DeliveryIDs: []string{dl.DeliveryID}}
	cur, err := eng.Begin(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	if batch, err := eng.Next(ctx, sel, replay.Run{Name: "again", Owner: "test"}, cur, 10); err != nil || len(batch.Results) != 1 || batch.Results[0].Outcome != replay.Replayed {
		t.Fatalf("replaying b's order-2: %+v, %v", batch.Results, err)
	}
	want := map[string]int{"order-0": 1, "order-1": 1, b.ns + "/order-0": 1, b.ns + "/order-1": 2, b.ns + "/order-2": 3}
	testenv.Eventually(t, 60*time.Second, func() bool {
		got := raw.RequestsByID()
		for id, n := range want {
			if got[id] != n {
				return false
			}
		}
		return ce.Stats().Unique == len(want)
	}, "requests by webhook-id: %v, want %v; CloudEvents: %v%v%v", lazy(func() string { return fmt.Sprint(raw.RequestsByID()) }), want,
		lazy(func() string { return fmt.Sprint(ce.RequestsByID()) }), lazy(a.dump), lazy(b.dump))
	if n := raw.Stats().BadSignatures + ce.Stats().BadSignatures; n != 0 {
		t.Errorf("%d requests whose signature does not verify", n)
	}

	origin := func(id string) string {
		if strings.HasPrefix(id, b.ns+"/") {
			return b.ns
		}
		return a.ns
	}
	for _, r := range append(raw.Requests(), ce.Requests()...) {
		if got := r.Header.Get("webhook-source-namespace"); got != origin(r.ID) {
			t.Errorf("%s: webhook-source-namespace %q, want %q", r.ID, got, origin(r.ID))
		}
		if got := r.Header.Get("webhook-sequence"); got != strconv.FormatUint(seqs[r.ID], 10) {
			t.Errorf("%s: webhook-sequence %s, want %d (its sequence in %s's events stream)", r.ID, got, seqs[r.ID], origin(r.ID))
		}
	}
	replayed := 0
	for _, r := range raw.Requests() {
		if r.Header.Get("webhook-replay-of") != "" {
			replayed++
			if r.ID != b.ns+"/order-2" {
				t.Errorf("the replay reached the receiver as %s", r.ID)
			}
		}
	}
	if replayed != 1 {
		t.Errorf("%d replays received, want 1", replayed)
	}
	for _, r := range ce.Requests() {
		if got := r.Header.Get("ce-id"); got != r.ID {
			t.Errorf("CloudEvent %s: ce-id %q, want the webhook-id", r.ID, got)
		}
		if got, want := r.Header.Get("ce-source"), cloudevent.DefaultSource(origin(r.ID)); got != want {
			t.Errorf("CloudEvent %s: ce-source %q, want %q", r.ID, got, want)
		}
	}
	for _, rec := range a.logRecords("audit") {
		want := ""
		if origin(rec.RequestHeaders[records.SendID]) == b.ns {
			want = b.ns
		}
		if rec.EventNamespace != want {
			t.Errorf("log record of %s (sent as %s): event namespace %q, want %q", rec.EventID, rec.RequestHeaders[records.SendID], rec.EventNamespace, want)
		}
	}
}

// consentToReaders annotates b's namespace so that readers' endpoints may read its events (the
// auth callout then lets their dispatchers pull their consumers on b's stream).
func consentToReaders(t *testing.T, b *env, readers ...*env) {
	t.Helper()
	ns := &corev1.Namespace{}
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: b.ns}, ns); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range readers {
		names = append(names, r.ns)
	}
	ns.Annotations = map[string]string{consent.EventReaders: strings.Join(names, ",")}
	if err := cp.Client.Update(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
}

// readerConsumer creates the consumer on e's events stream through which endpoint name of
// reader's namespace reads e's events, as the controller does (starting a minute ago).
func (e *env) readerConsumer(reader *env, name string, spec *v1alpha1.WebhookEndpointSpec) {
	e.t.Helper()
	if streams.LaneOf(spec) == streams.LaneShared {
		// The reader's intake consumer on e's stream, one for all its endpoints.
		if err := e.set.EnsureIntakeConsumer(context.Background(), e.js, reader.ns, time.Now().Add(-time.Minute)); err != nil {
			e.t.Fatal(err)
		}
		return
	}
	err := e.set.EnsureEventsConsumer(context.Background(), e.js, reader.ns, name, streams.EventPatterns(spec), streams.EndpointConsumerOptionsFor(spec),
		streams.ConsumerStart{Time: time.Now().Add(-time.Minute)})
	if err != nil {
		e.t.Fatal(err)
	}
}
