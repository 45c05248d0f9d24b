// Package dataapi is `webhook-operator apiserver`: an aggregated Kubernetes API server
// (k8s.io/apiserver, registered with an APIService, as metrics-server is) that serves what the
// streams hold as resources of the data.webhook-operator.io/v1alpha1 API (api/data/v1alpha1),
// per namespace:
//
//   - webhookdeliveries: get, list (newest first, paged with limit and continue, field
//     selectors on endpoint, state, event id, event type and a time range), watch (outcomes as
//     they are logged), server-side tables; each delivery's state comes from
//     internal/deliveries, the product's one rule for it;
//   - webhookdeadletters: get, list, delete and deletecollection (a purge, recorded as the
//     operational event webhook_operator.dlq.purged);
//   - webhookevents: create publishes an event with the HTTP ingress's rules;
//   - the payload subresource of deliveries and dead letters: bodies and headers (personal
//     data), under RBAC of its own.
//
// Authentication and authorization are the Kubernetes API server's: the aggregator
// authenticates the caller and forwards who it is (request headers, trusted through the
// front-proxy CA the API server publishes), and this server asks the API server whether RBAC
// allows the request (SubjectAccessReview) before it reaches any storage here. Nothing is
// stored by this server: it reads the streams with its own NATS identity, and bounds every
// request in time and memory (internal/deliveries' limits). NATS unreachable is a 503 with the
// reason; the connection comes back by itself.
package dataapi
