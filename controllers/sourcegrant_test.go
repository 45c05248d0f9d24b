package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// A dispatcher whose endpoints read more source consumers than one bus grant holds does not
// leave the last ones to pull in vain: each endpoint of its own lane (here per-key ordering)
// whose consumers are beyond the grant (the newest: the oldest are granted first, as the auth
// callout decides) is Ready False SourceGrantFull (Stalled), saying what to do; the endpoints
// within it are not. The shared lane reads each source through one intake consumer, granted
// first: a shared-lane endpoint is never beyond the grant, however many read the sources.
func TestEndpointsBeyondTheSourceGrantSaySo(t *testing.T) {
	ctx := context.Background()
	const reader = "grant-readers"
	if err := SuiteClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: reader}}); err != nil {
		t.Fatal(err)
	}
	// The longest names there are, so that few endpoints fill a grant.
	var sources []string
	for i := range 8 {
		name := fmt.Sprintf("grant-src-%d-", i)
		name += strings.Repeat("s", streams.MaxNamespaceLength-len(name))
		sources = append(sources, name)
		if err := SuiteClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{consent.EventReaders: "*"}}}); err != nil {
			t.Fatal(err)
		}
	}
	endpointName := func(i int) string { return fmt.Sprintf("e%04d-%s", i, strings.Repeat("x", 200)) }
	// How many endpoints overflow one grant, after the shared lane's intake consumers.
	var pairs []natsauth.SourceConsumer
	for _, src := range sources {
		pairs = append(pairs, natsauth.SourceConsumer{Stream: streams.DefaultNames().For(src).EventsStream(), Consumer: streams.IntakeConsumer(reader)})
	}
	n := 0
	for ; natsauth.FitSources(pairs) == len(pairs); n++ {
		for _, src := range sources {
			pairs = append(pairs, natsauth.SourceConsumer{Stream: streams.DefaultNames().For(src).EventsStream(),
				Consumer: streams.EndpointConsumerOf(reader, endpointName(n))})
		}
	}
	granted := natsauth.FitSources(pairs)/len(sources) - 1
	t.Logf("%d endpoints reading %d sources each: one grant holds the first %d", n, len(sources), granted)
	for i := range n {
		ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: reader, Name: endpointName(i)},
			Spec: v1alpha1.WebhookEndpointSpec{URL: "https://hooks.example.com/", SourceNamespaces: sources, EventTypes: []v1alpha1.EventTypePattern{">"},
				Ordering: &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{Header: "X-Key"}}}}
		if err := SuiteClient.Create(ctx, ep); err != nil {
			t.Fatal(err)
		}
	}
	// The newest of all rides the shared lane.
	shared := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: reader, Name: endpointName(n)},
		Spec: v1alpha1.WebhookEndpointSpec{URL: "https://hooks.example.com/", SourceNamespaces: sources, EventTypes: []v1alpha1.EventTypePattern{">"}}}
	if err := SuiteClient.Create(ctx, shared); err != nil {
		t.Fatal(err)
	}
	cfg := opconfig.Default()
	cfg.AllowCrossNamespaceSources = true
	check := func(callout bool) map[int]*problem {
		r := &EndpointReconciler{Client: SuiteClient, NATS: &JetStream{cfg: streams.DefaultConfig()},
			Options: &Options{Config: cfg, BusAuth: BusAuth{Callout: callout}}}
		out := map[int]*problem{}
		for _, i := range []int{0, granted - 1, granted, n - 1, n} {
			var ep v1alpha1.WebhookEndpoint
			if err := SuiteClient.Get(ctx, types.NamespacedName{Namespace: reader, Name: endpointName(i)}, &ep); err != nil {
				t.Fatal(err)
			}
			obs := &endpointObservation{}
			if err := r.validateSpec(ctx, &ep, obs); err != nil {
				t.Fatal(err)
			}
			out[i] = obs.found()
		}
		return out
	}
	for i, p := range check(true) {
		switch {
		case i == n && p != nil:
			t.Errorf("the shared-lane endpoint, the newest: %+v", p)
		case i == n:
		case i < granted && p != nil:
			t.Errorf("endpoint %d of %d, within the grant: %+v", i, n, p)
		case i >= granted && (p == nil || p.reason != v1alpha1.ReasonSourceGrantFull || !p.stalled):
			t.Errorf("endpoint %d of %d, beyond the grant of %d: %+v, want stalled %s", i, n, granted, p, v1alpha1.ReasonSourceGrantFull)
		case i >= granted && !strings.Contains(p.message, "spec.dispatcher.dedicated"):
			t.Errorf("the message does not say what to do: %s", p.message)
		}
	}
	// Without the auth callout nothing is granted per connection: no endpoint is held back.
	for i, p := range check(false) {
		if p != nil {
			t.Errorf("endpoint %d without the callout: %+v", i, p)
		}
	}
}
