package natsauth_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// sourceEndpoint creates endpoint name in ns reading the events of sources.
func sourceEndpoint(t *testing.T, ns, name string, sources ...string) {
	t.Helper()
	// Ordered per key, so on its own lane: a consumer of its own on each source's stream.
	ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.WebhookEndpointSpec{URL: "https://receiver.example.com/" + name, EventTypes: []v1alpha1.EventTypePattern{"order.*"}, SourceNamespaces: sources,
			Ordering: &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{JSONField: "id"}}}}
	if err := cp.Client.Create(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
}

// consentTo sets (readers non-empty) or removes the consent of namespace ns to readers.
func consentTo(t *testing.T, ns, readers string) {
	t.Helper()
	ctx := context.Background()
	var o corev1.Namespace
	if err := cp.Client.Get(ctx, crclient.ObjectKey{Name: ns}, &o); err != nil {
		t.Fatal(err)
	}
	if o.Annotations == nil {
		o.Annotations = map[string]string{}
	}
	if readers == "" {
		delete(o.Annotations, consent.EventReaders)
	} else {
		o.Annotations[consent.EventReaders] = readers
	}
	if err := cp.Client.Update(ctx, &o); err != nil {
		t.Fatal(err)
	}
}

// pullOne asks consumer on stream for one message, without waiting for one to arrive.
func (c *client) pullOne(stream, consumer string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m, err := c.nc.RequestWithContext(ctx, "$JS.API.CONSUMER.MSG.NEXT."+stream+"."+consumer, []byte(`{"batch":1,"no_wait":true}`))
	if err != nil {
		return err
	}
	if status := m.Header.Get("Status"); status != "" {
		return &pullStatus{status + " " + m.Header.Get("Description")}
	}
	return m.Ack()
}

type pullStatus struct{ s string }

func (p *pullStatus) Error() string { return p.s }

// A dispatcher is granted its endpoints' consumers on a source namespace's stream as
// (stream, consumer) pairs, from the consent that holds when it connects: once the source
// withdraws it, the next connection is refused those consumers although they still exist.
func TestWithdrawnConsentClosesSourceAccess(t *testing.T) {
	w := newWorld(t, false)
	w.svc.Kube.SourceConsumers = controllers.SourceConsumers(cp.Client, streams.DefaultNames(), true)
	ctx := context.Background()
	b := busFor("b")
	serviceAccount(t, "a", "webhook-dispatcher", true)
	consentTo(t, "b", "a")
	sourceEndpoint(t, "a", "audit", "b")
	consumer := streams.EndpointConsumerOf("a", "audit")
	// The consumer the controller makes on b's events for a's endpoint.
	if _, err := w.admin.CreateConsumer(ctx, b.Events.Name, jetstream.ConsumerConfig{Durable: consumer,
		FilterSubject: "webhooks.b.order.*", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := w.admin.Publish(ctx, "webhooks.b.order.created", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	// A shared-lane endpoint of a reading b: a's intake consumer there, one for all of them.
	shared := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "audit-shared"},
		Spec: v1alpha1.WebhookEndpointSpec{URL: "https://receiver.example.com/shared", EventTypes: []v1alpha1.EventTypePattern{"order.*"}, SourceNamespaces: []string{"b"}}}
	if err := cp.Client.Create(ctx, shared); err != nil {
		t.Fatal(err)
	}
	intake := streams.IntakeConsumer("a")
	if _, err := w.admin.CreateConsumer(ctx, b.Events.Name, jetstream.ConsumerConfig{Durable: intake,
		FilterSubject: "webhooks.b.>", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	tok := token(t, "a", "webhook-dispatcher", natsauth.DefaultAudience)
	d := w.mustConnect(tok, "a")
	if err := d.pullOne(b.Events.Name, consumer); err != nil {
		t.Fatalf("a's dispatcher pulls its consumer on b's events while b consents: %v\n%s", err, d.violations())
	}
	if err := d.pullOne(b.Events.Name, intake); err != nil {
		t.Fatalf("a's dispatcher pulls its intake consumer on b's events while b consents: %v\n%s", err, d.violations())
	}
	// The grant names the stream: a consumer of that name on the stream of a namespace that
	// never consented (left there, say, by a failed clean-up) is not the dispatcher's.
	ensureNamespace(t, "c")
	createBus(t, w.admin, streams.DefaultConfig(), "c")
	cStream := busFor("c").Events.Name
	if _, err := w.admin.CreateConsumer(ctx, cStream, jetstream.ConsumerConfig{Durable: consumer,
		FilterSubject: "webhooks.c.order.*", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.Publish(ctx, "webhooks.c.order.created", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := d.pullOne(cStream, consumer); err == nil {
		t.Error("a's dispatcher pulled a consumer of its endpoint's name on c's events, which never consented")
	}

	consentTo(t, "b", "")
	d2 := w.mustConnect(tok, "a")
	if err := d2.pullOne(b.Events.Name, consumer); err == nil {
		t.Fatal("a's dispatcher, connecting after b withdrew its consent, pulled b's events")
	}
	if err := d2.pullOne(b.Events.Name, intake); err == nil {
		t.Fatal("a's dispatcher, connecting after b withdrew its consent, pulled b's events through its intake")
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(d2.violations(), `Publish to "$JS.API.CONSUMER.MSG.NEXT.`+b.Events.Name+`.`+consumer+`"`)
	}, "the pull is not refused: %s", d2.violations())
}

// A dispatcher whose endpoints read more source consumers than the 512 one grant once held
// gets them all: a namespace with 600 endpoints reading one source each pulls from the
// consumers of its first and last endpoints alike.
func TestDispatcherGetsAllItsSourceConsumers(t *testing.T) {
	const endpoints = 600
	w := newWorld(t, false)
	w.svc.Kube.SourceConsumers = controllers.SourceConsumers(cp.Client, streams.DefaultNames(), true)
	ctx := context.Background()
	ensureNamespace(t, "many")
	createBus(t, w.admin, streams.DefaultConfig(), "many")
	serviceAccount(t, "many", "webhook-dispatcher", true)
	consentTo(t, "b", "many")
	b := busFor("b")
	var names []string
	for i := range endpoints {
		name := fmt.Sprintf("ep-%04d", i)
		names = append(names, name)
		sourceEndpoint(t, "many", name, "b")
		if _, err := w.admin.CreateConsumer(ctx, b.Events.Name, jetstream.ConsumerConfig{Durable: streams.EndpointConsumerOf("many", name),
			FilterSubject: "webhooks.b.order.*", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.admin.Publish(ctx, "webhooks.b.order.created", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	w.svc.Timeout = natsauth.ConnectTimeout // listing 600 endpoints past any cache
	d := w.mustConnect(token(t, "many", "webhook-dispatcher", natsauth.DefaultAudience), "many")
	for _, name := range []string{names[0], names[511], names[512], names[endpoints-1]} {
		if err := d.pullOne(b.Events.Name, streams.EndpointConsumerOf("many", name)); err != nil {
			t.Errorf("the consumer of %s on b's events: %v", name, err)
		}
	}
	if v := d.violations(); v != "" {
		t.Errorf("refused:\n%s", v)
	}
}
