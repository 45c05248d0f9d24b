package controllers

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
)

// In callout mode a dispatcher gets its own projected token and nothing of the NATS Secret but
// its TLS material: no credential reaches its namespace.
func TestDispatcherInCalloutModeHoldsNoCredential(t *testing.T) {
	auth := BusAuth{Callout: true, Audience: natsauth.DefaultAudience}
	secret := map[string][]byte{"user": []byte("admin"), "password": []byte("s3cret"), "token": []byte("t"), "creds": []byte("c"),
		"ca.crt": []byte("ca"), "tls.crt": []byte("crt"), "tls.key": []byte("key"), "url": []byte("nats://x")}
	d := &dispatcher{Namespace: "shop", Name: names.SharedDispatcher, Image: "img", Replicas: 1, Auth: auth,
		NATS: newMirror(auth.mirroredKeys(secret))}
	for k := range d.NATS.Data {
		if !slices.Contains(tlsKeys, k) {
			t.Errorf("the mirror holds %q", k)
		}
	}
	if len(d.NATS.Data) != 3 {
		t.Errorf("the mirror holds %d keys, want ca.crt, tls.crt and tls.key", len(d.NATS.Data))
	}
	pod := d.deployment().Spec.Template.Spec
	c := pod.Containers[0]
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			t.Errorf("environment variable %s comes from a Secret", *e.Name)
		}
	}
	for _, want := range []string{"--nats-token-file=/var/run/secrets/nats.webhook-operator.io/token",
		"--nats-ca-file=" + natsMountPath + "/ca.crt", "--nats-cert-file=" + natsMountPath + "/tls.crt", "--nats-key-file=" + natsMountPath + "/tls.key"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("no argument %s in %v", want, c.Args)
		}
	}
	var projected bool
	for _, v := range pod.Volumes {
		if v.Projected == nil {
			continue
		}
		sat := v.Projected.Sources[0].ServiceAccountToken
		projected = *sat.Audience == natsauth.DefaultAudience && *sat.ExpirationSeconds == defaultTokenSeconds && *sat.Path == "token"
	}
	if !projected {
		t.Errorf("no projected token of audience %s in %+v", natsauth.DefaultAudience, pod.Volumes)
	}

	// Without the callout, the credentials are mirrored as before.
	if got := (BusAuth{}).mirroredKeys(secret); len(got) != len(secret) {
		t.Errorf("legacy mode mirrors %d of %d keys", len(got), len(secret))
	}
}

// Only the ServiceAccounts the controller made for dispatchers are dispatchers to the callout.
func TestDispatcherServiceAccounts(t *testing.T) {
	ctx := context.Background()
	c := SuiteClient
	ns := "bus-identity"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	dedicated := names.DedicatedDispatcher("orders")
	for _, sa := range []*corev1.ServiceAccount{
		{ObjectMeta: metav1.ObjectMeta{Name: names.SharedDispatcher, Namespace: ns, Labels: dispatcherLabels(names.SharedDispatcher, "")}},
		{ObjectMeta: metav1.ObjectMeta{Name: dedicated, Namespace: ns, Labels: dispatcherLabels(dedicated, "orders"),
			Annotations: map[string]string{names.AnnotationEndpoint: "orders"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "impostor", Namespace: ns}},
		// Labelled by someone else for another dispatcher's name.
		{ObjectMeta: metav1.ObjectMeta{Name: "copycat", Namespace: ns, Labels: dispatcherLabels(names.SharedDispatcher, "")}},
	} {
		if err := c.Create(ctx, sa); err != nil {
			t.Fatal(err)
		}
	}
	lookup := DispatcherServiceAccounts(c)
	for _, tc := range []struct {
		name, endpoint string
		ok             bool
	}{
		{names.SharedDispatcher, "", true},
		{dedicated, "orders", true},
		{"impostor", "", false},
		{"copycat", "", false},
		{"missing", "", false},
	} {
		acct, ok, err := lookup(ctx, ns, tc.name)
		if err != nil || ok != tc.ok || acct.Endpoint != tc.endpoint {
			t.Errorf("%s: endpoint %q, dispatcher %v, %v; want %q, %v", tc.name, acct.Endpoint, ok, err, tc.endpoint, tc.ok)
		}
		if ok {
			var sa corev1.ServiceAccount
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: tc.name}, &sa); err != nil || acct.UID != string(sa.UID) || acct.UID == "" {
				t.Errorf("%s: UID %q, want the ServiceAccount's %q (%v)", tc.name, acct.UID, sa.UID, err)
			}
		}
	}
}
