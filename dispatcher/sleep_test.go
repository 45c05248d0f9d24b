package dispatcher_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/shared"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A shared dispatcher lets an idle namespace sleep (its dispatcher stopped, nothing of it on
// the servers) and wakes it for what arrives: an event published while it sleeps is delivered;
// a change of its pool entry (its endpoints changed) wakes it; a namespace whose entry says
// awake never sleeps; a namespace whose retry waits on the server's schedule sleeps meanwhile
// and is woken when it falls due, and the retry is delivered.
func TestASharedDispatcherLetsIdleNamespacesSleepAndWakesThem(t *testing.T) {
	a := newEnv(t)
	b := a.sibling()
	op := a.sibling()
	ctx := context.Background()
	sharedSA := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: op.ns, Name: "webhook-shared-dispatcher"}}
	if err := cp.Client.Create(ctx, sharedSA); err != nil {
		t.Fatal(err)
	}
	orders := map[string]*testenv.Receiver{}
	for _, e := range []*env{a, b} {
		r := newReceiver(t, nil)
		r.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: r.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"}}))
		orders[e.ns] = r
		tokenGrant(t, e.ns, op.ns, sharedSA.Name)
	}
	// a's flaky endpoint fails the first attempt of each event; its one retry is 8 s later.
	var calls atomic.Int64
	flaky := newReceiver(t, func(r testenv.Request) testenv.Response {
		if r.Attempt <= 1 {
			calls.Add(1)
			return testenv.Response{Status: 503}
		}
		return testenv.Response{}
	})
	retryOnce := a.policy("retry-once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 8 * time.Second}}, CircuitBreaker: noCircuit()})
	flaky.Trust(a.endpoint("flaky", v1alpha1.WebhookEndpointSpec{URL: flaky.URL(), EventTypes: []v1alpha1.EventTypePattern{"invoice.*"}, RetryPolicyRef: retryOnce}))
	dispatcherRole(t, a.ns, names.SigningSecret("orders"), names.SigningSecret("flaky"))
	dispatcherRole(t, b.ns, names.SigningSecret("orders"))

	reg := prometheus.NewRegistry()
	const idle = 2 * time.Second
	s := runShared(t, a, shared.Options{RestConfig: saRestConfig(t, op.ns, sharedSA.Name), Dir: t.TempDir(), IdleAfter: idle, Logger: funcr.New(func(p, a string) { t.Log(p, a) }, funcr.Options{})}, reg)
	entries := func(aDigest string) []shared.Entry {
		return []shared.Entry{{Namespace: a.ns, Digest: aDigest}, {Namespace: b.ns, Digest: "01", Awake: true}}
	}
	s.Serve(entries("01"))
	asleep := func() bool { return slices.Equal(s.Asleep(), []string{a.ns}) }
	testenv.Eventually(t, 30*time.Second, asleep, "asleep: %v, want %s only", lazy(func() string { return strings.Join(s.Asleep(), ",") }), a.ns)
	if got := countersBy(t, reg, "webhook_shared_dispatcher_namespaces", "state"); got["asleep"] != 1 || got["awake"] != 1 {
		t.Errorf("webhook_shared_dispatcher_namespaces = %v, want one asleep and one awake", got)
	}

	// An event for the sleeping namespace wakes it and is delivered.
	published := time.Now()
	a.publish("order.created", "while-asleep", []byte(`{}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return orders[a.ns].Count("while-asleep") > 0 }, "the event published while %s slept was not delivered", a.ns)
	t.Logf("the first event after sleeping was received %v after it was published", orders[a.ns].Receipts()["while-asleep"].First.Sub(published).Round(time.Millisecond))
	if got := countersBy(t, reg, "webhook_shared_dispatcher_wakes_total", "reason"); got["event"] < 1 {
		t.Errorf("wakes by reason %v, want one by an event", got)
	}
	testenv.Eventually(t, 30*time.Second, asleep, "%s did not sleep again", a.ns)

	// A change of its entry wakes it.
	s.Serve(entries("02"))
	testenv.Eventually(t, 10*time.Second, func() bool {
		return countersBy(t, reg, "webhook_shared_dispatcher_wakes_total", "reason")["change"] == 1
	}, "a change of %s's entry did not wake it", a.ns)
	testenv.Eventually(t, 30*time.Second, asleep, "%s did not sleep again after the change", a.ns)

	// A retry waiting on the server's schedule lets it sleep, and wakes it when it falls due.
	a.publish("invoice.created", "retried", []byte(`{}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return calls.Load() == 1 }, "the flaky endpoint's first attempt")
	testenv.Eventually(t, 30*time.Second, asleep, "%s did not sleep while its retry waited", a.ns)
	testenv.Eventually(t, 60*time.Second, func() bool { return flaky.Count("retried") == 1 && flaky.RequestsByID()["retried"] == 2 }, "the retry due while %s slept was not delivered", a.ns)
	if got := countersBy(t, reg, "webhook_shared_dispatcher_wakes_total", "reason"); got["delivery"] < 1 {
		t.Errorf("wakes by reason %v, want one by a delivery (the retry)", got)
	}
	testenv.Eventually(t, 30*time.Second, asleep, "%s did not sleep once its retry was delivered", a.ns)
	if n := orders[b.ns].Count("while-asleep"); n != 0 {
		t.Errorf("namespace %s's receiver got %s's event", b.ns, a.ns)
	}
}

// sleepingNamespace is a namespace with one endpoint, orders (its receiver rcv), served by a
// shared dispatcher that lets it sleep after 2 s idle, once it sleeps; asleep says whether it
// does (and is the only one), reg is the shared dispatcher's metrics.
func sleepingNamespace(t *testing.T) (a *env, rcv *testenv.Receiver, reg *prometheus.Registry, asleep func() bool) {
	t.Helper()
	a = newEnv(t)
	op := a.sibling()
	sharedSA := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: op.ns, Name: "webhook-shared-dispatcher"}}
	if err := cp.Client.Create(context.Background(), sharedSA); err != nil {
		t.Fatal(err)
	}
	rcv = newReceiver(t, nil)
	rcv.Trust(a.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"}}))
	tokenGrant(t, a.ns, op.ns, sharedSA.Name)
	dispatcherRole(t, a.ns, names.SigningSecret("orders"))
	reg = prometheus.NewRegistry()
	s := runShared(t, a, shared.Options{RestConfig: saRestConfig(t, op.ns, sharedSA.Name), Dir: t.TempDir(), IdleAfter: 2 * time.Second,
		Logger: funcr.New(func(p, a string) { t.Log(p, a) }, funcr.Options{})}, reg)
	s.Serve([]shared.Entry{{Namespace: a.ns, Digest: "01"}})
	asleep = func() bool { return slices.Equal(s.Asleep(), []string{a.ns}) }
	testenv.Eventually(t, 30*time.Second, asleep, "%s did not sleep", a.ns)
	return a, rcv, reg, asleep
}

// A sleeping namespace's wake requests are asked again as soon as its watch connection is
// back: the server forgets a connection's pull requests when it goes, so without that an event
// published after a reconnection would wait for the requests' lost heartbeats (a minute).
func TestASleepingNamespaceIsWokenAfterItsWatchReconnected(t *testing.T) {
	a, rcv, reg, asleep := sleepingNamespace(t)

	// The server drops the watch connection; it connects again.
	watchName := "webhook-dispatcher " + a.ns + " watch"
	watchConn := func() uint64 {
		cz, err := a.nats.Server.Connz(&server.ConnzOptions{Limit: 1024})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cz.Conns {
			if c.Name == watchName {
				return c.Cid
			}
		}
		return 0
	}
	first := watchConn()
	if first == 0 {
		t.Fatalf("no connection named %q", watchName)
	}
	if err := a.nats.Server.DisconnectClientByID(first); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { c := watchConn(); return c != 0 && c != first }, "the watch did not connect again")
	if !asleep() {
		t.Fatalf("%s woke when its watch connected again", a.ns)
	}

	published := time.Now()
	a.publish("order.created", "after-reconnect", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return rcv.Count("after-reconnect") > 0 },
		"the event published after the watch connected again was not delivered (its wake requests were not asked again)")
	t.Logf("delivered %v after it was published", rcv.Receipts()["after-reconnect"].First.Sub(published).Round(time.Millisecond))
	if got := countersBy(t, reg, "webhook_shared_dispatcher_wakes_total", "reason"); got["event"] != 1 {
		t.Errorf("wakes by reason %v, want one by an event", got)
	}
}

// A wake request the server ends for another reason than its expiry or a waiting message (here
// the queue consumer deleted under a sleeping namespace) wakes the namespace, once: it is not
// asked again at once (an answer that repeats would loop), and the namespace sleeps again
// once it is idle with its consumer back.
func TestAWakeRequestEndedByTheServerWakesTheNamespaceOnce(t *testing.T) {
	a, rcv, reg, asleep := sleepingNamespace(t)
	ctx := context.Background()

	if err := a.js.DeleteConsumer(ctx, a.set.DeliveriesStream(), a.set.QueueConsumer()); err != nil {
		t.Fatal(err)
	}
	wakes := func() map[string]float64 {
		return countersBy(t, reg, "webhook_shared_dispatcher_wakes_total", "reason")
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return wakes()["watch"] >= 1 }, "deleting the queue consumer did not wake %s", a.ns)
	if err := a.set.EnsureQueueConsumer(ctx, a.js); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, asleep, "%s did not sleep again with its consumer back", a.ns)
	if got := wakes(); got["watch"] != 1 {
		t.Errorf("wakes by reason %v, want one by the watch", got)
	}
	a.publish("order.created", "after", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return rcv.Count("after") > 0 }, "the event published after it slept again was not delivered")
}

// countersBy reads metric name's values (gauge or counter) by their label from reg.
func countersBy(t testing.TB, reg prometheus.Gatherer, name, label string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
