package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EventTypePattern matches event types the way NATS matches subject tokens: dot-separated
// tokens, where `*` matches exactly one token and a final `>` matches one or more.
// Examples: `order.created`, `order.*`, `order.>`.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=256
// +kubebuilder:validation:XValidation:rule="self.matches('^((\\\\*|[A-Za-z0-9_:-]+)\\\\.)*(\\\\*|>|[A-Za-z0-9_:-]+)$')",message="an event type is dot-separated tokens of letters, digits, '-', '_' or ':'; a token may be '*' and only the last may be '>' (e.g. order.created, order.*, order.>); no empty tokens or spaces"
type EventTypePattern string

// OrderingMode says whether deliveries of one endpoint may overtake each other.
// +kubebuilder:validation:Enum=BestEffort;PerKey
type OrderingMode string

const (
	// OrderingBestEffort delivers as soon as possible and retries each delivery independently.
	OrderingBestEffort OrderingMode = "BestEffort"
	// OrderingPerKey never has two deliveries of one key in flight; a retrying delivery blocks
	// only its own key.
	OrderingPerKey OrderingMode = "PerKey"
)

// WebhookEndpointSpec is what a user declares about one receiver of webhooks.
// +kubebuilder:validation:XValidation:rule="has(self.url) != has(self.urlFrom)",message="set exactly one of url and urlFrom"
// +kubebuilder:validation:XValidation:rule="!has(self.auth) || ((!has(self.headers) || !self.headers.exists(h, h.name.lowerAscii() == 'authorization')) && (!has(self.headersFrom) || !self.headersFrom.exists(h, h.name.lowerAscii() == 'authorization')) && (!has(self.transform) || !has(self.transform.headers) || !self.transform.headers.exists(h, h.name.lowerAscii() == 'authorization')))",message="with auth the dispatcher sets the Authorization header: headers, headersFrom and transform.headers cannot"
// +kubebuilder:validation:XValidation:rule="!has(self.headers) || self.headers.all(h, self.headers.exists_one(o, o.name.lowerAscii() == h.name.lowerAscii()) && (!has(self.headersFrom) || !self.headersFrom.exists(f, f.name.lowerAscii() == h.name.lowerAscii())))",message="a header name may appear only once in headers and headersFrom together (header names are case-insensitive)"
// +kubebuilder:validation:XValidation:rule="!has(self.headersFrom) || self.headersFrom.all(h, self.headersFrom.exists_one(o, o.name.lowerAscii() == h.name.lowerAscii()))",message="a header name may appear only once in headersFrom (header names are case-insensitive)"
// +kubebuilder:validation:XValidation:rule="!has(self.format) || !(self.format.type in ['Slack', 'Teams']) || !has(self.transform) || !has(self.transform.body)",message="format Slack or Teams writes the request body from the event: transform.body cannot be set with it (transform.headers can)"
// +kubebuilder:validation:XValidation:rule="!has(self.transform) || !has(self.transform.headers) || !has(self.headersFrom) || self.headersFrom.all(h, self.transform.headers.all(t, t.name.lowerAscii() != h.name.lowerAscii()))",message="transform.headers cannot set a header of headersFrom: a Secret's value is never replaced by a transformation"
type WebhookEndpointSpec struct {
	// URL receives the POSTs: an absolute http or https URL without user-info or fragment.
	// Whether http and private addresses are allowed is the installer's choice. Set exactly one
	// of url and urlFrom.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="url must be an absolute http:// or https:// URL with a host"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@')",message="url must not carry user-info (user:password@); put credentials in headersFrom"
	// +kubebuilder:validation:XValidation:rule="!self.contains('#')",message="url must not have a fragment (#...)"
	// +optional
	URL string `json:"url,omitempty"`

	// URLFrom reads the URL from a key of a Secret, for receivers whose URL is itself a secret
	// (Slack, Teams and Zapier put theirs in the path). The Secret must consent (see signing).
	// The URL is never shown: not in status, events, logs, the delivery log, traces or
	// `kubectl webhooks`; it follows the rules of url, checked by the dispatcher (a URL that
	// breaks them fails every attempt with reason configuration or blocked_address).
	// +optional
	URLFrom *URLFromSource `json:"urlFrom,omitempty"`

	// Auth authenticates requests to receivers that ask for more than the signature: an
	// OAuth2 access token (client-credentials grant) or a JWT the dispatcher signs. The
	// dispatcher sets the Authorization header of every request.
	// +optional
	Auth *AuthSpec `json:"auth,omitempty"`

	// Proxy sends this endpoint's requests (and its token requests) through an HTTP CONNECT
	// proxy, in place of the installation's default proxy if there is one. The outbound guard
	// still judges the receiver's address: the dispatcher resolves and checks it, then asks the
	// proxy for a tunnel to that address. The proxy's own address must pass the guard too.
	// +optional
	Proxy *ProxySpec `json:"proxy,omitempty"`

	// EventTypes are the patterns of event types this endpoint receives (1 to 64).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	EventTypes []EventTypePattern `json:"eventTypes"`

	// SourceNamespaces are other namespaces whose events this endpoint also receives. Only
	// honoured when the installer allows cross-namespace sources and each source Namespace
	// consents with the annotation `webhook-operator.io/event-readers` naming this endpoint's
	// namespace (comma-separated, or "*"); otherwise Ready is False with reason
	// SourceNotAllowed. Events of the endpoint's own namespace are always received.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=set
	// +optional
	SourceNamespaces []string `json:"sourceNamespaces,omitempty"`

	// RetryPolicyRef names a RetryPolicy in this namespace. Without it the built-in default
	// applies: 7 attempts at 0s, 30s, 5m, 30m, 2h, 12h, 24h; Retry-After honoured up to 1h;
	// circuit breaker after 5 consecutive failures; auto-disable at >= 95% failures over 72h
	// with at least 20 completed deliveries.
	// +optional
	RetryPolicyRef *LocalObjectReference `json:"retryPolicyRef,omitempty"`

	// Timeout of one attempt (connect, send, and read the response), from 1s to 120s.
	// A timeout is a failed attempt.
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('120s')",message="timeout must be between 1s and 120s"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// SuccessStatusCodes lists the response codes that count as success. Without it any 2xx
	// succeeds. Redirects are never followed and never succeed.
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:XValidation:rule="self.all(c, c >= 200 && c <= 299)",message="successStatusCodes may only list 2xx codes (200-299); redirects and errors are always failures"
	// +listType=set
	// +optional
	SuccessStatusCodes []int32 `json:"successStatusCodes,omitempty"`

	// Signing configures Standard Webhooks signatures. Without it the controller generates a
	// Secret named `<endpoint>-signing` holding a fresh `whsec_` secret, owned by the endpoint.
	// Every Secret an endpoint references (here, in headersFrom and in tls) must consent with
	// the annotation `webhook-operator.io/allowed-endpoints` naming the endpoint
	// (comma-separated, or "*"); otherwise Ready is False with reason SecretNotAllowed. The
	// generated Secret consents by itself; ServiceAccount tokens and the operator's own Secrets
	// never do.
	// +optional
	Signing *SigningSpec `json:"signing,omitempty"`

	// Headers are static headers added to every request, a list of {name, value} keyed by
	// name (as a container probe's httpHeaders), e.g. [{name: X-Team, value: payments}]. They
	// cannot set the headers the dispatcher owns (webhook-*, content-type, content-length,
	// host, user-agent, x-webhook-event-id, x-webhook-delivery-attempt, trace context), and a
	// name appears once across headers and headersFrom (names are case-insensitive).
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	// +optional
	Headers []HTTPHeader `json:"headers,omitempty"`

	// HeadersFrom adds headers whose values come from Secrets (e.g. Authorization), which must
	// consent (see signing), with the same rules for names as headers. Their values are never
	// logged or stored in the delivery log.
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	// +optional
	HeadersFrom []HeaderFromSecret `json:"headersFrom,omitempty"`

	// TLS configures the client side of TLS: a client certificate for mTLS and extra CAs.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`

	// RateLimit caps requests per second to this endpoint (a token bucket).
	// +optional
	RateLimit *RateLimitSpec `json:"rateLimit,omitempty"`

	// MaxInFlight caps concurrent requests to this endpoint, across all dispatcher replicas.
	// +kubebuilder:default=50
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxInFlight *int32 `json:"maxInFlight,omitempty"`

	// Ordering chooses best-effort delivery (default) or per-key ordering.
	// +kubebuilder:default={mode: BestEffort}
	// +optional
	Ordering *OrderingSpec `json:"ordering,omitempty"`

	// Filter is a CEL expression over the event that must be true for this endpoint to get
	// it; events it rejects are not delivered and not in the delivery log. The expression sees
	// `payload` (the body parsed as JSON: maps, lists, strings, int for integral numbers,
	// double for others; null when the body is not JSON), `raw` (the body as a string),
	// `type`, `id` and `ns` (the namespace: `namespace` is a reserved word of CEL), `time` (a
	// timestamp) and `headers` (the producer's headers: lower-case names, first value).
	// Examples:
	// `payload.total > 100 && payload.currency == "EUR"`,
	// `has(payload.customer) && headers["x-region"] == "eu"`,
	// `type.startsWith("order.") && payload.items.exists(i, i.sku == "gift-card")`.
	// A filter that does not compile, does not give a bool or may cost too much makes the
	// endpoint not Ready (reason InvalidFilter). An event it cannot evaluate (e.g. a field the
	// event lacks: write `has(payload.total) && ...`) is dead-lettered as filter_failed.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Filter string `json:"filter,omitempty"`

	// Transform builds the request body, and optionally extra headers, from the event with
	// CEL (the same variables as filter). The body sent is the transformed one, and it is what
	// the signature covers. A transformation that does not compile or may cost too much makes
	// the endpoint not Ready (reason InvalidTransform); one that fails on an event dead-letters
	// that delivery as transform_failed, with the error.
	// +optional
	Transform *TransformSpec `json:"transform,omitempty"`

	// Format of the requests: the event's body as it was published (Raw, the default), a
	// CloudEvent (CloudEvents 1.0 over HTTP, binary or structured content mode) whose
	// attributes come from the event: id, source, type, time, subject and extensions, or a
	// Slack or Microsoft Teams message written from the event (alerts to owners: subscribe to
	// webhook_operator.* types). Either way the request is signed per Standard Webhooks (the
	// signature covers the body sent). Slack and Teams write the body, so transform.body
	// cannot be set with them (transform.headers can).
	// +optional
	Format *FormatSpec `json:"format,omitempty"`

	// Suspend holds deliveries in the stream without attempting them; resuming delivers them.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// Dispatcher chooses where this endpoint's deliveries run.
	// +optional
	Dispatcher *DispatcherSpec `json:"dispatcher,omitempty"`

	// PayloadRetention says how long this endpoint's delivery-log records and dead letters
	// keep their payloads; older ones stay without them (the attempt history stays, and
	// `kubectl webhooks dlq show` says the payload expired). Absent: the namespace's
	// WebhookQuota retention, else payloads are kept as long as their records. Longer than
	// the namespace's retention, the namespace's applies.
	// +optional
	PayloadRetention *PayloadRetention `json:"payloadRetention,omitempty"`
}

// URLFromSource says where a secret URL is read from.
type URLFromSource struct {
	// SecretKeyRef selects the Secret key holding the URL.
	SecretKeyRef SecretKeySelector `json:"secretKeyRef"`
}

// AuthSpec authenticates requests beyond the Standard Webhooks signature; set exactly one
// kind. The Secrets it names must consent (see signing). Their values, the tokens and the
// signed JWTs never appear in status, logs, the delivery log or traces. An attempt whose token
// cannot be had fails with reason auth_failed, and is retried and dead-lettered like any other
// failure; a 401 from the receiver drops the token and the request is sent once more with a
// new one.
// +kubebuilder:validation:XValidation:rule="has(self.oauth2ClientCredentials) != has(self.signedJWT)",message="set exactly one of auth.oauth2ClientCredentials and auth.signedJWT"
// +kubebuilder:validation:XValidation:rule="!has(self.signedJWT) || (has(self.signedJWT.issuer) && has(self.signedJWT.audience))",message="auth.signedJWT needs issuer and audience: the receiver checks both"
type AuthSpec struct {
	// OAuth2ClientCredentials gets an access token from the receiver's authorization server
	// (RFC 6749 client-credentials grant) and sends it as `Authorization: Bearer <token>`.
	// Tokens are cached per endpoint and fetched again before they expire.
	// +optional
	OAuth2ClientCredentials *OAuth2ClientCredentials `json:"oauth2ClientCredentials,omitempty"`

	// SignedJWT is a JWT the dispatcher signs and sends as `Authorization: Bearer <jwt>`. A
	// token is reused until three quarters of its lifetime have passed.
	// +optional
	SignedJWT *SignedJWT `json:"signedJWT,omitempty"`
}

// OAuth2AuthStyle is how the client's id and secret reach the token endpoint.
// +kubebuilder:validation:Enum=Basic;Body
type OAuth2AuthStyle string

const (
	// OAuth2AuthBasic sends them as HTTP basic authentication (client_secret_basic).
	OAuth2AuthBasic OAuth2AuthStyle = "Basic"
	// OAuth2AuthBody sends them in the request body (client_secret_post).
	OAuth2AuthBody OAuth2AuthStyle = "Body"
)

// OAuth2ClientCredentials is the client-credentials grant.
// +kubebuilder:validation:XValidation:rule="has(self.clientSecretRef) != has(self.clientAssertion)",message="set exactly one of clientSecretRef (the client authenticates with a secret) and clientAssertion (with a JWT it signs, private_key_jwt)"
// +kubebuilder:validation:XValidation:rule="!has(self.authStyle) || has(self.clientSecretRef)",message="authStyle applies to clientSecretRef; a client assertion is always sent in the body"
type OAuth2ClientCredentials struct {
	// TokenURL is the authorization server's token endpoint: an absolute https URL (http only
	// where the installation allows http for url), checked by the outbound guard like url and
	// reached through the same proxy. Redirects are not followed, so the client's credentials
	// reach this host and no other.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''",message="tokenURL must be an absolute https:// (or http://) URL with a host"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@')",message="tokenURL must not carry user-info (user:password@); the client's credentials come from Secrets"
	// +kubebuilder:validation:XValidation:rule="!self.contains('#')",message="tokenURL must not have a fragment (#...)"
	TokenURL string `json:"tokenURL"`

	// ClientIDRef selects the Secret key holding the client id.
	ClientIDRef SecretKeySelector `json:"clientIDRef"`

	// ClientSecretRef selects the Secret key holding the client secret. Set it or
	// clientAssertion.
	// +optional
	ClientSecretRef *SecretKeySelector `json:"clientSecretRef,omitempty"`

	// ClientAssertion authenticates the client with a JWT the dispatcher signs for each token
	// request (private_key_jwt, RFC 7523), in place of a secret. Its issuer and subject default
	// to the client id, its audience to tokenURL.
	// +optional
	ClientAssertion *SignedJWT `json:"clientAssertion,omitempty"`

	// AuthStyle says how the client secret is sent: Basic (HTTP basic authentication, the
	// default) or Body (client_id and client_secret in the form).
	// +optional
	AuthStyle OAuth2AuthStyle `json:"authStyle,omitempty"`

	// Scopes requested (the scope parameter, space-separated).
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:Pattern=`^[!#-\[\]-~]+$`
	// +listType=set
	// +optional
	Scopes []string `json:"scopes,omitempty"`

	// Audience is sent as the audience parameter (as Auth0 and Okta expect).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +optional
	Audience string `json:"audience,omitempty"`

	// Resource is sent as the resource parameter (RFC 8707): an absolute URI.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self)",message="resource must be an absolute URI (RFC 8707)"
	// +optional
	Resource string `json:"resource,omitempty"`

	// ExtraParams are more parameters of the token request, a list of {name, value}. They
	// cannot set the parameters the grant owns (grant_type, scope, client_id, client_secret,
	// client_assertion, client_assertion_type, audience, resource).
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	// +optional
	ExtraParams []OAuth2Param `json:"extraParams,omitempty"`
}

// OAuth2Param is one parameter of the token request.
// +kubebuilder:validation:XValidation:rule="!(self.name in ['grant_type', 'scope', 'client_id', 'client_secret', 'client_assertion', 'client_assertion_type', 'audience', 'resource'])",message="extraParams cannot set grant_type, scope, client_id, client_secret, client_assertion, client_assertion_type, audience or resource: use the fields of oauth2ClientCredentials"
type OAuth2Param struct {
	// Name of the parameter.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:-]{1,128}$`
	Name string `json:"name"`
	// Value of the parameter.
	// +kubebuilder:validation:MaxLength=2048
	Value string `json:"value"`
}

// JWTAlgorithm is a JWS signature algorithm.
// +kubebuilder:validation:Enum=RS256;ES256;EdDSA
type JWTAlgorithm string

// SignedJWT is a key and the claims the dispatcher signs with it: iss, sub, aud, iat, exp and a
// fresh jti, with the key id in the header.
type SignedJWT struct {
	// KeyRef selects the Secret key holding the private key, PEM (PKCS #8, or PKCS #1 for RSA,
	// or SEC 1 for EC), not encrypted.
	KeyRef SecretKeySelector `json:"keyRef"`

	// Algorithm is RS256 (an RSA key of at least 2048 bits), ES256 (a P-256 key) or EdDSA (an
	// Ed25519 key).
	Algorithm JWTAlgorithm `json:"algorithm"`

	// KeyID is the kid header, so the receiver can pick the public key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[!-~]+$`
	// +optional
	KeyID string `json:"keyID,omitempty"`

	// Issuer is the iss claim (for a client assertion, default the client id).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Issuer string `json:"issuer,omitempty"`

	// Subject is the sub claim (default the issuer; for a client assertion, the client id).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Subject string `json:"subject,omitempty"`

	// Audience is the aud claim (for a client assertion, default tokenURL).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +optional
	Audience string `json:"audience,omitempty"`

	// Lifetime of a JWT, from 30s to 1h; default 5m.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('30s') && duration(self) <= duration('1h')",message="lifetime must be between 30s and 1h"
	// +optional
	Lifetime *metav1.Duration `json:"lifetime,omitempty"`
}

// ProxySpec is an HTTP CONNECT proxy.
type ProxySpec struct {
	// URL of the proxy: http://host:port (plain to the proxy; the tunnel still carries TLS to
	// an https receiver) or https://host:port, without a path.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != '' && url(self).getEscapedPath() in ['', '/'] && url(self).getQuery().size() == 0",message="proxy.url must be http://host:port or https://host:port, without a path or query"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@')",message="proxy.url must not carry user-info; name a Secret in credentialsSecretRef"
	URL string `json:"url"`

	// CredentialsSecretRef names a Secret (type kubernetes.io/basic-auth: keys username and
	// password) sent as Proxy-Authorization: Basic. It must consent (see signing).
	// +optional
	CredentialsSecretRef *LocalObjectReference `json:"credentialsSecretRef,omitempty"`
}

// FormatType is how a request carries the event.
// +kubebuilder:validation:Enum=Raw;CloudEvents;Slack;Teams
type FormatType string

const (
	// FormatRaw sends the event's body (or its transformation) as it is.
	FormatRaw FormatType = "Raw"
	// FormatCloudEvents sends a CloudEvent.
	FormatCloudEvents FormatType = "CloudEvents"
	// FormatSlack sends a Slack message (an incoming webhook's text and blocks) that says
	// what the event is: for an operational event, what happened to which endpoint.
	FormatSlack FormatType = "Slack"
	// FormatTeams sends a Microsoft Teams message (an Adaptive Card, as Teams' workflow
	// webhooks take it) that says what the event is.
	FormatTeams FormatType = "Teams"
)

// CloudEventsMode is the content mode of CloudEvents requests.
// +kubebuilder:validation:Enum=Binary;Structured
type CloudEventsMode string

const (
	// CloudEventsBinary: the attributes are ce-* headers, the body is the event's data.
	CloudEventsBinary CloudEventsMode = "Binary"
	// CloudEventsStructured: the body is the whole event as application/cloudevents+json.
	CloudEventsStructured CloudEventsMode = "Structured"
)

// FormatSpec chooses the request format.
// +kubebuilder:validation:XValidation:rule="!has(self.cloudEventsMode) || self.type == 'CloudEvents'",message="cloudEventsMode applies only to format type CloudEvents"
type FormatSpec struct {
	// Type is Raw (the event's body as published), CloudEvents, Slack or Teams (a chat
	// message written from the event: an operational event as a sentence with its figures,
	// any other as its type and body; docs/operational-events.md#alerts-to-slack-and-teams).
	// +kubebuilder:default=Raw
	Type FormatType `json:"type"`

	// CloudEventsMode is Binary (the default: attributes in ce-* headers, the data as the
	// body) or Structured (the whole event as application/cloudevents+json).
	// +optional
	CloudEventsMode CloudEventsMode `json:"cloudEventsMode,omitempty"`
}

// TransformSpec is a CEL transformation of the event into the request.
// +kubebuilder:validation:XValidation:rule="has(self.body) || has(self.headers)",message="transform needs a body expression, headers, or both"
type TransformSpec struct {
	// Body is a CEL expression whose value is the request body: a map or a list is sent as
	// JSON (application/json, keys in sorted order), a string as is (text/plain;
	// charset=utf-8), bytes as is (application/octet-stream). At most 1 MiB. Without it the
	// event's body is sent unchanged. Example, a Slack message:
	// `{"text": "Order " + payload.order_id + " paid: " + string(payload.total) + " " + payload.currency}`.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Body string `json:"body,omitempty"`

	// Headers are request headers whose values CEL expressions compute, a list of
	// {name, expression} keyed by name (as spec.headers), e.g.
	// [{name: X-Order-Id, expression: payload.order_id}]. An expression gives a string, a
	// number or a bool (sent as string() writes it), or null to leave the header out. They
	// replace spec.headers of the same name; they cannot set the headers the dispatcher owns
	// nor those of headersFrom, and a name appears once (names are case-insensitive).
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(h, self.exists_one(o, o.name.lowerAscii() == h.name.lowerAscii()))",message="a header name may appear only once in transform.headers (header names are case-insensitive)"
	// +listType=map
	// +listMapKey=name
	// +optional
	Headers []TransformHeader `json:"headers,omitempty"`
}

// TransformHeader is one request header whose value a CEL expression computes from the event.
// +kubebuilder:validation:XValidation:rule="!self.name.lowerAscii().startsWith('webhook-') && !(self.name.lowerAscii() in ['content-type', 'content-length', 'host', 'user-agent', 'x-webhook-event-id', 'x-webhook-delivery-attempt', 'traceparent', 'tracestate'])",message="transform headers cannot set webhook-*, content-type, content-length, host, user-agent, x-webhook-event-id, x-webhook-delivery-attempt or trace context: the dispatcher owns them",messageExpression="'header ' + (self.name.matches('^[!-~]{1,128}$') ? self.name : '(with an invalid name)') + ': transform headers cannot set webhook-*, content-type, content-length, host, user-agent, x-webhook-event-id, x-webhook-delivery-attempt or trace context: the dispatcher owns them'"
type TransformHeader struct {
	// Name of the header, e.g. X-Order-Id: an HTTP token (letters, digits and
	// !#$%&*+.^_|~-), so never a space or a control character.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&*+.^_|~-]{1,128}$`
	Name string `json:"name"`

	// Expression is the CEL expression of the header's value (the variables of
	// spec.filter), 1 to 1024 characters, e.g. `payload.order_id` or `type`. It is an
	// expression, not a literal: a fixed value is a CEL string, `"payments"` (or a
	// spec.headers entry).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Expression string `json:"expression"`
}

// SigningSpec points at the Standard Webhooks signing secret and, during a rotation, at the
// previous one. While a previous secret is set (and until rotationEndsAt, if given), every
// request carries both signatures, so receivers can switch secrets without losing events.
// +kubebuilder:validation:XValidation:rule="!has(self.rotationEndsAt) || has(self.previousSecretRef)",message="rotationEndsAt needs previousSecretRef: it says until when the previous secret is still used"
type SigningSpec struct {
	// SecretRef selects the current secret, in Standard Webhooks form (`whsec_` + base64).
	SecretRef SecretKeySelector `json:"secretRef"`

	// PreviousSecretRef selects the secret being rotated out. Both signatures are sent while it
	// is set and rotationEndsAt has not passed.
	// +optional
	PreviousSecretRef *SecretKeySelector `json:"previousSecretRef,omitempty"`

	// RotationEndsAt ends the overlap: after it only the current secret signs.
	// +optional
	RotationEndsAt *metav1.Time `json:"rotationEndsAt,omitempty"`
}

// HTTPHeader is one static request header.
// +kubebuilder:validation:XValidation:rule="!self.name.lowerAscii().startsWith('webhook-') && !(self.name.lowerAscii() in ['content-type', 'content-length', 'host', 'user-agent', 'x-webhook-event-id', 'x-webhook-delivery-attempt', 'traceparent', 'tracestate'])",message="headers cannot set webhook-*, content-type, content-length, host, user-agent, x-webhook-event-id, x-webhook-delivery-attempt or trace context: the dispatcher owns them",messageExpression="'header ' + (self.name.matches('^[!-~]{1,128}$') ? self.name : '(with an invalid name)') + ': headers cannot set webhook-*, content-type, content-length, host, user-agent, x-webhook-event-id, x-webhook-delivery-attempt or trace context: the dispatcher owns them'"
// +kubebuilder:validation:XValidation:rule="!self.value.matches('[\\x00-\\x08\\x0a-\\x1f\\x7f]')",message="header values must not contain control characters (CR, LF, NUL, DEL or any other below 0x20 but tab)",messageExpression="'header ' + (self.name.matches('^[!-~]{1,128}$') ? self.name : '(with an invalid name)') + ': the value must not contain control characters (CR, LF, NUL, DEL or any other below 0x20 but tab)'"
type HTTPHeader struct {
	// Name of the header, e.g. X-Team: an HTTP token (letters, digits and !#$%&*+.^_|~-), so
	// never a space or a control character.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&*+.^_|~-]{1,128}$`
	Name string `json:"name"`

	// Value of the header, at most 4096 characters, without control characters (tab is
	// allowed).
	// +kubebuilder:validation:MaxLength=4096
	Value string `json:"value"`
}

// HeaderFromSecret is one request header whose value is read from a Secret.
// +kubebuilder:validation:XValidation:rule="!self.name.lowerAscii().startsWith('webhook-') && !(self.name.lowerAscii() in ['content-type', 'content-length', 'host', 'user-agent', 'x-webhook-event-id', 'x-webhook-delivery-attempt', 'traceparent', 'tracestate'])",message="headersFrom cannot set webhook-*, content-type, content-length, host, user-agent, x-webhook-event-id, x-webhook-delivery-attempt or trace context: the dispatcher owns them",messageExpression="'header ' + (self.name.matches('^[!-~]{1,128}$') ? self.name : '(with an invalid name)') + ': headersFrom cannot set webhook-*, content-type, content-length, host, user-agent, x-webhook-event-id, x-webhook-delivery-attempt or trace context: the dispatcher owns them'"
type HeaderFromSecret struct {
	// Name of the header, e.g. Authorization: an HTTP token (letters, digits and
	// !#$%&*+.^_|~-), so never a space or a control character.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&*+.^_|~-]{1,128}$`
	Name string `json:"name"`

	// SecretKeyRef selects the Secret key holding the value.
	SecretKeyRef SecretKeySelector `json:"secretKeyRef"`
}

// TLSSpec is the client side of TLS towards the receiver.
type TLSSpec struct {
	// ClientCertificateSecretRef names a kubernetes.io/tls Secret (tls.crt, tls.key) presented
	// to the receiver (mTLS).
	// +optional
	ClientCertificateSecretRef *LocalObjectReference `json:"clientCertificateSecretRef,omitempty"`

	// CABundleSecretRef selects a PEM bundle of CAs trusted for the receiver, in addition to
	// the system's roots.
	// +optional
	CABundleSecretRef *SecretKeySelector `json:"caBundleSecretRef,omitempty"`
}

// RateLimitSpec is a token bucket.
type RateLimitSpec struct {
	// RequestsPerSecond is the sustained rate.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	RequestsPerSecond int32 `json:"requestsPerSecond"`

	// Burst is the bucket's size; defaults to requestsPerSecond.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	// +optional
	Burst *int32 `json:"burst,omitempty"`
}

// OrderingSpec chooses the ordering guarantee.
// +kubebuilder:validation:XValidation:rule="self.mode != 'PerKey' || has(self.key)",message="ordering.key is required when mode is PerKey: say where each event's key comes from"
type OrderingSpec struct {
	// Mode is BestEffort (default) or PerKey.
	// +kubebuilder:default=BestEffort
	Mode OrderingMode `json:"mode"`

	// Key says where an event's ordering key comes from (PerKey only).
	// +optional
	Key *OrderingKeySource `json:"key,omitempty"`
}

// OrderingKeySource names exactly one place an event's ordering key is read from.
// +kubebuilder:validation:XValidation:rule="has(self.header) != has(self.jsonField)",message="set exactly one of ordering.key.header and ordering.key.jsonField"
type OrderingKeySource struct {
	// Header is a header of the published event holding the key.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9!#$%&*+.^_|~-]{1,128}$`
	// +optional
	Header string `json:"header,omitempty"`

	// JSONField is a dot-separated path to a string or number in the event's JSON body,
	// e.g. `data.order_id`.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`
	// +kubebuilder:validation:MaxLength=256
	// +optional
	JSONField string `json:"jsonField,omitempty"`
}

// DispatcherSpec chooses the dispatcher that delivers this endpoint's events.
// +kubebuilder:validation:XValidation:rule="self.dedicated || (!has(self.replicas) && !has(self.resources))",message="replicas and resources apply only to a dedicated dispatcher; the shared dispatcher's are set by the operator's configuration"
type DispatcherSpec struct {
	// Dedicated runs this endpoint in its own Deployment, isolated from its namespace's
	// shared dispatcher.
	// +optional
	Dedicated bool `json:"dedicated,omitempty"`

	// Replicas of the dedicated dispatcher (1 to 20).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Resources of the dedicated dispatcher's container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
}

// CircuitState is the state of an endpoint's circuit breaker.
// +kubebuilder:validation:Enum=Closed;Open;HalfOpen
type CircuitState string

const (
	// CircuitClosed delivers normally.
	CircuitClosed CircuitState = "Closed"
	// CircuitOpen parks deliveries in the stream until openDuration passes.
	CircuitOpen CircuitState = "Open"
	// CircuitHalfOpen lets one probe through; its outcome closes or re-opens the circuit.
	CircuitHalfOpen CircuitState = "HalfOpen"
)

// WebhookEndpointStatus is written by two owners with separate fields: the controller
// (observedGeneration, the Ready condition, dispatcher, wiring) and the dispatcher (health and
// the Disabled and CircuitOpen conditions).
type WebhookEndpointStatus struct {
	// ObservedGeneration is the generation the controller last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Reconciling and Stalled (controller; the last two only while true),
	// StorageLimitReached (controller: the namespace's dead letters or delivery log at their
	// size bound), Disabled and CircuitOpen (dispatcher).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Dispatcher is the Deployment delivering this endpoint's events, and its readiness.
	// +optional
	Dispatcher *DispatcherStatus `json:"dispatcher,omitempty"`

	// SigningSecretName is the Secret whose key signs requests (the generated one when
	// spec.signing is absent). The secret itself is never shown.
	// +optional
	SigningSecretName string `json:"signingSecretName,omitempty"`

	// SecretsVersion changes whenever a Secret the endpoint references changes (a digest of
	// their names and resourceVersions, never of their contents); dispatchers re-read the
	// Secrets when it does, so a rotation needs no restart.
	// +optional
	SecretsVersion string `json:"secretsVersion,omitempty"`

	// RetryPolicyName is the RetryPolicy in force, or "(default)".
	// +optional
	RetryPolicyName string `json:"retryPolicyName,omitempty"`

	// DeliverySubject is the JetStream subject holding this endpoint's deliveries.
	// +optional
	DeliverySubject string `json:"deliverySubject,omitempty"`

	// ConsumerName is the durable JetStream consumer delivering this endpoint: its
	// namespace's intake consumer on the shared lane, its own on its own lane (dedicated or
	// per-key ordering).
	// +optional
	ConsumerName string `json:"consumerName,omitempty"`

	// Lane is how its deliveries reach the dispatcher: Shared (its namespace's consumers,
	// whatever the number of endpoints) or Own (consumers of its own: a dedicated dispatcher
	// or per-key ordering).
	// +optional
	Lane string `json:"lane,omitempty"`

	// SharedSince is when the endpoint joined the shared lane (its creation, or when an
	// earlier version or its own lane gave way to the shared lane): the shared lane delivers
	// the events stored since, its draining consumers those stored before. Its dispatcher
	// delivers nothing on the shared lane before it is set.
	// +optional
	SharedSince *metav1.Time `json:"sharedSince,omitempty"`

	// DrainingConsumers are consumers of its own ("<stream>/<consumer>") that an earlier
	// version (or its own lane) made and that still hold what they brought before the shared
	// lane took over: its dispatcher delivers what they hold, then the controller deletes
	// them.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	DrainingConsumers []string `json:"drainingConsumers,omitempty"`

	// Health is the delivery health the dispatcher measures.
	// +optional
	Health *DeliveryHealth `json:"health,omitempty"`
}

// DispatcherStatus reports the Deployment that delivers an endpoint.
type DispatcherStatus struct {
	// Name of the Deployment.
	Name string `json:"name"`
	// Namespace of the Deployment when it is not the endpoint's: the installation's shared
	// dispatcher, which serves this namespace with the namespace's own identity.
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// Dedicated is true for the endpoint's own Deployment.
	// +optional
	Dedicated bool `json:"dedicated,omitempty"`
	// Replicas wanted.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// AvailableReplicas as the Deployment reports them.
	// +optional
	AvailableReplicas int32 `json:"availableReplicas,omitempty"`
}

// DeliveryHealth is measured by the dispatcher over a window (the retry policy's
// auto-disable window, else 24h).
type DeliveryHealth struct {
	// Window over which attempts, failures and successRate are counted.
	// +optional
	Window *metav1.Duration `json:"window,omitempty"`
	// Attempts made in the window.
	// +optional
	Attempts int64 `json:"attempts,omitempty"`
	// Failures among those attempts.
	// +optional
	Failures int64 `json:"failures,omitempty"`
	// SuccessRate of attempts in the window, e.g. "99.5%"; empty before the first attempt.
	// +optional
	SuccessRate string `json:"successRate,omitempty"`
	// ConsecutiveFailures is the number of failed attempts since the last success.
	// +optional
	ConsecutiveFailures int32 `json:"consecutiveFailures,omitempty"`
	// LastSuccessTime is when an attempt last succeeded.
	// +optional
	LastSuccessTime *metav1.Time `json:"lastSuccessTime,omitempty"`
	// LastFailure describes the last failed attempt.
	// +optional
	LastFailure *AttemptFailure `json:"lastFailure,omitempty"`
	// CircuitState is Closed, Open or HalfOpen.
	// +optional
	CircuitState CircuitState `json:"circuitState,omitempty"`
	// CircuitOpenedAt is when the circuit last opened.
	// +optional
	CircuitOpenedAt *metav1.Time `json:"circuitOpenedAt,omitempty"`
	// Pending deliveries: queued, in flight, or waiting for a retry.
	// +optional
	Pending int64 `json:"pending,omitempty"`
	// DeadLettered counts deliveries this endpoint sent to the dead-letter stream.
	// +optional
	DeadLettered int64 `json:"deadLettered,omitempty"`
	// Delivered counts deliveries that succeeded.
	// +optional
	Delivered int64 `json:"delivered,omitempty"`
	// Filtered counts the events of a matching type that spec.filter rejected: not delivered
	// and not in the delivery log. The dispatcher replica that filtered an event saves its
	// count about every second, so its crash may lose or repeat up to a second's count.
	// +optional
	Filtered int64 `json:"filtered,omitempty"`
	// DisabledSince is when the endpoint was auto-disabled; empty while enabled.
	// +optional
	DisabledSince *metav1.Time `json:"disabledSince,omitempty"`
	// DisabledReason says why: ConsecutiveFailures or FailureRate, with the figures.
	// +optional
	DisabledReason string `json:"disabledReason,omitempty"`
	// UpdatedAt is when the dispatcher last wrote this block.
	// +optional
	UpdatedAt *metav1.Time `json:"updatedAt,omitempty"`
}

// AttemptFailure describes one failed attempt.
type AttemptFailure struct {
	// Time of the attempt.
	Time metav1.Time `json:"time"`
	// StatusCode of the response, if one came.
	// +optional
	StatusCode int32 `json:"statusCode,omitempty"`
	// Reason: status_code, timeout, connection_refused, dns, tls, blocked_address, ...
	Reason string `json:"reason"`
	// Message gives detail, never secrets.
	// +optional
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=whe,categories=webhooks
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.url`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Circuit",type=string,JSONPath=`.status.health.circuitState`
// +kubebuilder:printcolumn:name="Success",type=string,JSONPath=`.status.health.successRate`
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.health.pending`
// +kubebuilder:printcolumn:name="Disabled",type=string,JSONPath=`.status.conditions[?(@.type=="Disabled")].status`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// WebhookEndpoint is one receiver of webhooks: where events of chosen types are delivered,
// how requests are signed, retried and limited, and how delivery is going.
type WebhookEndpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WebhookEndpointSpec   `json:"spec"`
	Status WebhookEndpointStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// WebhookEndpointList is a list of WebhookEndpoints.
type WebhookEndpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WebhookEndpoint `json:"items"`
}

func init() {
	SchemeBuilder.Register(&WebhookEndpoint{}, &WebhookEndpointList{})
}
