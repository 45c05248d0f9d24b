package dataapi

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/deliveries"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// endpointsOf are what the reader needs of the namespace's endpoints (their patterns and what
// holds them), from r (the server's informer cache). An error reading them leaves the first
// attempts still in the events stream out of the page, not the page out.
func endpointsOf(ctx context.Context, r client.Reader, ns string) ([]deliveries.Endpoint, error) {
	if r == nil {
		return nil, nil
	}
	var list v1alpha1.WebhookEndpointList
	if err := r.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := make([]deliveries.Endpoint, 0, len(list.Items))
	for i := range list.Items {
		ep := &list.Items[i]
		out = append(out, deliveries.Endpoint{Name: ep.Name, Patterns: streams.EventPatterns(&ep.Spec), HeldReason: heldReason(ep), Lane: streams.LaneNow(ep)})
	}
	return out, nil
}

// heldReason is why an endpoint holds its deliveries, if it does.
func heldReason(ep *v1alpha1.WebhookEndpoint) string {
	switch {
	case meta.IsStatusConditionPresentAndEqual(ep.Status.Conditions, v1alpha1.ConditionDisabled, metav1.ConditionTrue):
		return datav1alpha1.HeldDisabled
	case ep.Spec.Suspend:
		return datav1alpha1.HeldSuspended
	case meta.IsStatusConditionPresentAndEqual(ep.Status.Conditions, v1alpha1.ConditionCircuitOpen, metav1.ConditionTrue):
		return datav1alpha1.HeldCircuitOpen
	}
	return ""
}
