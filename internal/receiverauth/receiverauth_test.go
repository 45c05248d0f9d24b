package receiverauth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// noRedirects is the client an endpoint gives: redirects are never followed.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func keyPEM(t *testing.T, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func newKeys(t *testing.T) map[string]crypto.Signer {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]crypto.Signer{RS256: rk, ES256: ek, EdDSA: edk}
}

func oauth2Settings(ts *testenv.TokenServer, style AuthStyle) *Settings {
	return (&Settings{Timeout: 5 * time.Second, OAuth2: &OAuth2{TokenURL: ts.URL(), ClientID: "dispatcher", ClientSecret: "s3cret-value",
		Scopes: []string{"webhooks.write", "orders"}, AuthStyle: style,
		Params: url.Values{"audience": {"https://orders.example"}, "resource": {"https://orders.example/api"}, "tenant": {"shop"}}}}).Finish()
}

func TestClientCredentialsWithASecret(t *testing.T) {
	ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "dispatcher", ClientSecret: "s3cret-value"})
	for _, style := range []AuthStyle{AuthBasic, AuthBody} {
		src := NewSource(oauth2Settings(ts, style))
		tok, err := src.Token(context.Background(), noRedirects)
		if err != nil {
			t.Fatalf("style %d: %v", style, err)
		}
		if !ts.Valid(tok.Header) {
			t.Fatalf("style %d: the token server does not know %q", style, tok.Header)
		}
		reqs := ts.Requests()
		form := reqs[len(reqs)-1]
		if form.Get("scope") != "webhooks.write orders" || form.Get("audience") != "https://orders.example" ||
			form.Get("resource") != "https://orders.example/api" || form.Get("tenant") != "shop" {
			t.Errorf("style %d: token request form %v", style, form)
		}
		if inBody := form.Get("client_secret") != ""; inBody != (style == AuthBody) {
			t.Errorf("style %d: client_secret in the body: %v", style, inBody)
		}
	}
	// A wrong secret is an Error that says what the token endpoint answered, never the secret.
	bad := oauth2Settings(ts, AuthBasic)
	bad.OAuth2.ClientSecret = "wrong-secret-value"
	_, err := NewSource(bad.Finish()).Token(context.Background(), noRedirects)
	var ae *Error
	if !errors.As(err, &ae) || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "invalid_client") ||
		strings.Contains(err.Error(), "wrong-secret-value") {
		t.Fatalf("a refused client: %v", err)
	}
}

func TestClientAssertionIsPrivateKeyJWT(t *testing.T) {
	for alg, key := range newKeys(t) {
		ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "dispatcher", AssertionKey: key.Public()})
		j, err := NewJWT(keyPEM(t, key), alg, "key-1", "", "", "", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		s := (&Settings{Timeout: 5 * time.Second, OAuth2: &OAuth2{TokenURL: ts.URL(), ClientID: "dispatcher", Assertion: j}}).Finish()
		src := NewSource(s)
		tok, err := src.Token(context.Background(), noRedirects)
		if err != nil {
			t.Fatalf("%s: %v", alg, err)
		}
		if !ts.Valid(tok.Header) {
			t.Fatalf("%s: the token server does not know the token", alg)
		}
		form := ts.Requests()[0]
		if form.Get("client_secret") != "" || form.Get("client_id") != "dispatcher" {
			t.Errorf("%s: form %v", alg, form)
		}
		// The assertion's header names the key id and the algorithm.
		parsed, err := jwt.ParseSigned(form.Get("client_assertion"), []jose.SignatureAlgorithm{jose.SignatureAlgorithm(alg)})
		if err != nil {
			t.Fatalf("%s: %v", alg, err)
		}
		if h := parsed.Headers[0]; h.KeyID != "key-1" || h.Algorithm != alg {
			t.Errorf("%s: header %+v", alg, h)
		}
		// A second grant signs a new assertion (a new jti), which the server accepts.
		src.Invalidate(tok)
		if _, err := src.Token(context.Background(), noRedirects); err != nil {
			t.Fatalf("%s: second grant: %v", alg, err)
		}
	}
}

func TestBearerJWTVerifies(t *testing.T) {
	for alg, key := range newKeys(t) {
		j, err := NewJWT(keyPEM(t, key), alg, "k2", "webhook-operator", "", "https://orders.example", 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		src := NewSource((&Settings{JWT: j}).Finish())
		tok, err := src.Token(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, ok := strings.CutPrefix(tok.Header, "Bearer ")
		if !ok {
			t.Fatalf("%s: header %q", alg, tok.Header)
		}
		parsed, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.SignatureAlgorithm(alg)})
		if err != nil {
			t.Fatal(err)
		}
		var c jwt.Claims
		if err := parsed.Claims(key.Public(), &c); err != nil {
			t.Fatalf("%s: %v", alg, err)
		}
		if err := c.Validate(jwt.Expected{Issuer: "webhook-operator", Subject: "webhook-operator", AnyAudience: jwt.Audience{"https://orders.example"}, Time: time.Now()}); err != nil {
			t.Fatalf("%s: %v", alg, err)
		}
		if got := c.Expiry.Time().Sub(c.IssuedAt.Time()); got != 2*time.Minute {
			t.Errorf("%s: lifetime %s", alg, got)
		}
		// Another key does not verify it.
		other := newKeys(t)[alg]
		if err := parsed.Claims(other.Public(), &c); err == nil {
			t.Errorf("%s: verified with another key", alg)
		}
	}
}

func TestNewJWTRefusesMismatchedKeys(t *testing.T) {
	keys := newKeys(t)
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	for _, tc := range []struct {
		name string
		pem  []byte
		alg  string
		want string
	}{
		{"EC key for RS256", keyPEM(t, keys[ES256]), RS256, "needs an RSA key, the key is ECDSA P-256"},
		{"RSA key for EdDSA", keyPEM(t, keys[RS256]), EdDSA, "needs an Ed25519 key"},
		{"small RSA key", keyPEM(t, small), RS256, "1024 bits"},
		{"unknown algorithm", keyPEM(t, keys[ES256]), "HS256", "is not RS256, ES256 or EdDSA"},
		{"not PEM", []byte("hello"), ES256, "not PEM"},
		{"a certificate", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}), ES256, "not a private key"},
		{"encrypted", pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}), ES256, "encrypted"},
	} {
		_, err := NewJWT(tc.pem, tc.alg, "", "", "", "", 0)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestOneFetchInFlight(t *testing.T) {
	ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "dispatcher", ClientSecret: "s3cret-value"})
	ts.Hold()
	src := NewSource(oauth2Settings(ts, AuthBasic))
	var wg sync.WaitGroup
	var got sync.Map
	var failed atomic.Int32
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok, err := src.Token(context.Background(), noRedirects)
			if err != nil {
				failed.Add(1)
				return
			}
			got.Store(i, tok.Header)
		}()
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return ts.Fetches() == 1 }, "the token request arrives")
	ts.Release()
	wg.Wait()
	if failed.Load() != 0 || ts.Fetches() != 1 || src.Fetches() != 1 {
		t.Fatalf("failed %d, token requests %d, fetches %d", failed.Load(), ts.Fetches(), src.Fetches())
	}
	first, _ := got.Load(0)
	got.Range(func(_, v any) bool {
		if v != first {
			t.Errorf("callers got different tokens")
		}
		return true
	})
}

// clock is a settable time for the source.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestRefreshBeforeExpiryInvalidateAndFailure(t *testing.T) {
	ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "dispatcher", ClientSecret: "s3cret-value", Lifetime: 100 * time.Second})
	clk := &clock{now: time.Now()}
	src := NewSource(oauth2Settings(ts, AuthBasic))
	src.now = clk.Now
	ctx := context.Background()
	tok1, err := src.Token(ctx, noRedirects)
	if err != nil {
		t.Fatal(err)
	}
	// Before three quarters of its life: the same token, no request.
	clk.Add(70 * time.Second)
	if tok, _ := src.Token(ctx, noRedirects); tok != tok1 || src.Fetches() != 1 {
		t.Fatalf("at 70s: a new token or a fetch (%d)", src.Fetches())
	}
	// Past them: the same token at once, and a new one fetched in the background.
	clk.Add(10 * time.Second)
	if tok, _ := src.Token(ctx, noRedirects); tok != tok1 {
		t.Fatal("at 80s the current token still serves while a new one is fetched")
	}
	var tok2 Token
	testenv.Eventually(t, 5*time.Second, func() bool {
		tok2, _ = src.Token(ctx, noRedirects)
		return tok2 != tok1
	}, "the token is refreshed before it expires")
	if src.Fetches() != 2 {
		t.Fatalf("fetches %d, want 2", src.Fetches())
	}
	// Invalidating an older token keeps the newer one; invalidating the current one fetches.
	src.Invalidate(tok1)
	if tok, _ := src.Token(ctx, noRedirects); tok != tok2 {
		t.Fatal("invalidating an old token dropped the current one")
	}
	src.Invalidate(tok2)
	tok3, err := src.Token(ctx, noRedirects)
	if err != nil || tok3 == tok2 || src.Fetches() != 3 {
		t.Fatalf("after a 401: %v, fetches %d", err, src.Fetches())
	}

	// The token endpoint down: the error, then the same error without asking for a second.
	ts.Fail(http.StatusServiceUnavailable)
	src.Invalidate(tok3)
	_, err = src.Token(ctx, noRedirects)
	if err == nil || !strings.Contains(err.Error(), "503") || strings.Contains(err.Error(), "s3cret-value") {
		t.Fatalf("token endpoint down: %v", err)
	}
	before := ts.Fetches()
	if _, err2 := src.Token(ctx, noRedirects); err2 == nil || ts.Fetches() != before {
		t.Fatalf("within a second of a failure: %v, requests %d -> %d", err2, before, ts.Fetches())
	}
	clk.Add(2 * time.Second)
	ts.Fail(0)
	if _, err := src.Token(ctx, noRedirects); err != nil {
		t.Fatalf("the token endpoint back: %v", err)
	}
}

func TestTokenRequestsFollowNoRedirect(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Write([]byte(`{"access_token":"x","token_type":"Bearer"}`))
	}))
	defer other.Close()
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/token", http.StatusTemporaryRedirect)
	}))
	defer redirecting.Close()
	s := (&Settings{Timeout: 5 * time.Second, OAuth2: &OAuth2{TokenURL: redirecting.URL + "/token", ClientID: "dispatcher", ClientSecret: "s3cret-value"}}).Finish()
	_, err := NewSource(s).Token(context.Background(), noRedirects)
	if err == nil || !strings.Contains(err.Error(), "307") || !strings.Contains(err.Error(), "redirects are not followed") {
		t.Fatalf("a redirecting token endpoint: %v", err)
	}
	if elsewhere.Load() != 0 {
		t.Fatal("the client's credentials reached another host")
	}
}

func TestSameAndSecrets(t *testing.T) {
	ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "dispatcher", ClientSecret: "s3cret-value"})
	a, b := oauth2Settings(ts, AuthBasic), oauth2Settings(ts, AuthBasic)
	if !Same(a, b) || !Same(nil, nil) || Same(a, nil) {
		t.Fatal("equal settings differ")
	}
	c := oauth2Settings(ts, AuthBasic)
	c.OAuth2.ClientSecret = "rotated-secret"
	if Same(a, c.Finish()) {
		t.Fatal("a rotated secret is the same")
	}
	if s := a.Secrets(); len(s) != 1 || s[0] != "s3cret-value" {
		t.Fatalf("Secrets %v", s)
	}
}

// A token endpoint that issues tokens expired already is an error, not a loop of requests.
func TestExpiredTokensAreAnError(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"access_token":"abcdefgh","token_type":"Bearer","expires_in":-5}`))
	}))
	defer srv.Close()
	s := (&Settings{Timeout: 5 * time.Second, OAuth2: &OAuth2{TokenURL: srv.URL, ClientID: "c", ClientSecret: "s3cret-value"}}).Finish()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := NewSource(s).Token(ctx, noRedirects)
	if err == nil || !strings.Contains(err.Error(), "expired already") || n.Load() != 1 {
		t.Fatalf("%v after %d requests", err, n.Load())
	}
}

// A bearer JWT is signed again once three quarters of its lifetime have passed, while the
// current one still serves, and never used past its last tenth: each one verifies (go-jose)
// at the time it is sent, with its own jti.
func TestBearerJWTRotatesBeforeItExpires(t *testing.T) {
	key := newKeys(t)[EdDSA]
	j, err := NewJWT(keyPEM(t, key), EdDSA, "k3", "webhook-operator", "", "https://orders.example", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{now: time.Now()}
	src := NewSource((&Settings{JWT: j}).Finish())
	src.now = clk.Now
	verify := func(tok Token) jwt.Claims {
		t.Helper()
		parsed, err := jwt.ParseSigned(strings.TrimPrefix(tok.Header, "Bearer "), []jose.SignatureAlgorithm{jose.EdDSA})
		if err != nil {
			t.Fatal(err)
		}
		var c jwt.Claims
		if err := parsed.Claims(key.Public(), &c); err != nil {
			t.Fatal(err)
		}
		if err := c.ValidateWithLeeway(jwt.Expected{Issuer: "webhook-operator", AnyAudience: jwt.Audience{"https://orders.example"}, Time: clk.Now()}, 0); err != nil {
			t.Fatalf("at %s: %v", clk.Now().Format(time.TimeOnly), err)
		}
		return c
	}
	ctx := context.Background()
	seen := map[string]bool{}
	for range 60 { // 13 minutes in steps of 13s
		tok, err := src.Token(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen[verify(tok).ID] = true
		clk.Add(13 * time.Second)
		// The background signing ends before the next step.
		testenv.Eventually(t, 5*time.Second, func() bool {
			src.mu.Lock()
			defer src.mu.Unlock()
			return src.fetching == nil
		}, "the JWT is signed")
	}
	// Never one past its expiry (verify, at each step), so at least one a minute and a step
	// (12 over 13 minutes, when the renewal starts on the last step before expiry: it runs in
	// the background), and none renewed long before it must be (at most one every 45s).
	if len(seen) < 12 || len(seen) > 18 {
		t.Fatalf("%d JWTs over 13 minutes of one-minute JWTs", len(seen))
	}
}
