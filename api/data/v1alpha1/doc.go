// Package v1alpha1 is the data.webhook-operator.io/v1alpha1 API that `webhook-operator
// apiserver` serves through the Kubernetes aggregation layer (internal/dataapi): what the
// streams hold, as read-mostly Kubernetes resources of a namespace.
//
//   - WebhookDelivery: one delivery of an event to an endpoint and its state (get, list,
//     watch); its payload subresource (DeliveryPayload) holds the event's body and the last
//     response's body, under its own RBAC.
//   - WebhookDeadLetter: a delivery given up (get, list, delete: a purge); payload subresource.
//   - WebhookEvent: an event published into the namespace's events stream (create).
//
// These are no CRDs: nothing here is stored in etcd, and the types are registered with the
// API server's own scheme (AddToScheme), in this version and as its internal version.
//
// +kubebuilder:object:generate=true
// +kubebuilder:ac:generate=false
// +kubebuilder:skip
// +k8s:openapi-gen=true
// +k8s:openapi-model-package=io.webhook-operator.data.v1alpha1
// +groupName=data.webhook-operator.io
package v1alpha1
