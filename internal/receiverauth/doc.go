// Package receiverauth authenticates a dispatcher to receivers that ask for more than a
// Standard Webhooks signature (spec.auth of a WebhookEndpoint): an OAuth2 access token from the
// client-credentials grant (golang.org/x/oauth2's clientcredentials does the grant), the client
// authenticated by a secret (basic or in the body) or by a signed JWT (private_key_jwt,
// RFC 7523); or a JWT the dispatcher signs itself and sends as the bearer token (go-jose signs
// RS256, ES256 and EdDSA).
//
// Settings are an endpoint's resolved configuration (Secrets read, the key parsed), immutable
// like the rest of the endpoint's configuration. A Source is the live token of one endpoint:
// cached, refreshed in the background once three quarters of its lifetime have passed (the
// current token serves meanwhile), fetched by one request at a time however many attempts
// wait for it, and dropped when the receiver answers 401 to it (Invalidate). A fetch that fails
// is an *Error, whose message never holds a secret (the client secret, the assertion, the
// token); the attempt that needed it fails with reason auth_failed, and attempts in the next
// second get the same error without asking the token endpoint again.
//
// The token request goes through the HTTP client the caller gives, the endpoint's: the
// outbound guard checks the token endpoint's address as it checks the receiver's, the egress
// proxy carries it, and redirects are never followed, so the client's credentials reach the
// token URL's host and no other.
package receiverauth
