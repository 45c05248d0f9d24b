package consent

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/webhook-operator/webhook-operator/internal/names"
)

func TestSecret(t *testing.T) {
	ep := &metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: "uid-orders"}
	controlled := []metav1.OwnerReference{{APIVersion: "webhook-operator.io/v1alpha1", Kind: "WebhookEndpoint", Name: "orders", UID: "uid-orders", Controller: ptr(true)}}
	for _, tc := range []struct {
		name      string
		ann       map[string]string
		generated bool // controlled by the endpoint
		reserved  string
		never     bool
		want      string // substring of the refusal; "" allows
	}{
		{"listed", map[string]string{AllowedEndpoints: "orders"}, false, "", false, ""},
		{"listed among others", map[string]string{AllowedEndpoints: " crm , orders,"}, false, "", false, ""},
		{"everyone", map[string]string{AllowedEndpoints: "*"}, false, "", false, ""},
		{"no annotation", nil, false, "", false, `annotate it with webhook-operator.io/allowed-endpoints: "orders"`},
		{"someone else", map[string]string{AllowedEndpoints: "crm"}, false, "", false, `(webhook-operator.io/allowed-endpoints is "crm"): its owner must set it to "crm,orders"`},
		{"a prefix is not a name", map[string]string{AllowedEndpoints: "order"}, false, "", false, "does not consent to endpoint orders"},
		{"empty", map[string]string{AllowedEndpoints: ""}, false, "", false, "does not consent"},
		{"generated", nil, true, "", false, ""},
		// The reserved list comes before the owner: an owner reference is written by whoever
		// may write the Secret.
		{"reserved by the installation, controlled by the endpoint", map[string]string{AllowedEndpoints: "*"}, true, "in the operator's own namespace ops", true, "is in the operator's own namespace ops, which no endpoint may ever use"},
		{"service account token", map[string]string{corev1.ServiceAccountNameKey: "default", AllowedEndpoints: "*"}, false, "", true, "is a ServiceAccount token"},
		{"service account token, generated name", map[string]string{corev1.ServiceAccountNameKey: "default"}, true, "", true, "ServiceAccount token"},
		{"reserved", map[string]string{AllowedEndpoints: "*"}, false, "the operator's NATS credentials", true, "is the operator's NATS credentials, which no endpoint may ever use"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &metav1.ObjectMeta{Namespace: "shop", Name: "orders-auth", Annotations: tc.ann}
			if tc.generated {
				s.OwnerReferences = controlled
			}
			err := Secret(s, ep, tc.reserved)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("got %v, want a *Refusal", err)
			}
			if r.Never != tc.never || !strings.Contains(r.Message, tc.want) {
				t.Fatalf("got %+v, want never=%v and a message containing %q", r, tc.never, tc.want)
			}
		})
	}
}

// What the Secret's name and labels reserve is refused whatever owns it or says it consents; the
// one Secret of the operator an endpoint uses is the signing Secret generated for it.
func TestSecretReservedBeforeOwnership(t *testing.T) {
	ep := &metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: "uid-orders"}
	controlled := []metav1.OwnerReference{{APIVersion: "webhook-operator.io/v1alpha1", Kind: "WebhookEndpoint", Name: "orders", UID: "uid-orders", Controller: ptr(true)}}
	ours := map[string]string{names.LabelManagedBy: names.LabelManagedByValue}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   string // substring of the refusal; "" allows
	}{
		{names.NATSSecret, nil, "is the operator's NATS credentials (mirrored into dispatcher namespaces), which no endpoint may ever use"},
		{names.OTELSecret, ours, "is the operator's tracing credentials"},
		{"crm-signing", ours, "is an object the operator manages (labelled app.kubernetes.io/managed-by=webhook-operator)"},
		{"nats-credentials", map[string]string{LabelPartOf: LabelPartOfValue}, "is part of the operator's installation"},
		{names.SigningSecret("orders"), ours, ""},
	} {
		for _, owned := range []bool{false, true} {
			s := &metav1.ObjectMeta{Namespace: "shop", Name: tc.name, Labels: tc.labels, Annotations: map[string]string{AllowedEndpoints: "*"}}
			if owned {
				s.OwnerReferences = controlled
			}
			err := Secret(s, ep, "")
			switch {
			case tc.want == "" && owned && err != nil:
				t.Errorf("%s, controlled by the endpoint: %v", tc.name, err)
			case tc.want == "" && !owned && err == nil:
				// Not controlled by the endpoint: another endpoint's generated Secret.
				t.Errorf("%s, not controlled by the endpoint: allowed", tc.name)
			case tc.want != "":
				var r *Refusal
				if !errors.As(err, &r) || !r.Never || !strings.Contains(r.Message, tc.want) {
					t.Errorf("%s (controlled by the endpoint: %v): %v, want never usable: %q", tc.name, owned, err, tc.want)
				}
			}
		}
	}
}

// Owned by the endpoint but not as its controller, or by another object of the same name: no
// consent.
func TestSecretOwnedOtherwise(t *testing.T) {
	ep := &metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: "uid-orders"}
	for _, ref := range []metav1.OwnerReference{
		{Kind: "WebhookEndpoint", Name: "orders", UID: "uid-orders"},
		{Kind: "WebhookEndpoint", Name: "orders", UID: "uid-other", Controller: ptr(true)},
	} {
		s := &metav1.ObjectMeta{Namespace: "shop", Name: "orders-signing", OwnerReferences: []metav1.OwnerReference{ref}}
		if err := Secret(s, ep, ""); err == nil {
			t.Errorf("owner reference %+v: allowed", ref)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestSource(t *testing.T) {
	ns := func(ann map[string]string) metav1.Object {
		return &metav1.ObjectMeta{Name: "billing", Annotations: ann}
	}
	if err := Source(ns(nil), "billing"); err != nil {
		t.Errorf("a namespace reading itself: %v", err)
	}
	if err := Source(ns(map[string]string{EventReaders: "shop, audit"}), "audit"); err != nil {
		t.Errorf("listed reader: %v", err)
	}
	if err := Source(ns(map[string]string{EventReaders: "*"}), "audit"); err != nil {
		t.Errorf("everyone: %v", err)
	}
	err := Source(ns(map[string]string{EventReaders: "shop"}), "audit")
	if err == nil || !strings.Contains(err.Error(), `annotate Namespace billing with webhook-operator.io/event-readers: "shop,audit"`) {
		t.Errorf("unlisted reader: %v", err)
	}
	if err := Source(ns(nil), "audit"); err == nil || !strings.Contains(err.Error(), `event-readers: "audit"`) {
		t.Errorf("no annotation: %v", err)
	}
}

func TestNamesIsBounded(t *testing.T) {
	if n := len(Names(strings.Repeat("a,", 10000))); n != maxListed {
		t.Fatalf("%d names read, want %d", n, maxListed)
	}
}

// TestSecretMetadataDecidesTheSame: what a reader keeps of a Secret (SecretMetadata) gives the
// same decision as the whole Secret, for every case Secret and Reserved tell apart, and drops
// what they do not read.
func TestSecretMetadataDecidesTheSame(t *testing.T) {
	ep := &metav1.ObjectMeta{Namespace: "shop", Name: "orders", UID: "uid-orders"}
	owner := func(name, uid string, controller bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "webhook-operator.io/v1alpha1", Kind: "WebhookEndpoint", Name: name, UID: types.UID(uid), Controller: ptr(controller)}
	}
	noise := map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 512), "team": "a"}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range noise {
			out[k] = v
		}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	for _, s := range []metav1.ObjectMeta{
		{Name: "a", Annotations: with(nil, AllowedEndpoints, "orders")},
		{Name: "b", Annotations: with(nil, AllowedEndpoints, "crm")},
		{Name: "c", Annotations: with(nil)},
		{Name: "d", Annotations: with(nil, corev1.ServiceAccountNameKey, "default", AllowedEndpoints, "*")},
		{Name: names.NATSSecret, Annotations: with(nil, AllowedEndpoints, "*")},
		{Name: "e", Labels: with(nil, names.LabelManagedBy, names.LabelManagedByValue), Annotations: with(nil, AllowedEndpoints, "*")},
		{Name: names.SigningSecret("orders"), Labels: with(nil, names.LabelManagedBy, names.LabelManagedByValue),
			OwnerReferences: []metav1.OwnerReference{owner("other", "uid-other", false), owner("orders", "uid-orders", true)}},
		{Name: names.SigningSecret("orders"), Labels: with(nil, names.LabelManagedBy, names.LabelManagedByValue),
			OwnerReferences: []metav1.OwnerReference{owner("orders", "uid-orders", false)}},
		{Name: "f", Labels: with(nil, LabelPartOf, LabelPartOfValue), Annotations: with(nil, AllowedEndpoints, "*")},
		{Name: "g", OwnerReferences: []metav1.OwnerReference{owner("orders", "uid-orders", true)}},
	} {
		s.Namespace, s.ResourceVersion = "shop", "7"
		s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
		kept := SecretMetadata(s)
		if got, want := errString(Secret(&kept, ep, "")), errString(Secret(&s, ep, "")); got != want {
			t.Errorf("Secret %s with what is kept: %q, with the whole: %q", s.Name, got, want)
		}
		if kept.ResourceVersion != "7" || kept.Name != s.Name || len(kept.ManagedFields) != 0 || len(kept.OwnerReferences) > 1 ||
			kept.Annotations["team"] != "" || kept.Labels["team"] != "" {
			t.Errorf("Secret %s: kept %+v", s.Name, kept)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
