package v1alpha1_test

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// The Go defaults (Default) are the schema's: an endpoint stored by the API server and the
// same endpoint defaulted in Go have equal specs, for every field the schema defaults.
func TestGoDefaultsAreTheSchemas(t *testing.T) {
	ns := namespace(t)
	ctx := context.Background()
	perKey := &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{Header: "X-Key"}}
	for name, spec := range map[string]v1alpha1.WebhookEndpointSpec{
		"minimal":  {},
		"per-key":  {Ordering: perKey},
		"explicit": {Timeout: &metav1.Duration{Duration: 3 * time.Second}, MaxInFlight: new(int32(7))},
	} {
		spec.URL = "https://receiver.example.com/" + name
		spec.EventTypes = []v1alpha1.EventTypePattern{"order.*"}
		ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
		if err := k8s.Create(ctx, ep); err != nil {
			t.Fatal(err)
		}
		stored := &v1alpha1.WebhookEndpoint{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(ep), stored); err != nil {
			t.Fatal(err)
		}
		local := spec.DeepCopy()
		local.Default()
		if !equality.Semantic.DeepEqual(&stored.Spec, local) {
			a, _ := json.Marshal(stored.Spec)
			b, _ := json.Marshal(local)
			t.Errorf("%s: the API server stored\n%s\nGo defaults give\n%s", name, a, b)
		}
	}
	// An empty ordering gets the default mode.
	empty := v1alpha1.WebhookEndpointSpec{Ordering: &v1alpha1.OrderingSpec{}}
	empty.Default()
	if empty.Ordering.Mode != v1alpha1.OrderingBestEffort {
		t.Errorf("ordering: {} defaults to %q", empty.Ordering.Mode)
	}
}
