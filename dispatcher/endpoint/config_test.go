package endpoint

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// An endpoint the controller found beyond its dispatcher's bus grant (Ready False
// SourceGrantFull) reads its own namespace only: its source consumers would only be refused.
func TestSourcesBeyondTheGrantAreNotRead(t *testing.T) {
	noSecret := func(name string) (*corev1.Secret, error) { return nil, fmt.Errorf("secret %s not found", name) }
	for _, tc := range []struct {
		reason string
		want   []string
	}{
		{v1alpha1.ReasonReady, []string{"billing", "audit"}},
		{v1alpha1.ReasonSourceGrantFull, nil},
	} {
		ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"},
			Spec:   v1alpha1.WebhookEndpointSpec{URL: "https://hooks.example.com/", SourceNamespaces: []string{"billing", "audit"}},
			Status: v1alpha1.WebhookEndpointStatus{Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: tc.reason}}}}
		if got := Resolve(ep, nil, noSecret).Sources; !slices.Equal(got, tc.want) {
			t.Errorf("Ready reason %s: sources %v, want %v", tc.reason, got, tc.want)
		}
	}
}
