package controllers

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A router starts at its oldest endpoint's creation and reads the namespaces its endpoints
// name in spec.sourceNamespaces only when the installation allows it; adding an endpoint that
// reads another namespace widens it without moving its start.
func TestRouterConsumer(t *testing.T) {
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
		deadline := time.Now().Add(10 * time.Second)
		for !js.Connected() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		r := &DispatcherReconciler{NATS: js, Options: &Options{Config: cfg}}
		ns := "router-" + map[bool]string{false: "closed", true: "open"}[allow]
		oldest := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
		ep := func(name string, created time.Time, sources ...string) *v1alpha1.WebhookEndpoint {
			e := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(created)}}
			e.Spec.SourceNamespaces = sources
			return e
		}
		eps := []*v1alpha1.WebhookEndpoint{ep("b", oldest.Add(time.Minute)), ep("a", oldest, "billing")}
		if err := r.reconcileRouter(ctx, ns, "", eps); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, ep("c", time.Now(), "shipping", "billing"))
		if err := r.reconcileRouter(ctx, ns, "", eps); err != nil {
			t.Fatal(err)
		}
		c, err := js.js.Consumer(ctx, cfg.Streams.Names.EventsStream, streams.RouterConsumer(ns, ""))
		if err != nil {
			t.Fatal(err)
		}
		got := c.CachedInfo().Config
		want := []string{"webhooks." + ns + ".>"}
		if allow {
			want = append(want, "webhooks.billing.>", "webhooks.shipping.>")
		}
		if f := streams.ConsumerFilters(got); !slices.Equal(f, want) {
			t.Errorf("allow=%v: filters %q, want %q", allow, f, want)
		}
		if got.OptStartTime == nil || !got.OptStartTime.Equal(oldest) {
			t.Errorf("allow=%v: start %v, want the oldest endpoint's creation %v", allow, got.OptStartTime, oldest)
		}
	}
}
