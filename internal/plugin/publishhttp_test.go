package plugin_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// audiencesOf reads the aud claim of a JWT (unverified: the test only looks at what was sent).
func audiencesOf(t *testing.T, token string) []string {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %.20s...", token)
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		Aud []string `json:"aud"`
	}
	if err := json.Unmarshal(b, &claims); err != nil {
		t.Fatal(err)
	}
	return claims.Aud
}

// `kubectl webhooks publish --via http` sends the ingress a token of the ingress's audience,
// requested for the kubeconfig's ServiceAccount, never the kubeconfig's own token (good against
// the API server too) unless told; it sends no token over http:// unless told, and follows no
// redirect. The ingress here is a recording receiver answering as the ingress does.
func TestPublishViaHTTPSendsATokenOfTheIngressAudience(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "publisher", Namespace: e.ns}}); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody", Namespace: e.ns}}); err != nil {
		t.Fatal(err)
	}
	// publisher may request tokens for itself; nobody may not.
	if err := cp.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "publisher", Namespace: e.ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{"publisher"}, Verbs: []string{"create"}}}}); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "publisher", Namespace: e.ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "publisher"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "publisher", Namespace: e.ns}}}); err != nil {
		t.Fatal(err)
	}
	accepted := func(testenv.Request) testenv.Response {
		return testenv.Response{Status: http.StatusAccepted, Header: http.Header{"Content-Type": {"application/json"}},
			Body: `{"status":202,"id":"evt_http","type":"order.created","stream":"WEBHOOKS_` + e.ns + `","sequence":1}`}
	}
	ing := testenv.StartReceiver(t, testenv.ReceiverOptions{Respond: accepted})
	publisher, publisherAPIToken := e.serviceAccountKubeconfig("publisher")
	nobody, nobodyAPIToken := e.serviceAccountKubeconfig("nobody")
	publish := func(kubeconfig string, extra ...string) result {
		t.Helper()
		return runWithKubeconfig(kubeconfig, append([]string{"publish", "order.created", "--id", "evt_http", "--data", `{"n":1}`,
			"--via", "http", "--ingress-url", ing.URL()}, extra...)...)
	}
	sent := func() string {
		t.Helper()
		reqs := ing.Requests()
		if len(reqs) == 0 {
			t.Fatal("the ingress got no request")
		}
		return strings.TrimPrefix(reqs[len(reqs)-1].Header.Get("Authorization"), "Bearer ")
	}

	// http:// without --ingress-allow-plaintext-tokens: refused before anything is sent.
	r := publish(publisher)
	if r.code != plugin.ExitRefused || !strings.Contains(r.errOut, "without TLS") || !strings.Contains(r.errOut, "--ingress-allow-plaintext-tokens") {
		t.Fatalf("a token over http://: %s", r)
	}
	if n := len(ing.Requests()); n != 0 {
		t.Fatalf("the ingress got %d requests over http:// without the flag", n)
	}

	// A ServiceAccount that may request its own tokens sends one of the ingress's audience.
	publish(publisher, "--ingress-allow-plaintext-tokens").must(t, plugin.ExitOK)
	if tok := sent(); tok == publisherAPIToken || !slices.Equal(audiencesOf(t, tok), []string{ingress.DefaultAudience}) {
		t.Errorf("the ingress got a token of audiences %v (the kubeconfig's own: %v)", audiencesOf(t, tok), tok == publisherAPIToken)
	}
	publish(publisher, "--ingress-allow-plaintext-tokens", "--ingress-token-audience", "ingress.example.com").must(t, plugin.ExitOK)
	if aud := audiencesOf(t, sent()); !slices.Equal(aud, []string{"ingress.example.com"}) {
		t.Errorf("--ingress-token-audience: the ingress got a token of audiences %v", aud)
	}

	// One that may not: refused, unless told to send the kubeconfig's own token.
	before := len(ing.Requests())
	r = publish(nobody, "--ingress-allow-plaintext-tokens")
	if r.code != plugin.ExitRefused || !strings.Contains(r.errOut, "never the token your kubeconfig uses for the API server") || !strings.Contains(r.errOut, "--ingress-allow-api-audience-tokens") {
		t.Fatalf("a user without a token of the ingress's audience: %s", r)
	}
	if n := len(ing.Requests()); n != before {
		t.Fatalf("the ingress got %d requests from a refused publish", n-before)
	}
	publish(nobody, "--ingress-allow-plaintext-tokens", "--ingress-allow-api-audience-tokens").must(t, plugin.ExitOK)
	if sent() != nobodyAPIToken {
		t.Error("--ingress-allow-api-audience-tokens: the kubeconfig's token was not sent")
	}

	// A redirect is not followed: the token stays where it was sent.
	elsewhere := testenv.StartReceiver(t, testenv.ReceiverOptions{Respond: accepted})
	ing.SetResponder(func(testenv.Request) testenv.Response {
		return testenv.Response{Status: http.StatusTemporaryRedirect, Header: http.Header{"Location": {elsewhere.URL() + "/v1/namespaces/" + e.ns + "/events"}}}
	})
	r = publish(publisher, "--ingress-allow-plaintext-tokens")
	if r.code == plugin.ExitOK || !strings.Contains(r.errOut, "does not follow") {
		t.Errorf("a redirect: %s", r)
	}
	if n := len(elsewhere.Requests()); n != 0 {
		t.Errorf("the redirect was followed: %d requests reached its target", n)
	}

	// A proxy only when named: the request goes through it.
	ing.SetResponder(accepted)
	proxy := testenv.StartReceiver(t, testenv.ReceiverOptions{Respond: accepted})
	before = len(ing.Requests())
	publish(publisher, "--ingress-allow-plaintext-tokens", "--ingress-proxy-url", proxy.URL()).must(t, plugin.ExitOK)
	if n := len(proxy.Requests()); n != 1 || len(ing.Requests()) != before {
		t.Errorf("--ingress-proxy-url: %d requests through the proxy, %d straight to the ingress", n, len(ing.Requests())-before)
	}
}
