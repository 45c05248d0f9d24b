package wake

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// What a dispatcher acts on changes the fingerprint and the namespace's digest; the health its
// dispatcher writes does not; the digest does not depend on the endpoints' order; a namespace
// with an endpoint that reads another's events or rides its own lane may not sleep.
func TestTheDigestFollowsWhatTheDispatcherActsOn(t *testing.T) {
	base := func() *v1alpha1.WebhookEndpoint {
		return &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "orders", Generation: 1}, Status: v1alpha1.WebhookEndpointStatus{Lane: "Shared"}}
	}
	now := metav1.Now()
	for name, change := range map[string]func(*v1alpha1.WebhookEndpoint){
		"spec":    func(ep *v1alpha1.WebhookEndpoint) { ep.Generation++ },
		"deleted": func(ep *v1alpha1.WebhookEndpoint) { ep.DeletionTimestamp = &now },
		"enabled": func(ep *v1alpha1.WebhookEndpoint) {
			ep.Annotations = map[string]string{v1alpha1.AnnotationEnable: now.Format("2006-01-02T15:04:05Z")}
		},
		"secrets":  func(ep *v1alpha1.WebhookEndpoint) { ep.Status.SecretsVersion = "v2" },
		"lane":     func(ep *v1alpha1.WebhookEndpoint) { ep.Status.Lane = "Own" },
		"shared":   func(ep *v1alpha1.WebhookEndpoint) { ep.Status.SharedSince = &now },
		"draining": func(ep *v1alpha1.WebhookEndpoint) { ep.Status.DrainingConsumers = []string{"S/c"} },
		"held": func(ep *v1alpha1.WebhookEndpoint) {
			ep.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Reason: v1alpha1.ReasonQuotaExceeded}}
		},
	} {
		ep := base()
		change(ep)
		if !Relevant(base(), ep) || Digest([]*v1alpha1.WebhookEndpoint{base()}) == Digest([]*v1alpha1.WebhookEndpoint{ep}) {
			t.Errorf("a change of %s is not seen", name)
		}
	}
	healthy := base()
	healthy.Status.Health = &v1alpha1.DeliveryHealth{}
	healthy.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionReady, Reason: v1alpha1.ReasonReady}}
	if Relevant(base(), healthy) {
		t.Errorf("the dispatcher's own health writes change the fingerprint")
	}
	other := base()
	other.Name = "audit"
	if Digest([]*v1alpha1.WebhookEndpoint{base(), other}) != Digest([]*v1alpha1.WebhookEndpoint{other, base()}) {
		t.Errorf("the digest depends on the order")
	}
	if Digest([]*v1alpha1.WebhookEndpoint{base()}) == Digest([]*v1alpha1.WebhookEndpoint{base(), other}) {
		t.Errorf("an endpoint added does not change the digest")
	}
	reader := base()
	reader.Spec.SourceNamespaces = []string{"shop"}
	own := base()
	own.Status.Lane = "Own"
	if !MaySleep([]*v1alpha1.WebhookEndpoint{base()}) || MaySleep([]*v1alpha1.WebhookEndpoint{base(), reader}) || MaySleep([]*v1alpha1.WebhookEndpoint{own}) {
		t.Errorf("MaySleep: a namespace that reads another's events or rides its own lane may sleep, or a plain one may not")
	}
}
