package controllers_test

import (
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// A filter or transformation that does not compile, gives the wrong type or may cost too much
// makes the endpoint Ready False and Stalled (kstatus Failed) with the error's place in the
// expression, and nothing is wired for it; fixing the expression wires it.
func TestInvalidExpressionsAreStalled(t *testing.T) {
	ns := newNamespace(t)
	filter := func(src string) func(*v1alpha1.WebhookEndpoint) {
		return func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Filter = src }
	}
	transform := func(body string, headers map[string]string) func(*v1alpha1.WebhookEndpoint) {
		return func(ep *v1alpha1.WebhookEndpoint) {
			ep.Spec.Transform = &v1alpha1.TransformSpec{Body: body, Headers: headers}
		}
	}
	cases := map[string]struct {
		change  func(*v1alpha1.WebhookEndpoint)
		reason  string
		message string
	}{
		"undeclared": {filter("payload.total > 100 &&\n  paylod.currency == \"EUR\""), v1alpha1.ReasonInvalidFilter,
			"spec.filter: 2:3: undeclared reference to 'paylod'"},
		"not-a-bool": {filter(`payload.currency + "!"`), v1alpha1.ReasonInvalidFilter,
			"spec.filter: 1:1: a filter must give a bool"},
		"too-costly": {filter(`payload.items.exists(x, payload.items.exists(y, x != y && x.sku == y.sku))`), v1alpha1.ReasonInvalidFilter,
			"spec.filter: the expression may cost too much"},
		"bad-body": {transform(`{"text": "Order " + payload.order_id +}`, nil), v1alpha1.ReasonInvalidTransform,
			"spec.transform.body: 1:39: Syntax error"},
		"bad-header": {transform("", map[string]string{"X-Items": "payload.items.map(i, i.sku)"}), v1alpha1.ReasonInvalidTransform,
			"spec.transform.headers.X-Items: 1:1: a header value must be a string"},
	}
	for name, c := range cases {
		create(t, endpoint(ns, name, c.change))
	}
	create(t, endpoint(ns, "valid", filter(`payload.total > 100 && payload.currency == "EUR"`),
		transform(`{"text": "Order " + payload.order_id + " paid"}`, map[string]string{"X-Order-Id": "payload.order_id"})))

	for name, c := range cases {
		ep := eventuallyReady(t, ns, name, "False/"+c.reason)
		g := NewWithT(t)
		ready := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady)
		g.Expect(ready.Message).To(HavePrefix(c.message), name)
		g.Expect(meta.IsStatusConditionTrue(ep.Status.Conditions, v1alpha1.ConditionStalled)).To(BeTrue(), name)
		g.Expect(ep.Status.ConsumerName).To(BeEmpty(), "%s: nothing is delivered to a refused endpoint", name)
		g.Expect(consumerExists(g, layout.For(ns).DeliveriesStream(), layout.For(ns).EndpointConsumer(name))).To(BeFalse())
	}
	expectHealth(t, ns, "undeclared", &v1alpha1.WebhookEndpoint{}, status.FailedStatus, "Degraded")
	eventuallyReady(t, ns, "valid", "False/"+v1alpha1.ReasonDispatcherUnavailable)

	// Fixing the expression wires the endpoint and clears Stalled.
	updateEndpoint(t, ns, "undeclared", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Filter = "payload.total > 100 &&\n  payload.currency == \"EUR\""
	})
	updateEndpoint(t, ns, "bad-body", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Transform.Body = `{"text": "Order " + payload.order_id + " paid"}`
	})
	markAvailable(t, ns, "webhook-dispatcher")
	for _, name := range []string{"undeclared", "bad-body", "valid"} {
		ep := eventuallyReady(t, ns, name, "True/Ready")
		g := NewWithT(t)
		g.Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionStalled)).To(BeNil(), name)
		g.Expect(ep.Status.ConsumerName).NotTo(BeEmpty(), name)
	}
	expectHealth(t, ns, "undeclared", &v1alpha1.WebhookEndpoint{}, status.CurrentStatus, "Healthy")
}
