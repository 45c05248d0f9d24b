package console_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/console"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// issuer is a small OpenID Connect provider on loopback, over TLS: discovery, an
// authorization endpoint that signs in whoever the test says (no login page), a token
// endpoint that checks the client's secret, the redirect URI and the PKCE verifier (S256
// only) of a single-use code, and ES256 ID tokens signed with a key it publishes as a JWKS.
type issuer struct {
	srv      *httptest.Server
	key      *ecdsa.PrivateKey
	clientID string
	secret   string

	mu    sync.Mutex
	user  idUser
	codes map[string]grant
	// Tokens counts the ID tokens issued.
	tokens int
}

// idUser is who signs in next, and how the token is made.
type idUser struct {
	Email         string
	EmailVerified bool
	Groups        []string
	// Lifetime of the ID token (negative: already expired).
	Lifetime time.Duration
	// Nonce, when set, replaces the one the client sent.
	Nonce string
}

type grant struct {
	redirect, challenge, nonce string
	user                       idUser
}

func startIssuer(t *testing.T, clientID, secret string) *issuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	is := &issuer{key: key, clientID: clientID, secret: secret, codes: map[string]grant{}}
	is.srv = httptest.NewTLSServer(is)
	t.Cleanup(is.srv.Close)
	return is
}

func (is *issuer) URL() string { return is.srv.URL }

// caPEM is the issuer's certificate, which the API server and the console trust.
func (is *issuer) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: is.srv.Certificate().Raw})
}

func (is *issuer) signsIn(u idUser) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.user = u
}

func oauthErr(w http.ResponseWriter, code int, e, desc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": e, "error_description": desc})
}

func (is *issuer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/.well-known/openid-configuration":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer": is.URL(), "authorization_endpoint": is.URL() + "/authorize", "token_endpoint": is.URL() + "/token",
			"jwks_uri": is.URL() + "/keys", "response_types_supported": []string{"code"}, "subject_types_supported": []string{"public"},
			"id_token_signing_alg_values_supported": []string{"ES256"}, "code_challenge_methods_supported": []string{"S256"},
		})
	case "/keys":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &is.key.PublicKey, KeyID: "k1", Algorithm: string(jose.ES256), Use: "sig"}}})
	case "/authorize":
		q := r.URL.Query()
		redirect := q.Get("redirect_uri")
		switch {
		case q.Get("client_id") != is.clientID:
			http.Error(w, "unknown client", http.StatusBadRequest)
			return
		case q.Get("response_type") != "code" || !strings.Contains(" "+q.Get("scope")+" ", " openid "):
			http.Error(w, "want response_type code and scope openid", http.StatusBadRequest)
			return
		case q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "":
			http.Error(w, "PKCE with S256 is required", http.StatusBadRequest)
			return
		case q.Get("state") == "" || q.Get("nonce") == "":
			http.Error(w, "state and nonce are required", http.StatusBadRequest)
			return
		}
		code := base64.RawURLEncoding.EncodeToString(randomBytes(24))
		is.mu.Lock()
		is.codes[code] = grant{redirect: redirect, challenge: q.Get("code_challenge"), nonce: q.Get("nonce"), user: is.user}
		is.mu.Unlock()
		http.Redirect(w, r, redirect+"?"+url.Values{"code": {code}, "state": {q.Get("state")}}.Encode(), http.StatusFound)
	case "/token":
		if err := r.ParseForm(); err != nil || r.Method != http.MethodPost || r.PostForm.Get("grant_type") != "authorization_code" {
			oauthErr(w, http.StatusBadRequest, "invalid_request", "want a POST of grant_type authorization_code")
			return
		}
		id, secret, ok := r.BasicAuth()
		if !ok {
			id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
		} else {
			id, _ = url.QueryUnescape(id)
			secret, _ = url.QueryUnescape(secret)
		}
		if id != is.clientID || subtle.ConstantTimeCompare([]byte(secret), []byte(is.secret)) != 1 {
			oauthErr(w, http.StatusUnauthorized, "invalid_client", "wrong client credentials")
			return
		}
		is.mu.Lock()
		g, found := is.codes[r.PostForm.Get("code")]
		delete(is.codes, r.PostForm.Get("code")) // single use
		is.mu.Unlock()
		sum := sha256.Sum256([]byte(r.PostForm.Get("code_verifier")))
		switch {
		case !found:
			oauthErr(w, http.StatusBadRequest, "invalid_grant", "unknown or used code")
			return
		case g.redirect != r.PostForm.Get("redirect_uri"):
			oauthErr(w, http.StatusBadRequest, "invalid_grant", "redirect_uri differs")
			return
		case base64.RawURLEncoding.EncodeToString(sum[:]) != g.challenge:
			oauthErr(w, http.StatusBadRequest, "invalid_grant", "the PKCE verifier does not match")
			return
		}
		nonce := g.nonce
		if g.user.Nonce != "" {
			nonce = g.user.Nonce
		}
		now := time.Now()
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: is.key, KeyID: "k1"}}, (&jose.SignerOptions{}).WithType("JWT"))
		if err != nil {
			oauthErr(w, http.StatusInternalServerError, "server_error", err.Error())
			return
		}
		raw, err := jwt.Signed(signer).Claims(jwt.Claims{Issuer: is.URL(), Subject: "sub-" + g.user.Email, Audience: jwt.Audience{is.clientID},
			IssuedAt: jwt.NewNumericDate(now.Add(-time.Minute)), NotBefore: jwt.NewNumericDate(now.Add(-time.Minute)), Expiry: jwt.NewNumericDate(now.Add(g.user.Lifetime))}).
			Claims(map[string]any{"nonce": nonce, "email": g.user.Email, "email_verified": g.user.EmailVerified, "groups": g.user.Groups}).Serialize()
		if err != nil {
			oauthErr(w, http.StatusInternalServerError, "server_error", err.Error())
			return
		}
		is.mu.Lock()
		is.tokens++
		is.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "opaque-" + base64.RawURLEncoding.EncodeToString(randomBytes(16)),
			"token_type": "Bearer", "expires_in": int(g.user.Lifetime.Seconds()), "id_token": raw})
	default:
		http.NotFound(w, r)
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

// Signing in with the cluster's OIDC provider, end to end against real parts: a provider run
// by the test (TLS, discovery, PKCE, ES256 ID tokens from its JWKS), a kube-apiserver that
// trusts it (an AuthenticationConfiguration: the email claim, prefixed oidc:), and the
// console between them. The ID token the console gets by the code flow is the token the
// API server authenticates and RBAC authorizes (the user sees their namespace), the session
// ends with it; a tampered state, another nonce, an expired ID token and a token the API
// server refuses (email not verified) each end on the sign-in page with the reason, and
// without a session.
func TestOIDCSignIn(t *testing.T) {
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	dir := t.TempDir()
	const clientID, secret = "webhook-console", "console-client-secret"
	is := startIssuer(t, clientID, secret)
	ca := filepath.Join(dir, "issuer-ca.pem")
	must(t, os.WriteFile(ca, is.caPEM(), 0o600))
	authn := `apiVersion: apiserver.config.k8s.io/v1
kind: AuthenticationConfiguration
jwt:
- issuer:
    url: ` + is.URL() + `
    audiences: [` + clientID + `]
    certificateAuthority: |
` + indent(string(is.caPEM()), "      ") + `
  claimMappings:
    username:
      claim: email
      prefix: "oidc:"
    groups:
      claim: groups
      prefix: "oidc:"
`
	authnFile := filepath.Join(dir, "authentication.yaml")
	must(t, os.WriteFile(authnFile, []byte(authn), 0o600))
	cp, err := testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{APIServerFlags: map[string]string{"authentication-config": authnFile}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	ctx := context.Background()
	c := cp.Client
	must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sso"}}))
	must(t, c.Create(ctx, &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "sso", Name: "payments"},
		Spec: v1alpha1.WebhookEndpointSpec{URL: "https://payments.example.com/hooks", EventTypes: []v1alpha1.EventTypePattern{"payment.*"}}}))
	// The provider's group, not the user, is granted the namespace: groups come from the
	// ID token too.
	must(t, c.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "sso", Name: "owners"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookendpoints"}, Verbs: []string{"get", "list"}}}}))
	must(t, c.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "sso", Name: "owners"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "owners"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "oidc:payments-team"}}}))

	var handler http.Handler
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	s, err := console.New(ctx, console.Options{Kube: cp.Config, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OIDC: console.OIDCOptions{IssuerURL: is.URL(), ClientID: clientID, ClientSecret: secret, RedirectURL: srv.URL + "/oidc/callback",
			Scopes: []string{"email", "groups"}, CAFile: ca}})
	must(t, err)
	handler = s

	// The sign-in page offers the provider; the whole flow lands on the page asked for.
	alice := idUser{Email: "alice@example.com", EmailVerified: true, Groups: []string{"payments-team"}, Lifetime: 10 * time.Minute}
	is.signsIn(alice)
	u := newBrowser(t, srv.URL)
	if _, page := u.get("/signin?next=/ns/sso"); !strings.Contains(page, `href="/oidc/login?next=%2fns%2fsso"`) {
		t.Fatalf("the sign-in page does not offer the provider: %s", page)
	}
	// The API server accepts the provider's tokens once it has read its keys: until then the
	// console says it does not accept the token, and the user tries again.
	var code int
	var page string
	testenv.Eventually(t, 30*time.Second, func() bool {
		u = newBrowser(t, srv.URL)
		code, page = u.get("/oidc/login?next=/ns/sso")
		return !strings.Contains(element(page, "signin-error"), "does not accept")
	}, "the API server never accepted the provider's ID token")
	who := element(page, "who")
	if code != http.StatusOK || !strings.Contains(who, "Signed in as oidc:alice@example.com") || !strings.Contains(element(page, "endpoints"), "payments") {
		t.Fatalf("after the OIDC sign-in (%d): %q, endpoints %q, error %q", code, who, element(page, "endpoints"), element(page, "signin-error"))
	}
	// The session ends with the ID token.
	until, err := time.Parse("2006-01-02 15:04:05Z", strings.TrimPrefix(who[strings.Index(who, "until ")+len("until "):], ""))
	if err != nil || until.Before(time.Now().Add(8*time.Minute)) || until.After(time.Now().Add(10*time.Minute)) {
		t.Errorf("the session lasts until %s (%v), want the ID token's expiry, about 10 minutes", until, err)
	}
	// Another namespace: RBAC, through the ID token, refuses it.
	if code, page := u.get("/ns/default"); code != http.StatusForbidden || !strings.Contains(element(page, "error"), `User "oidc:alice@example.com" cannot list`) {
		t.Errorf("another namespace: %d %q", code, element(page, "error"))
	}

	// Each way the flow can go wrong ends on the sign-in page, with the reason, signed out.
	step := func(u *user, path string) (string, *http.Response) {
		t.Helper()
		u.hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		defer func() { u.hc.CheckRedirect = nil }()
		resp, err := u.hc.Get(path)
		must(t, err)
		_ = resp.Body.Close()
		return resp.Header.Get("Location"), resp
	}
	for _, c := range []struct {
		name   string
		user   idUser
		tamper func(callback string) string
		want   string
	}{
		{"a tampered state", alice, func(cb string) string { return strings.Replace(cb, "state=", "state=x", 1) }, "state does not match"},
		{"another nonce", idUser{Email: alice.Email, EmailVerified: true, Lifetime: 10 * time.Minute, Nonce: "replayed"}, nil, "nonce does not match"},
		{"an expired ID token", idUser{Email: alice.Email, EmailVerified: true, Lifetime: -time.Minute}, nil, "ID token is not valid"},
		{"a token the API server refuses", idUser{Email: "mallory@example.com", EmailVerified: false, Lifetime: 10 * time.Minute}, nil, "does not accept this token"},
	} {
		is.signsIn(c.user)
		b := newBrowser(t, srv.URL)
		authorize, _ := step(b, srv.URL+"/oidc/login")
		callback, _ := step(b, authorize)
		if !strings.HasPrefix(callback, srv.URL+"/oidc/callback?") {
			t.Fatalf("%s: the provider sent the browser to %q", c.name, callback)
		}
		if c.tamper != nil {
			callback = c.tamper(callback)
		}
		code, page := b.get(strings.TrimPrefix(callback, srv.URL))
		if code != http.StatusUnauthorized || !strings.Contains(element(page, "signin-error"), c.want) {
			t.Errorf("%s: %d %q, want 401 saying %q", c.name, code, element(page, "signin-error"), c.want)
		}
		if code, page := b.get("/ns/sso"); code != http.StatusOK || !strings.Contains(page, `id="token"`) {
			t.Errorf("%s: a session was made (%d)", c.name, code)
		}
	}
	// A code is good once: the provider refuses it the second time, and the console says so.
	is.signsIn(alice)
	b := newBrowser(t, srv.URL)
	authorize, _ := step(b, srv.URL+"/oidc/login")
	callback, _ := step(b, authorize)
	if code, _ := b.get(strings.TrimPrefix(callback, srv.URL)); code != http.StatusOK {
		t.Fatalf("the first use of a code: %d", code)
	}
	b2 := newBrowser(t, srv.URL)
	authorize2, _ := step(b2, srv.URL+"/oidc/login")
	callback2, _ := step(b2, authorize2)
	q, _ := url.Parse(callback)
	q2, _ := url.Parse(callback2)
	replayed := "/oidc/callback?" + url.Values{"code": {q.Query().Get("code")}, "state": {q2.Query().Get("state")}}.Encode()
	if code, page := b2.get(replayed); code != http.StatusUnauthorized || !strings.Contains(element(page, "signin-error"), "did not give a token for the code") {
		t.Errorf("a code used twice: %d %q", code, element(page, "signin-error"))
	}
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = prefix + lines[i]
	}
	return strings.Join(lines, "\n")
}
