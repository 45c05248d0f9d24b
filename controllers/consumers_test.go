package controllers

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// SuiteClient is the test suite's cluster-admin client on its control plane (set by TestMain).
var SuiteClient client.Client

// With cross-namespace sources allowed, the shared lane reads the events stream of every
// namespace its endpoints' spec.sourceNamespaces name and that consents through one intake
// consumer of the reader's (whose set is created if need be), however many endpoints read it,
// starting at the oldest such endpoint's creation, every event of the source; an endpoint of
// its own lane (per-key ordering) gets a consumer of its own there, filtered by its patterns. A
// source no endpoint names any more, or that withdraws its consent, loses them; one that never
// consented never gets one. Without it, no source namespace gets anything.
func TestSourceConsumers(t *testing.T) {
	k8s := SuiteClient
	n := testenv.NewNATS(t)
	for _, allow := range []bool{false, true} {
		cfg := opconfig.Default()
		cfg.NATS.URL = n.URL()
		cfg.AllowCrossNamespaceSources = allow
		js, err := ConnectJetStream(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer js.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		testenv.Eventually(t, 10*time.Second, js.Connected, "the connection to NATS")
		suffix := map[bool]string{false: "closed", true: "open"}[allow]
		ns, billing, shipping, closed := "router-"+suffix, "billing-"+suffix, "shipping-"+suffix, "closed-"+suffix
		readers := map[string]string{billing: "audit, " + ns, shipping: "*", closed: "audit"}
		for _, name := range []string{ns, billing, shipping, closed} {
			o := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
			if r, ok := readers[name]; ok {
				o.Annotations = map[string]string{consent.EventReaders: r}
			}
			if err := k8s.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		sets := &StreamSetCreator{Client: k8s, APIReader: k8s, NATS: js}
		r := &DispatcherReconciler{Client: k8s, NATS: js, Sets: sets, Options: &Options{Config: cfg}}
		created := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
		ep := func(name string, sources ...string) *v1alpha1.WebhookEndpoint {
			e := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(created)}}
			e.Spec.SourceNamespaces = sources
			e.Spec.EventTypes = []v1alpha1.EventTypePattern{"order.*"}
			return e
		}
		a, b, c := ep("a", billing), ep("b"), ep("c", shipping, billing, closed)
		d := ep("d", billing)
		d.Spec.Ordering = &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{Header: "X-Key"}}
		all := []*v1alpha1.WebhookEndpoint{a, b, c, d}
		if err := r.reconcileSources(ctx, ns, "", all); err != nil {
			t.Fatal(err)
		}
		consumer := func(src, name string) *jetstream.ConsumerConfig {
			t.Helper()
			cn, err := js.js.Consumer(ctx, cfg.Streams.For(src).EventsStream(), name)
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil
			}
			if err != nil {
				t.Fatal(err)
			}
			return &cn.CachedInfo().Config
		}
		intake := streams.IntakeConsumer(ns)
		for _, src := range []string{billing, shipping} {
			got := consumer(src, intake)
			if (got != nil) != allow {
				t.Errorf("allow=%v: the intake consumer on %s's events: %+v", allow, src, got)
			}
			if got != nil && (got.FilterSubject != "webhooks."+src+".>" || got.OptStartTime == nil || !got.OptStartTime.Equal(created)) {
				t.Errorf("allow=%v: the intake consumer on %s: filter %s start %v", allow, src, got.FilterSubject, got.OptStartTime)
			}
			for _, e := range []string{"a", "b", "c"} {
				if got := consumer(src, streams.EndpointConsumerOf(ns, e)); got != nil {
					t.Errorf("allow=%v: shared-lane endpoint %s has a consumer of its own on %s", allow, e, src)
				}
			}
		}
		if got := consumer(billing, streams.EndpointConsumerOf(ns, "d")); (got != nil) != allow || got != nil && got.FilterSubject != "webhooks."+billing+".order.*" {
			t.Errorf("allow=%v: d's (per-key ordering) own consumer on %s: %+v", allow, billing, got)
		}
		for _, src := range []string{billing, shipping} {
			// A source namespace's set comes with its streams ConfigMap, so it goes with it.
			err := k8s.Get(ctx, client.ObjectKey{Namespace: src, Name: names.StreamsConfigMap}, &corev1.ConfigMap{})
			if (err == nil) != allow {
				t.Errorf("allow=%v: streams ConfigMap of %s: %v", allow, src, err)
			}
		}
		if got := consumer(closed, intake); got != nil {
			t.Errorf("allow=%v: a consumer on %s, which does not consent", allow, closed)
		}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: closed, Name: names.StreamsConfigMap}, &corev1.ConfigMap{}); err == nil {
			t.Errorf("allow=%v: the streams of %s, which does not consent, were created", allow, closed)
		}
		// c stops reading shipping, which nobody else reads: the intake consumer there goes.
		c.Spec.SourceNamespaces = []string{billing}
		if err := r.reconcileSources(ctx, ns, "", all); err != nil {
			t.Fatal(err)
		}
		if got := consumer(shipping, intake); got != nil {
			t.Errorf("allow=%v: the intake keeps its consumer on %s, which nobody reads", allow, shipping)
		}
		if allow && consumer(billing, intake) == nil {
			t.Errorf("the intake lost its consumer on %s, which a and c still read", billing)
		}
		// billing withdraws its consent: the consumers there go.
		o := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: billing}}
		if err := k8s.Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+consent.EventReaders+`":"audit"}}}`))); err != nil {
			t.Fatal(err)
		}
		if err := r.reconcileSources(ctx, ns, "", all); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{intake, streams.EndpointConsumerOf(ns, "d")} {
			if got := consumer(billing, name); got != nil {
				t.Errorf("allow=%v: %s stays on %s, which withdrew its consent", allow, name, billing)
			}
		}
	}
}

// Upgrading from the router of an earlier version: the shared lane's intake and an endpoint's
// own consumer start right after what the router settled (the router wrote those deliveries),
// and the router's consumer goes once the intake and every endpoint of its own lane have theirs.
func TestRouterOfAnEarlierVersionIsRetired(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, cfg := connectedJetStream(t)
	const ns = "upgrading"
	set := cfg.Streams.For(ns)
	if err := set.Ensure(ctx, js.js); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := js.js.Publish(ctx, set.EventSubject("order.created"), []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	router, err := js.js.CreateConsumer(ctx, set.EventsStream(), set.RouterConsumerConfig(ns, "", time.Now().Add(-time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	// The router settled the first three events.
	batch, err := router.Fetch(3)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		info, err := router.Info(ctx)
		return err == nil && info.AckFloor.Stream == 3
	}, "the router's acknowledgements")
	r := &DispatcherReconciler{Client: SuiteClient, NATS: js, Options: &Options{Config: cfg}}
	eps := []*v1alpha1.WebhookEndpoint{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a", CreationTimestamp: metav1.NewTime(time.Now().Add(-time.Hour))}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b", CreationTimestamp: metav1.NewTime(time.Now().Add(-time.Hour))}},
	}
	hasRouter := func() bool {
		_, err := js.js.Consumer(ctx, set.EventsStream(), streams.RouterConsumer(ns, ""))
		return err == nil
	}
	// a rides the shared lane; b orders per key (its own lane, a consumer of its own).
	eps[1].Spec.Ordering = &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{Header: "X-Key"}}
	if err := r.reconcileSources(ctx, ns, "", eps); err != nil {
		t.Fatal(err)
	}
	if !hasRouter() {
		t.Fatal("the router's consumer went while the shared lane had no intake")
	}
	if err := set.EnsureSharedLane(ctx, js.js, eps[0].CreationTimestamp.Time); err != nil {
		t.Fatal(err)
	}
	if err := r.reconcileSources(ctx, ns, "", eps); err != nil {
		t.Fatal(err)
	}
	if !hasRouter() {
		t.Fatal("the router's consumer went while endpoint b had no consumer of its own")
	}
	start, err := eventsStart(ctx, js.js, set, eps[1])
	if err != nil {
		t.Fatal(err)
	}
	if start.Seq != 4 {
		t.Errorf("b's consumer starts at %+v, want right after the router's floor (4)", start)
	}
	if err := set.EnsureEventsConsumer(ctx, js.js, ns, eps[1].Name, []string{">"}, streams.EndpointConsumerOptions{MaxInFlight: 1, Timeout: time.Second, PerKey: true}, start); err != nil {
		t.Fatal(err)
	}
	if err := r.reconcileSources(ctx, ns, "", eps); err != nil {
		t.Fatal(err)
	}
	if hasRouter() {
		t.Error("the router's consumer stays although the intake and every endpoint of its own lane have theirs")
	}
	c, err := js.js.Consumer(ctx, set.EventsStream(), streams.IntakeConsumer(ns))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.CachedInfo().NumPending; p != 2 {
		t.Errorf("the intake has %d events pending, want the 2 the router had not settled", p)
	}
}
