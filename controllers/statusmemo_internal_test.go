package controllers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
)

// The memo gives what this process wrote while the cache shows an older status, and forgets it
// once the cache shows the write: endpoints at rest cost it nothing.
func TestTheStatusMemoForgetsAWriteTheCacheShows(t *testing.T) {
	var m statusMemo[v1alpha1.WebhookEndpointStatus]
	ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "orders", UID: "u1"}}
	older := v1alpha1.WebhookEndpointStatus{Conditions: []metav1.Condition{*conditions.False(v1alpha1.ConditionReady, v1alpha1.ReasonDispatcherUnavailable, "waiting")}}
	written := v1alpha1.WebhookEndpointStatus{ObservedGeneration: 1, Conditions: []metav1.Condition{*conditions.True(v1alpha1.ConditionReady, v1alpha1.ReasonReady, "delivers")}}
	m.put(ep, written)

	if got, ok := m.get(ep, older); !ok || got.ObservedGeneration != 1 {
		t.Fatalf("with the cache behind: %+v, %v; want what was written", got, ok)
	}
	replaced := ep.DeepCopy()
	replaced.UID = "u2"
	if _, ok := m.get(replaced, older); ok {
		t.Fatal("an object of the same name but another uid got the old one's status")
	}
	if _, ok := m.get(ep, *written.DeepCopy()); ok {
		t.Fatal("the cache shows the write, yet the memo gave it")
	}
	if n := m.len(); n != 0 {
		t.Fatalf("the memo holds %d statuses once the cache showed the write", n)
	}
	if _, ok := m.get(ep, older); ok {
		t.Fatal("a forgotten status came back")
	}
}
