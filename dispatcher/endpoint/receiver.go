package endpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/egressproxy"
	"github.com/webhook-operator/webhook-operator/internal/receiverauth"
)

// What the receiver asks of a request beyond the signature (spec.urlFrom, spec.auth,
// spec.proxy), resolved with the endpoint's Secrets. Values read from Secrets are scrubbed from
// anything stored, and the URL of urlFrom is never written into a message.

// maxURLBytes is spec.url's bound, applied to a URL read from a Secret.
const maxURLBytes = 2048

// urlFrom reads the URL from its Secret and checks it as the schema checks spec.url, without
// ever quoting it: its path, query and host are scrubbed from anything stored.
func (r *resolution) urlFrom(ep *v1alpha1.WebhookEndpoint) {
	ref := ep.Spec.URLFrom.SecretKeyRef
	c := r.c
	c.URLSecret = true
	v, err := secretValue(r.secret, ref)
	if err != nil {
		r.fail("urlFrom: %v", err)
		return
	}
	raw := strings.TrimSpace(string(v))
	where := fmt.Sprintf("the URL in Secret %s key %s", ref.Name, ref.Key)
	u, err := url.Parse(raw)
	switch {
	case len(raw) > maxURLBytes:
		r.fail("urlFrom: %s is longer than %d bytes", where, maxURLBytes)
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.Opaque != "":
		r.fail("urlFrom: %s is not an absolute http:// or https:// URL with a host", where)
	case u.User != nil:
		r.fail("urlFrom: %s carries user-info (user:password@), which is refused", where)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		r.fail("urlFrom: %s has a fragment (#...)", where)
	default:
		c.URL = raw
	}
	c.secretValues = append(c.secretValues, raw)
	if u != nil {
		for _, part := range []string{u.RequestURI(), u.EscapedPath(), u.RawQuery, u.Hostname()} {
			if len(part) >= 6 {
				c.secretValues = append(c.secretValues, part)
			}
		}
	}
}

// auth resolves spec.auth into the settings of the endpoint's token source.
func (r *resolution) auth(ep *v1alpha1.WebhookEndpoint) {
	a := ep.Spec.Auth
	if a == nil {
		return
	}
	s := &receiverauth.Settings{Timeout: r.c.Timeout}
	switch {
	case a.OAuth2ClientCredentials != nil:
		o := a.OAuth2ClientCredentials
		id, err := secretValue(r.secret, o.ClientIDRef)
		if err != nil {
			r.fail("auth: client id: %v", err)
			return
		}
		g := &receiverauth.OAuth2{TokenURL: o.TokenURL, ClientID: strings.TrimSpace(string(id)), Scopes: o.Scopes, Params: url.Values{}}
		if o.AuthStyle == v1alpha1.OAuth2AuthBody {
			g.AuthStyle = receiverauth.AuthBody
		}
		if o.Audience != "" {
			g.Params.Set("audience", o.Audience)
		}
		if o.Resource != "" {
			g.Params.Set("resource", o.Resource)
		}
		for _, p := range o.ExtraParams {
			g.Params.Add(p.Name, p.Value)
		}
		switch {
		case o.ClientSecretRef != nil:
			sec, err := secretValue(r.secret, *o.ClientSecretRef)
			if err != nil {
				r.fail("auth: client secret: %v", err)
				return
			}
			g.ClientSecret = strings.TrimSpace(string(sec))
			r.scrub(g.ClientSecret)
		case o.ClientAssertion != nil:
			if g.Assertion = r.jwt("client assertion", o.ClientAssertion); g.Assertion == nil {
				return
			}
		}
		s.OAuth2 = g
	case a.SignedJWT != nil:
		if s.JWT = r.jwt("signed JWT", a.SignedJWT); s.JWT == nil {
			return
		}
	default:
		return
	}
	r.c.Auth = s.Finish()
}

// jwt parses a signed JWT's key from its Secret; nil (and a failure) when it cannot.
func (r *resolution) jwt(what string, j *v1alpha1.SignedJWT) *receiverauth.JWT {
	pem, err := secretValue(r.secret, j.KeyRef)
	if err != nil {
		r.fail("auth: %s key: %v", what, err)
		return nil
	}
	lifetime := receiverauth.DefaultLifetime
	if j.Lifetime != nil && j.Lifetime.Duration > 0 {
		lifetime = j.Lifetime.Duration
	}
	out, err := receiverauth.NewJWT(pem, string(j.Algorithm), j.KeyID, j.Issuer, j.Subject, j.Audience, lifetime)
	if err != nil {
		r.fail("auth: %s key in Secret %s key %s: %v", what, j.KeyRef.Name, j.KeyRef.Key, err)
		return nil
	}
	return out
}

// proxy resolves the endpoint's own egress proxy (the installation's default is the
// dispatcher's, set when the endpoint has none).
func (r *resolution) proxy(ep *v1alpha1.WebhookEndpoint) {
	p := ep.Spec.Proxy
	if p == nil {
		return
	}
	u, err := egressproxy.Parse(p.URL)
	if err != nil {
		r.fail("proxy: %v", err)
		return
	}
	key := u.String()
	var user, pass string
	if ref := p.CredentialsSecretRef; ref != nil {
		s, err := r.secret(ref.Name)
		if err != nil {
			r.fail("proxy credentials: %v", err)
			return
		}
		user, pass = string(s.Data[corev1.BasicAuthUsernameKey]), string(s.Data[corev1.BasicAuthPasswordKey])
		if user == "" && pass == "" {
			r.fail("proxy credentials: Secret %s has neither %s nor %s", ref.Name, corev1.BasicAuthUsernameKey, corev1.BasicAuthPasswordKey)
			return
		}
		r.scrub(pass)
		sum := sha256.Sum256([]byte(user + "\x00" + pass))
		key += " " + hex.EncodeToString(sum[:8])
	}
	proxy := &egressproxy.Proxy{URL: u, CheckAddress: true, Key: key}
	if user != "" || pass != "" {
		proxy.Credentials = func() (string, string, error) { return user, pass, nil }
	}
	r.c.Proxy = proxy
}

// scrub remembers a Secret value to remove from anything stored.
func (r *resolution) scrub(v string) {
	if len(v) >= 6 {
		r.c.secretValues = append(r.c.secretValues, v)
	}
}
