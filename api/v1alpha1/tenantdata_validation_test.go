package v1alpha1_test

import (
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The API server refuses, with a message naming the rule, a quota not named default, an
// erasure selecting nothing or with until before since, a change of an erasure's spec, and a
// payload retention under a second.
func TestTenantDataValidation(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	for name, tc := range map[string]struct{ doc, want string }{
		"a second quota": {`{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookQuota","metadata":{"name":"team"},"spec":{"maxEndpoints":1}}`,
			"a namespace has one WebhookQuota, and it is named default"},
		"a negative count": {`{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookQuota","metadata":{"name":"default"},"spec":{"maxEndpoints":-1}}`,
			"spec.maxEndpoints"},
		"an erasure of nothing": {`{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookErasure","metadata":{"name":"x"},"spec":{}}`,
			"select what to erase"},
		"until before since": {`{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookErasure","metadata":{"name":"y"},"spec":{"since":"2026-02-01T00:00:00Z","until":"2026-01-01T00:00:00Z"}}`,
			"until must be later than since"},
		"a retention under a second": {`{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookEndpoint","metadata":{"name":"r"},"spec":{"url":"https://x.example.com/","eventTypes":["a"],"payloadRetention":{"deadLetters":"10ms"}}}`,
			"payload retention must be at least 1s"},
	} {
		u := decode(t, tc.doc)
		u.SetNamespace(ns)
		err := k8s.Create(ctx, u)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
	wx := decode(t, `{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookErasure","metadata":{"name":"z"},"spec":{"eventIDs":["e1"]}}`)
	wx.SetNamespace(ns)
	if err := k8s.Create(ctx, wx); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "z"}, wx); err != nil {
		t.Fatal(err)
	}
	wx.Object["spec"] = map[string]any{"eventIDs": []any{"e2"}}
	if err := k8s.Update(ctx, wx); err == nil || !strings.Contains(err.Error(), "spec is immutable") {
		t.Errorf("changing an erasure's spec: %v", err)
	}
}
