// Package console is `webhook-operator console`: a web application for the people who own
// endpoints. It calls the Kubernetes API as the signed-in user, with their own bearer token
// (pasted, e.g. from `kubectl create token`, or the ID token of the cluster's OIDC provider,
// got by the authorization code flow with PKCE): no impersonation and no credential of its
// own, so RBAC decides every read and action, and a refusal is shown with the API server's
// reason. Before rendering an action it asks SelfSubjectAccessReviews, so a button RBAC
// does not grant is disabled and says why.
//
// Pages: the namespaces the user may list endpoints in; a namespace's endpoints with their
// health and a chart of its deliveries, failures and latency over the last hours (SVG drawn on
// the server from the delivery log, read slot by slot through the data API, bounded per slot);
// an endpoint with its conditions, recent deliveries (the aggregated
// webhookdeliveries API, filtered by state, event type, event id and time) and actions (enable, a test event
// through webhookevents, a filter evaluated against the latest delivery's payload, the signing
// secret rotated with an overlap: a new Secret and spec.signing patched); the filter and
// transformation edited, evaluated by internal/expr on a recent delivery's event or a typed one,
// and saved by a patch at the version the form was made from; a
// delivery with its attempts, payload, request headers and response (under the payload
// subresource's own RBAC); dead letters, filtered by endpoint, reason and time, each inspected (attempts, event, response), with replay of one, of those ticked or of
// every one a filter selects (WebhookReplays) and purge; a replay's
// progress; the namespace's quotas, read-only.
//
// Security: the session (the token, who it is, an anti-forgery token) is sealed with
// AES-GCM in a __Host- cookie, Secure, HTTP-only, SameSite=Strict, expiring with the token;
// nothing is stored server-side. Every POST carries the session's anti-forgery token and
// passes Go's cross-origin protection (Fetch metadata). Every answer has a strict Content
// Security Policy (no inline script or style, nothing from another origin), templates and
// styles are embedded (no CDN), and everything from the cluster, the streams or a receiver
// is rendered by html/template as text.
package console
