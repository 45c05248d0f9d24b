// Package ingress is `webhook-operator ingress`: an HTTP API that publishes events into a
// namespace's events stream for any caller Kubernetes RBAC lets publish there, so a pod, a CI
// job or a CloudEvents source (Knative, Argo Events, Dapr...) publishes with one HTTP call and
// the identity it already has.
//
//	POST /v1/namespaces/<ns>/events       one JSON event {"id","type","data",...} or an array
//	POST /v1/namespaces/<ns>/cloudevents  CloudEvents 1.0: binary, structured or batched mode
//
// Every request carries a Kubernetes bearer token (a ServiceAccount token of audience
// DefaultAudience, configurable): a TokenReview says who it is and a SubjectAccessReview
// whether it may create webhookevents in <ns>, the virtual resource the auth callout grants
// NATS producers by (internal/kubeauth does both for either). What cannot be such a token is
// refused without a review; decisions and refusals are cached briefly, apart, bounded, and the
// reviews in flight are bounded (Authorizer). No token, a token the API server refuses: 401;
// no RBAC: 403.
//
// No caller can deny the ingress to the others: a request is authorized before it takes a
// slot, a namespace over its rate is refused before its body is read, bodies are read into
// buffers that grow as bytes arrive within a budget in all and per namespace (bodyBudget), and
// connections are bounded in all and per client address (Serve).
//
// An event becomes one message on webhooks.<ns>.<type> with its id as Nats-Msg-Id, so the
// namespace's events stream de-duplicates a retried publish; its CloudEvents attributes are
// ce-* headers (internal/cloudevent). The answer is 202 only once JetStream acknowledged the
// publish, with the stream and sequence: a producer that retries on any other answer loses
// nothing and stores nothing twice. Bad input (malformed JSON or CloudEvent, a body over its
// bound, a type that is no subject token, forged Nats-*/Whk-* headers, an operational event
// type) gets a 4xx that says what is wrong and publishes nothing, not even the good events of
// its batch. Each namespace has a token bucket per replica (429 with Retry-After); the server
// bounds its body, headers, time and requests in flight (503 with Retry-After beyond it).
//
// Publisher is the same validation and publish for one event of the JSON form, for the data API
// server's create of a WebhookEvent (internal/dataapi): `kubectl create -f event.yaml` gets the
// ingress's rules and answers, never a second set of them.
//
// The ingress keeps no state but caches: any number of replicas serve behind one Service. It
// publishes with its own NATS identity (the auth callout's RoleIngress: every namespace's
// event subjects and nothing else) on behalf of callers it authorized itself; see
// docs/security.md. With a Tracer each event is a webhook.publish span, the child of the
// caller's traceparent, and the event carries the span's context, so delivery attempts are
// its children.
package ingress
