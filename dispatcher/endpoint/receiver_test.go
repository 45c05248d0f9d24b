package endpoint

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
)

// urlFrom, auth and proxy resolve from consenting Secrets; what is wrong in a Secret's value
// is a configuration error that never quotes the value, and the values are scrubbed.
func TestReceiverSettingsResolve(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	keyPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	secrets := map[string]map[string]string{
		"hook":     {"url": "https://hooks.example.com/services/T0SECRET/B0SECRET/xyzsecret\n"},
		"badhook":  {"url": "hooks.example.com/services/T0SECRET"},
		"infohook": {"url": "https://user:T0SECRETPW@hooks.example.com/x"},
		"oauth":    {"id": "client-1", "secret": "client-secret-value", "key": keyPEM},
		"proxy":    {"username": "u", "password": "proxy-password"},
	}
	get := func(name string) (*corev1.Secret, error) {
		d, ok := secrets[name]
		if !ok {
			return nil, fmt.Errorf("secret %s not found", name)
		}
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1", Annotations: map[string]string{consent.AllowedEndpoints: "*"}},
			Data: map[string][]byte{"whsec": []byte("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")}}
		for k, v := range d {
			s.Data[k] = []byte(v)
		}
		return s, nil
	}
	signing := &v1alpha1.SigningSpec{SecretRef: v1alpha1.SecretKeySelector{Name: "hook", Key: "whsec"}}
	ep := func(spec v1alpha1.WebhookEndpointSpec) *v1alpha1.WebhookEndpoint {
		spec.Signing = signing
		return &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}, Spec: spec}
	}
	from := func(name string) *v1alpha1.URLFromSource {
		return &v1alpha1.URLFromSource{SecretKeyRef: v1alpha1.SecretKeySelector{Name: name, Key: "url"}}
	}

	c := Resolve(ep(v1alpha1.WebhookEndpointSpec{URLFrom: from("hook"),
		Auth: &v1alpha1.AuthSpec{OAuth2ClientCredentials: &v1alpha1.OAuth2ClientCredentials{TokenURL: "https://auth.example.com/token",
			ClientIDRef: v1alpha1.SecretKeySelector{Name: "oauth", Key: "id"}, ClientSecretRef: &v1alpha1.SecretKeySelector{Name: "oauth", Key: "secret"},
			AuthStyle: v1alpha1.OAuth2AuthBody, Audience: "https://api.example.com", ExtraParams: []v1alpha1.OAuth2Param{{Name: "tenant", Value: "shop"}}}},
		Proxy: &v1alpha1.ProxySpec{URL: "http://proxy.example.com:3128", CredentialsSecretRef: &v1alpha1.LocalObjectReference{Name: "proxy"}}}), nil, get)
	if c.ConfigError != nil {
		t.Fatal(c.ConfigError)
	}
	if c.URL != "https://hooks.example.com/services/T0SECRET/B0SECRET/xyzsecret" || !c.URLSecret {
		t.Fatalf("URL %q, secret %v", c.URL, c.URLSecret)
	}
	o := c.Auth.OAuth2
	if o == nil || o.ClientID != "client-1" || o.ClientSecret != "client-secret-value" || o.Params.Get("audience") != "https://api.example.com" || o.Params.Get("tenant") != "shop" {
		t.Fatalf("oauth2 settings %+v", o)
	}
	if c.Proxy == nil || !c.Proxy.CheckAddress || c.Proxy.Credentials == nil {
		t.Fatalf("proxy %+v", c.Proxy)
	}
	scrubbed := c.Scrub("echo " + c.URL + " /services/T0SECRET/B0SECRET/xyzsecret client-secret-value proxy-password hooks.example.com")
	for _, s := range []string{"T0SECRET", "client-secret-value", "proxy-password", "hooks.example.com"} {
		if strings.Contains(scrubbed, s) {
			t.Errorf("Scrub left %q: %s", s, scrubbed)
		}
	}

	for name, tc := range map[string]struct {
		spec v1alpha1.WebhookEndpointSpec
		want string
	}{
		"relative URL":   {v1alpha1.WebhookEndpointSpec{URLFrom: from("badhook")}, "urlFrom: the URL in Secret badhook key url is not an absolute http:// or https:// URL"},
		"user-info":      {v1alpha1.WebhookEndpointSpec{URLFrom: from("infohook")}, "carries user-info"},
		"missing Secret": {v1alpha1.WebhookEndpointSpec{URLFrom: from("nohook")}, "urlFrom: secret nohook not found"},
		"wrong key kind": {v1alpha1.WebhookEndpointSpec{URL: "https://x.example.com/", Auth: &v1alpha1.AuthSpec{SignedJWT: &v1alpha1.SignedJWT{
			KeyRef: v1alpha1.SecretKeySelector{Name: "oauth", Key: "key"}, Algorithm: "RS256", Issuer: "i", Audience: "a"}}},
			"auth: signed JWT key in Secret oauth key key: algorithm RS256 needs an RSA key, the key is ECDSA P-256"},
		"no proxy credentials": {v1alpha1.WebhookEndpointSpec{URL: "https://x.example.com/", Proxy: &v1alpha1.ProxySpec{URL: "http://p:3128",
			CredentialsSecretRef: &v1alpha1.LocalObjectReference{Name: "oauth"}}}, "proxy credentials: Secret oauth has neither username nor password"},
	} {
		c := Resolve(ep(tc.spec), nil, get)
		if c.ConfigError == nil || !strings.Contains(c.ConfigError.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, c.ConfigError, tc.want)
		}
		if c.ConfigError != nil && strings.Contains(c.ConfigError.Error(), "T0SECRET") {
			t.Errorf("%s: the error quotes the URL: %v", name, c.ConfigError)
		}
	}
}
