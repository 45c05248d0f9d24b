package controllers_test

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
)

// What spec.urlFrom, spec.auth and spec.proxy refer to is checked like every Secret an endpoint
// names: until each Secret consents the endpoint is not Ready (SecretNotAllowed, naming the
// field), a missing one is SecretNotFound, and once they consent the dispatcher's Role reads
// exactly them. A token URL or a proxy the installation's outbound policy refuses is
// InvalidURL, naming the field. The URL of urlFrom is nowhere in the endpoint's status or in
// `kubectl webhooks status`.
func TestAuthURLFromAndProxyReferences(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	const hookURL = "https://hooks.slack.example/services/T000SECRET/B000SECRET/xoxb-not-shown"
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hook"}, StringData: map[string]string{"url": hookURL}})
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "oauth"}, StringData: map[string]string{"id": "billing", "secret": "s"}})
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "proxy"}, Type: corev1.SecretTypeBasicAuth,
		StringData: map[string]string{"username": "u", "password": "p"}})
	create(t, endpoint(ns, "billing", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.URL = ""
		ep.Spec.URLFrom = &v1alpha1.URLFromSource{SecretKeyRef: v1alpha1.SecretKeySelector{Name: "hook", Key: "url"}}
		ep.Spec.Auth = &v1alpha1.AuthSpec{OAuth2ClientCredentials: &v1alpha1.OAuth2ClientCredentials{TokenURL: "https://auth.example.com/oauth/token",
			ClientIDRef: v1alpha1.SecretKeySelector{Name: "oauth", Key: "id"}, ClientSecretRef: &v1alpha1.SecretKeySelector{Name: "oauth", Key: "secret"}}}
		ep.Spec.Proxy = &v1alpha1.ProxySpec{URL: "http://proxy.example.com:3128", CredentialsSecretRef: &v1alpha1.LocalObjectReference{Name: "proxy"}}
	}))
	markAvailable(t, ns, "webhook-dispatcher")

	notAllowed := func(says string) {
		t.Helper()
		g.Eventually(func(g Gomega) {
			ep := getEndpoint(g, ns, "billing")
			g.Expect(readyOf(ep)).To(Equal("False/" + v1alpha1.ReasonSecretNotAllowed))
			g.Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady).Message).To(ContainSubstring(says))
		}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	}
	notAllowed("Secret " + ns + "/hook (spec.urlFrom.secretKeyRef) does not consent to endpoint billing")
	setSecretAnnotation(t, ns, "hook", consent.AllowedEndpoints, "billing")
	notAllowed("Secret " + ns + "/oauth (spec.auth.oauth2ClientCredentials.clientIDRef) does not consent")
	setSecretAnnotation(t, ns, "oauth", consent.AllowedEndpoints, "billing")
	notAllowed("Secret " + ns + "/proxy (spec.proxy.credentialsSecretRef) does not consent")
	setSecretAnnotation(t, ns, "proxy", consent.AllowedEndpoints, "*")
	ep := eventuallyReady(t, ns, "billing", "True/Ready")
	expectRoleSecrets(t, ns, "webhook-dispatcher", "billing-signing", "hook", "oauth", "proxy")
	shown := []string{}
	for _, c := range ep.Status.Conditions {
		shown = append(shown, c.Message)
	}
	shown = append(shown, plugin.StatusOf(ep).URL)
	for _, s := range shown {
		g.Expect(s).NotTo(ContainSubstring("T000SECRET"))
	}
	g.Expect(plugin.StatusOf(ep).URL).To(Equal("(from Secret hook key url)"))

	// A key Secret that does not exist.
	create(t, endpoint(ns, "jwt", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Auth = &v1alpha1.AuthSpec{SignedJWT: &v1alpha1.SignedJWT{KeyRef: v1alpha1.SecretKeySelector{Name: "jwt-key", Key: "key.pem"},
			Algorithm: "ES256", Issuer: "webhook-operator", Audience: "https://receiver.example.com"}}
	}))
	ep = eventuallyReady(t, ns, "jwt", "False/"+v1alpha1.ReasonSecretNotFound)
	g.Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady).Message).To(
		Equal("Secret " + ns + "/jwt-key (spec.auth.signedJWT.keyRef) not found"))

	// A token URL and a proxy the outbound guard refuses.
	for name, c := range map[string]struct {
		change func(*v1alpha1.WebhookEndpoint)
		says   string
	}{
		"metadata-token": {func(ep *v1alpha1.WebhookEndpoint) {
			ep.Spec.Auth = &v1alpha1.AuthSpec{OAuth2ClientCredentials: &v1alpha1.OAuth2ClientCredentials{TokenURL: "https://169.254.169.254/token",
				ClientIDRef: v1alpha1.SecretKeySelector{Name: "oauth", Key: "id"}, ClientSecretRef: &v1alpha1.SecretKeySelector{Name: "oauth", Key: "secret"}}}
		}, "spec.auth.oauth2ClientCredentials.tokenURL is refused: blocked_address: 169.254.169.254 is a cloud metadata address"},
		"private-proxy": {func(ep *v1alpha1.WebhookEndpoint) {
			ep.Spec.Proxy = &v1alpha1.ProxySpec{URL: "http://10.1.2.3:3128"}
		}, "spec.proxy.url is refused: blocked_address: 10.1.2.3 is a private address"},
	} {
		create(t, endpoint(ns, name, c.change))
		ep = eventuallyReady(t, ns, name, "False/"+v1alpha1.ReasonInvalidURL)
		g.Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady).Message).To(ContainSubstring(c.says))
	}
}
