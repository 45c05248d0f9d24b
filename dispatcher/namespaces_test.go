package dispatcher_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
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
// stream (through its consumer there, which the controller creates): an endpoint of a that
// names b in spec.sourceNamespaces gets b's events, and an event of b with the same id as one
// of a is a delivery of its own.
func TestEndpointReadsSourceNamespacesStreams(t *testing.T) {
	a := newEnv(t)
	a.cfg.AllowCrossNamespaceSources = true
	b := a.sibling()
	// b consents to a reading its events (so the auth callout lets a's dispatcher read b's
	// stream state; the consumer there is the controller's doing, here the test's).
	ns := &corev1.Namespace{}
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: b.ns}, ns); err != nil {
		t.Fatal(err)
	}
	ns.Annotations = map[string]string{consent.EventReaders: a.ns}
	if err := cp.Client.Update(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	rcv := newReceiver(t, nil)
	spec := v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), SourceNamespaces: []string{b.ns}, EventTypes: []v1alpha1.EventTypePattern{">"}}
	rcv.Trust(a.endpoint("audit", spec))
	err := b.set.EnsureEventsConsumer(context.Background(), a.js, a.ns, "audit", streams.EventPatterns(&spec), streams.EndpointConsumerOptionsFor(&spec),
		streams.ConsumerStart{Time: time.Now().Add(-time.Minute)})
	if err != nil {
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
