package v1alpha1_test

import (
	"context"
	"strings"
	"testing"
)

// The schema's rules for spec.auth, spec.urlFrom and spec.proxy: exactly one URL, exactly one
// kind of auth, exactly one way for the client to authenticate, an absolute token URL, no
// parameter the grant owns, no Authorization header beside auth, a proxy without a path.
func TestAuthURLFromAndProxyValidation(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	ep := func(spec string) string { return strings.Replace(endpointFmt, "%s", spec, 1) }
	const (
		u      = `"url":"https://x.example.com/","eventTypes":["a"]`
		client = `"tokenURL":"https://auth.example.com/oauth/token","clientIDRef":{"name":"oauth","key":"id"}`
		secret = `"clientSecretRef":{"name":"oauth","key":"secret"}`
		key    = `"keyRef":{"name":"jwt","key":"key.pem"},"algorithm":"ES256"`
	)
	cases := []struct {
		name string
		doc  string
		want []string
	}{
		{"no url", ep(`{"eventTypes":["a"]}`), []string{"spec", "set exactly one of url and urlFrom"}},
		{"url and urlFrom", ep(`{` + u + `,"urlFrom":{"secretKeyRef":{"name":"hook","key":"url"}}}`), []string{"spec", "set exactly one of url and urlFrom"}},
		{"urlFrom without a key", ep(`{"eventTypes":["a"],"urlFrom":{"secretKeyRef":{"name":"hook"}}}`), []string{"spec.urlFrom.secretKeyRef.key", "Required"}},
		{"auth without a kind", ep(`{` + u + `,"auth":{}}`), []string{"spec.auth", "set exactly one of auth.oauth2ClientCredentials and auth.signedJWT"}},
		{"auth of both kinds", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{` + client + `,` + secret + `},"signedJWT":{` + key + `,"issuer":"i","audience":"a"}}}`), []string{"spec.auth", "set exactly one of auth.oauth2ClientCredentials and auth.signedJWT"}},
		{"oauth2 without a way to authenticate", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{` + client + `}}}`), []string{"spec.auth.oauth2ClientCredentials", "set exactly one of clientSecretRef", "clientAssertion"}},
		{"oauth2 with a secret and an assertion", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{` + client + `,` + secret + `,"clientAssertion":{` + key + `}}}}`), []string{"spec.auth.oauth2ClientCredentials", "set exactly one of clientSecretRef"}},
		{"authStyle with an assertion", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{` + client + `,"authStyle":"Body","clientAssertion":{` + key + `}}}}`), []string{"spec.auth.oauth2ClientCredentials", "authStyle applies to clientSecretRef"}},
		{"unknown authStyle", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{` + client + `,` + secret + `,"authStyle":"Header"}}}`), []string{"spec.auth.oauth2ClientCredentials.authStyle", "Basic", "Body"}},
		{"token URL relative", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{"tokenURL":"/token","clientIDRef":{"name":"o","key":"id"},` + secret + `}}}`), []string{"spec.auth.oauth2ClientCredentials.tokenURL", "absolute https:// (or http://) URL"}},
		{"token URL with user-info", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{"tokenURL":"https://id:pw@auth.example.com/token","clientIDRef":{"name":"o","key":"id"},` + secret + `}}}`), []string{"spec.auth.oauth2ClientCredentials.tokenURL", "user-info"}},
		{"token URL missing", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{"clientIDRef":{"name":"o","key":"id"},` + secret + `}}}`), []string{"spec.auth.oauth2ClientCredentials.tokenURL", "Required"}},
		{"a parameter the grant owns", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{` + client + `,` + secret + `,"extraParams":[{"name":"client_secret","value":"x"}]}}}`), []string{"spec.auth.oauth2ClientCredentials.extraParams[0]", "cannot set grant_type"}},
		{"a scope with a space", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{` + client + `,` + secret + `,"scopes":["a b"]}}}`), []string{"spec.auth.oauth2ClientCredentials.scopes[0]", "should match"}},
		{"resource not a URI", ep(`{` + u + `,"auth":{"oauth2ClientCredentials":{` + client + `,` + secret + `,"resource":"orders api"}}}`), []string{"spec.auth.oauth2ClientCredentials.resource", "absolute URI"}},
		{"signed JWT without issuer", ep(`{` + u + `,"auth":{"signedJWT":{` + key + `,"audience":"https://x.example.com"}}}`), []string{"spec.auth", "auth.signedJWT needs issuer and audience"}},
		{"signed JWT with HS256", ep(`{` + u + `,"auth":{"signedJWT":{"keyRef":{"name":"jwt","key":"k"},"algorithm":"HS256","issuer":"i","audience":"a"}}}`), []string{"spec.auth.signedJWT.algorithm", "RS256", "ES256", "EdDSA"}},
		{"signed JWT living a day", ep(`{` + u + `,"auth":{"signedJWT":{` + key + `,"issuer":"i","audience":"a","lifetime":"24h"}}}`), []string{"spec.auth.signedJWT.lifetime", "between 30s and 1h"}},
		{"Authorization header beside auth", ep(`{` + u + `,"headers":[{"name":"authorization","value":"x"}],"auth":{"signedJWT":{` + key + `,"issuer":"i","audience":"a"}}}`), []string{"spec", "with auth the dispatcher sets the Authorization header"}},
		{"Authorization from a Secret beside auth", ep(`{` + u + `,"headersFrom":[{"name":"Authorization","secretKeyRef":{"name":"s","key":"k"}}],"auth":{"signedJWT":{` + key + `,"issuer":"i","audience":"a"}}}`), []string{"spec", "with auth the dispatcher sets the Authorization header"}},
		{"Authorization by a transformation beside auth", ep(`{` + u + `,"transform":{"headers":[{"name":"Authorization","expression":"id"}]},"auth":{"signedJWT":{` + key + `,"issuer":"i","audience":"a"}}}`), []string{"spec", "with auth the dispatcher sets the Authorization header"}},
		{"proxy with a path", ep(`{` + u + `,"proxy":{"url":"http://proxy.egress:3128/x"}}`), []string{"spec.proxy.url", "http://host:port or https://host:port"}},
		{"socks proxy", ep(`{` + u + `,"proxy":{"url":"socks5://proxy.egress:1080"}}`), []string{"spec.proxy.url", "http://host:port or https://host:port"}},
		{"proxy with user-info", ep(`{` + u + `,"proxy":{"url":"http://u:p@proxy.egress:3128"}}`), []string{"spec.proxy.url", "credentialsSecretRef"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := decode(t, tc.doc)
			obj.SetNamespace(ns)
			err := k8s.Create(ctx, obj)
			if err == nil {
				_ = k8s.Delete(ctx, obj)
				t.Fatalf("accepted, want a rejection naming %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}

	// And what is right is accepted.
	for i, spec := range []string{
		`{"eventTypes":["a"],"urlFrom":{"secretKeyRef":{"name":"hook","key":"url"}}}`,
		`{` + u + `,"auth":{"oauth2ClientCredentials":{` + client + `,` + secret + `,"authStyle":"Body","scopes":["orders.write","webhooks"],"audience":"https://api.example.com","resource":"https://api.example.com/orders","extraParams":[{"name":"tenant","value":"shop"}]}},"headers":[{"name":"X-Team","value":"a"}]}`,
		`{` + u + `,"auth":{"oauth2ClientCredentials":{` + client + `,"clientAssertion":{` + key + `,"keyID":"k1","lifetime":"2m"}}}}`,
		`{` + u + `,"auth":{"signedJWT":{"keyRef":{"name":"jwt","key":"key.pem"},"algorithm":"EdDSA","issuer":"webhook-operator","audience":"https://x.example.com"}},"proxy":{"url":"https://proxy.example.com:8443","credentialsSecretRef":{"name":"proxy"}}}`,
		`{` + u + `,"proxy":{"url":"http://proxy.egress:3128/"}}`,
	} {
		obj := decode(t, ep(spec))
		obj.SetNamespace(ns)
		obj.SetName("good-" + string(rune('a'+i)))
		if err := k8s.Create(ctx, obj); err != nil {
			t.Errorf("valid spec %d rejected: %v", i, err)
		}
	}
}
