package controllers

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
)

// An endpoint reading another namespace's events needs the installation's flag and the source
// namespace's consent; without either it is Ready False SourceNotAllowed (Stalled), and the
// message says what the installer or the source namespace's owner must do.
func TestSourceNamespacesNeedConsent(t *testing.T) {
	ctx := context.Background()
	for name, readers := range map[string]string{"src-open": "shop, audit", "src-everyone": "*", "src-closed": "audit"} {
		o := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{consent.EventReaders: readers}}}
		if err := SuiteClient.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if err := SuiteClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "src-silent"}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		allow   bool
		sources []string
		want    string // the Stalled message, "" for none
	}{
		{true, []string{"src-open", "src-everyone", "shop"}, ""},
		{false, []string{"src-open"}, "spec.sourceNamespaces (src-open) needs the operator's --allow-cross-namespace-sources; remove it or ask the installer"},
		{true, []string{"src-open", "src-closed"}, `spec.sourceNamespaces: namespace src-closed does not consent to namespace shop reading its events: its owner must annotate Namespace src-closed with webhook-operator.io/event-readers: "audit,shop" (comma-separated namespace names, or "*" for all)`},
		{true, []string{"src-silent"}, `spec.sourceNamespaces: namespace src-silent does not consent to namespace shop reading its events: its owner must annotate Namespace src-silent with webhook-operator.io/event-readers: "shop" (comma-separated namespace names, or "*" for all)`},
		{true, []string{"kube-system"}, `spec.sourceNamespaces: namespace kube-system is excluded by the installation (--excluded-namespaces, the chart's excludedNamespaces): no endpoint reads its events`},
		{true, []string{"src-missing"}, `spec.sourceNamespaces: namespace src-missing does not exist; once created, it consents to namespace shop reading its events with the annotation webhook-operator.io/event-readers: "shop"`},
	} {
		cfg := opconfig.Default()
		cfg.AllowCrossNamespaceSources = tc.allow
		r := &EndpointReconciler{Client: SuiteClient, Options: &Options{Config: cfg, ExcludedNamespaces: []string{"kube-system"}}}
		ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"},
			Spec: v1alpha1.WebhookEndpointSpec{URL: "https://hooks.example.com/", SourceNamespaces: tc.sources}}
		obs := &endpointObservation{}
		if err := r.validateSpec(ctx, ep, obs); err != nil {
			t.Fatal(err)
		}
		switch {
		case tc.want == "" && obs.found() != nil:
			t.Errorf("%v: %+v", tc.sources, obs.found())
		case tc.want == "":
		case obs.found() == nil || obs.found().reason != v1alpha1.ReasonSourceNotAllowed || !obs.found().stalled || obs.found().message != tc.want:
			t.Errorf("%v (allow=%v): got %+v, want stalled %s: %s", tc.sources, tc.allow, obs.found(), v1alpha1.ReasonSourceNotAllowed, tc.want)
		}
	}
}
