package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// SuiteClient is the test suite's cluster-admin client on its control plane (set by TestMain).
var SuiteClient client.Client

// A router starts at its oldest endpoint's creation and reads its own namespace's events
// stream; when the installation allows it, it also reads, through a consumer of the same name
// on each of their events streams, the namespaces its endpoints name in spec.sourceNamespaces
// (their sets are created if need be). A source no endpoint names any more loses the router's
// consumer.
func TestRouterConsumer(t *testing.T) {
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
		ns, billing, shipping := "router-"+suffix, "billing-"+suffix, "shipping-"+suffix
		for _, name := range []string{ns, billing, shipping} {
			if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
				t.Fatal(err)
			}
		}
		sets := &StreamSetCreator{Client: k8s, APIReader: k8s, NATS: js}
		r := &DispatcherReconciler{Client: k8s, NATS: js, Sets: sets, Options: &Options{Config: cfg}}
		oldest := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
		ep := func(name string, created time.Time, sources ...string) *v1alpha1.WebhookEndpoint {
			e := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(created)}}
			e.Spec.SourceNamespaces = sources
			return e
		}
		eps := []*v1alpha1.WebhookEndpoint{ep("b", oldest.Add(time.Minute)), ep("a", oldest, billing)}
		if err := r.reconcileRouter(ctx, ns, "", eps); err != nil {
			t.Fatal(err)
		}
		withC := append(eps, ep("c", time.Now(), shipping, billing))
		if err := r.reconcileRouter(ctx, ns, "", withC); err != nil {
			t.Fatal(err)
		}
		router := func(src string) *jetstream.ConsumerConfig {
			t.Helper()
			c, err := js.js.Consumer(ctx, cfg.Streams.For(src).EventsStream(), streams.RouterConsumer(ns, ""))
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil
			}
			if err != nil {
				t.Fatal(err)
			}
			return &c.CachedInfo().Config
		}
		own := router(ns)
		if own == nil || own.FilterSubject != "webhooks."+ns+".>" {
			t.Fatalf("allow=%v: own router %+v", allow, own)
		}
		for _, src := range []string{billing, shipping} {
			got := router(src)
			if (got != nil) != allow {
				t.Errorf("allow=%v: router on %s's events: %+v", allow, src, got)
			}
			if got != nil && (got.FilterSubject != "webhooks."+src+".>" || got.OptStartTime == nil || !got.OptStartTime.Equal(oldest)) {
				t.Errorf("allow=%v: router on %s: filter %s start %v", allow, src, got.FilterSubject, got.OptStartTime)
			}
			// A source namespace's set comes with its streams ConfigMap, so it goes with it.
			err := k8s.Get(ctx, client.ObjectKey{Namespace: src, Name: names.StreamsConfigMap}, &corev1.ConfigMap{})
			if (err == nil) != allow {
				t.Errorf("allow=%v: streams ConfigMap of %s: %v", allow, src, err)
			}
		}
		if own.OptStartTime == nil || !own.OptStartTime.Equal(oldest) {
			t.Errorf("allow=%v: start %v, want the oldest endpoint's creation %v", allow, own.OptStartTime, oldest)
		}
		// Endpoint c goes: shipping is read no more.
		if err := r.reconcileRouter(ctx, ns, "", eps); err != nil {
			t.Fatal(err)
		}
		if got := router(shipping); got != nil {
			t.Errorf("allow=%v: the router keeps its consumer on %s, which no endpoint reads", allow, shipping)
		}
		if allow && router(billing) == nil {
			t.Errorf("the router lost its consumer on %s, which endpoint a still reads", billing)
		}
	}
}
