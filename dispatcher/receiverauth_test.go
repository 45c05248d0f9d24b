package dispatcher_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/go-logr/logr/funcr"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// clientSecret is the OAuth2 client secret of these tests: it must never be stored or logged.
const clientSecret = "cs-7f3a9c1e5b2d4f60"

// secret creates a Secret consenting to the endpoints named.
func (e *env) secret(name string, data map[string]string, endpoints ...string) {
	e.t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name,
		Annotations: map[string]string{consent.AllowedEndpoints: strings.Join(endpoints, ",")}}, StringData: data}
	if err := e.k8s.Create(context.Background(), s); err != nil {
		e.t.Fatal(err)
	}
}

// oauth2Spec is spec.auth with the client-credentials grant against ts, the client
// authenticated by the Secret "oauth".
func oauth2Spec(ts *testenv.TokenServer) *v1alpha1.AuthSpec {
	return &v1alpha1.AuthSpec{OAuth2ClientCredentials: &v1alpha1.OAuth2ClientCredentials{TokenURL: ts.URL(),
		ClientIDRef:     v1alpha1.SecretKeySelector{Name: "oauth", Key: "client-id"},
		ClientSecretRef: &v1alpha1.SecretKeySelector{Name: "oauth", Key: "client-secret"}, Scopes: []string{"webhooks"}}}
}

// bearerOf answers 401 to a request without a token ts issued (unexpired, not revoked).
func bearerOf(ts *testenv.TokenServer) testenv.Responder {
	return func(r testenv.Request) testenv.Response {
		if !ts.Valid(r.Header.Get("Authorization")) {
			return testenv.Response{Status: http.StatusUnauthorized, Body: "bad token " + r.Header.Get("Authorization")}
		}
		return testenv.Response{}
	}
}

// joseVerifier is a receiver that verifies the OAuth2 access tokens of ts as JWTs (RFC 9068)
// with go-jose, as a receiver behind a real authorization server does: the signature with the
// key ts publishes (fetched over HTTP from its JWKS), the type at+jwt, iss, sub, aud, scope and
// client_id, and exp without leeway. It answers 401 to anything else.
func joseVerifier(t *testing.T, ts *testenv.TokenServer, clientID, audience, scope string) testenv.Responder {
	t.Helper()
	resp, err := http.Get(ts.Issuer() + testenv.JWKSPath)
	if err != nil {
		t.Fatal(err)
	}
	var keys jose.JSONWebKeySet
	err = json.NewDecoder(resp.Body).Decode(&keys)
	resp.Body.Close()
	if err != nil || len(keys.Keys) != 1 {
		t.Fatalf("the token server's JWKS: %v (%d keys)", err, len(keys.Keys))
	}
	return func(r testenv.Request) testenv.Response {
		refuse := func(why string) testenv.Response { return testenv.Response{Status: http.StatusUnauthorized, Body: why} }
		raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			return refuse("no bearer token")
		}
		tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.ES256})
		if err != nil {
			return refuse(err.Error())
		}
		if typ, _ := tok.Headers[0].ExtraHeaders[jose.HeaderType].(string); typ != "at+jwt" {
			return refuse("typ " + typ)
		}
		var c jwt.Claims
		var at struct {
			ClientID string `json:"client_id"`
			Scope    string `json:"scope"`
		}
		if err := tok.Claims(keys, &c, &at); err != nil {
			return refuse(err.Error())
		}
		if err := c.ValidateWithLeeway(jwt.Expected{Issuer: ts.Issuer(), Subject: clientID, AnyAudience: jwt.Audience{audience}, Time: time.Now()}, 0); err != nil {
			return refuse(err.Error())
		}
		if at.ClientID != clientID || at.Scope != scope {
			return refuse("client_id " + at.ClientID + " scope " + at.Scope)
		}
		return testenv.Response{}
	}
}

// Tokens that expire every two seconds are refreshed before they expire while events keep
// coming: every event is accepted at its first attempt by a receiver that verifies each access
// token (a JWT the token server signs) with go-jose, expiry without leeway included, and none
// is refused; the one token source of the endpoint asks for a handful of tokens, not one per
// event. For a client authenticated by a secret and by a signed JWT (private_key_jwt, verified
// by the token server with go-jose).
func TestOAuth2TokensRotateMidStream(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		assertion bool
	}{{"secret", false}, {"private-key-jwt", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "orders-dispatcher", ClientSecret: clientSecret,
				AssertionKey: key.Public(), Lifetime: 2 * time.Second, JWTAccessTokens: true})
			rcv := newReceiver(t, joseVerifier(t, ts, "orders-dispatcher", "https://orders.example", "webhooks"))
			e.secret("oauth", map[string]string{"client-id": "orders-dispatcher", "client-secret": clientSecret, "key.pem": pemOf(t, key)}, "orders")
			auth := oauth2Spec(ts)
			auth.OAuth2ClientCredentials.Audience = "https://orders.example"
			if tc.assertion {
				o := auth.OAuth2ClientCredentials
				o.ClientSecretRef = nil
				o.ClientAssertion = &v1alpha1.SignedJWT{KeyRef: v1alpha1.SecretKeySelector{Name: "oauth", Key: "key.pem"}, Algorithm: "ES256", KeyID: "k1"}
			}
			rcv.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Auth: auth}))
			e.dispatcher("d1")

			// Events keep coming until the token server has issued four tokens: three
			// rotations while deliveries flow.
			n := 0
			testenv.Eventually(t, 30*time.Second, func() bool {
				if n < 400 {
					n++
					e.publish("order.created", fmt.Sprintf("evt_%03d", n), []byte(`{}`))
				}
				return ts.Fetches() >= 4 && rcv.Stats().Accepted == n
			}, "tokens rotated %v times; %v of %v events accepted", lazyN(ts.Fetches), lazyN(func() int { return rcv.Stats().Accepted }), lazyN(func() int { return n }))
			st := rcv.Stats()
			if st.Refused != 0 || st.Accepted != n || st.Unique != n {
				t.Fatalf("receiver: %+v for %d events, want each accepted once and none refused", st, n)
			}
			if f := ts.Fetches(); f > n/2 {
				t.Fatalf("%d token requests for %d events: tokens are not cached", f, n)
			}
			for _, form := range ts.Requests() {
				if form.Get("scope") != "webhooks" {
					t.Fatalf("token request without the scope: %v", form)
				}
				if tc.assertion && (form.Get("client_assertion") == "" || form.Get("client_secret") != "") {
					t.Fatalf("a private_key_jwt token request with %v", form)
				}
			}
			if dls := e.deadLetters(); len(dls) != 0 {
				t.Fatalf("%d dead letters", len(dls))
			}
		})
	}
}

// A receiver that refuses the token (the authorization server revoked it) gets the request
// once more with a new one, within the same attempt; a receiver that refuses every token gets
// exactly two requests per attempt, and the delivery fails with its 401 like any other status.
func TestReceiver401GetsOneRetryWithANewToken(t *testing.T) {
	e := newEnv(t)
	ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "orders-dispatcher", ClientSecret: clientSecret})
	rcv := newReceiver(t, bearerOf(ts))
	never := newReceiver(t, func(testenv.Request) testenv.Response {
		return testenv.Response{Status: http.StatusUnauthorized, Body: "no"}
	})
	e.secret("oauth", map[string]string{"client-id": "orders-dispatcher", "client-secret": clientSecret}, "orders", "strict")
	twice := e.policy("twice", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 10 * time.Millisecond}}, CircuitBreaker: noCircuit()})
	rcv.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Auth: oauth2Spec(ts), EventTypes: []v1alpha1.EventTypePattern{"order.*"}}))
	never.Trust(e.endpoint("strict", v1alpha1.WebhookEndpointSpec{URL: never.URL(), Auth: oauth2Spec(ts), RetryPolicyRef: twice,
		EventTypes: []v1alpha1.EventTypePattern{"audit.*"}}))
	e.dispatcher("d1")

	e.publish("order.created", "evt_1", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return rcv.Stats().Accepted == 1 }, "evt_1 not accepted")
	ts.Revoke()
	before := ts.Fetches()
	e.publish("order.created", "evt_2", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return rcv.Stats().Accepted == 2 }, "evt_2 not accepted after the token was revoked")
	if got := rcv.RequestsByID()["evt_2"]; got != 2 || ts.Fetches() != before+1 {
		t.Fatalf("evt_2: %d requests and %d new tokens, want 2 requests (401, then 200) and 1 token", got, ts.Fetches()-before)
	}
	for _, r := range e.logRecords("orders") {
		if r.EventID == "evt_2" && (r.Attempt != 1 || r.State != records.StateSucceeded) {
			t.Fatalf("evt_2 logged as %+v, want one attempt that succeeded", r)
		}
	}

	e.publish("audit.read", "evt_3", []byte(`{}`))
	testenv.Eventually(t, 15*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "evt_3 not dead-lettered")
	if got := never.RequestsByID()["evt_3"]; got != 4 {
		t.Fatalf("the refusing receiver got %d requests for 2 attempts, want 4 (one retry with a new token each)", got)
	}
	dl := e.deadLetters()[0]
	if len(dl.Attempts) != 2 || dl.Attempts[1].StatusCode != http.StatusUnauthorized || dl.Attempts[0].Reason != records.FailStatusCode {
		t.Fatalf("dead letter %+v, want two attempts failing with 401", dl)
	}
}

// A token endpoint that is down (answering 503, then not listening at all) fails each attempt
// as auth_failed without a request to the receiver; the delivery is retried and dead-lettered
// like any failure, and nothing stored says the client secret. When the token endpoint is
// back, deliveries flow again.
func TestTokenEndpointDownIsAuthFailed(t *testing.T) {
	e := newEnv(t)
	ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "orders-dispatcher", ClientSecret: clientSecret})
	rcv := newReceiver(t, bearerOf(ts))
	e.secret("oauth", map[string]string{"client-id": "orders-dispatcher", "client-secret": clientSecret}, "orders")
	thrice := e.policy("thrice", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 1100 * time.Millisecond}, {Duration: 1100 * time.Millisecond}}, CircuitBreaker: noCircuit()})
	rcv.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Auth: oauth2Spec(ts), RetryPolicyRef: thrice}))
	ts.Fail(http.StatusServiceUnavailable)
	e.dispatcher("d1")

	e.publish("order.created", "evt_down", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "not dead-lettered")
	dl := e.deadLetters()[0]
	if dl.Reason != records.ReasonExhausted || len(dl.Attempts) != 3 {
		t.Fatalf("dead letter %+v, want exhausted after 3 attempts", dl)
	}
	for _, a := range dl.Attempts {
		if a.Reason != records.FailAuth || !strings.Contains(a.Error, "503") || a.StatusCode != 0 {
			t.Fatalf("attempt %+v, want auth_failed naming the token endpoint's 503", a)
		}
	}
	if rcv.Stats().Requests != 0 {
		t.Fatalf("the receiver got %d requests without a token", rcv.Stats().Requests)
	}
	if ts.Fetches() < 3 {
		t.Fatalf("%d token requests for 3 attempts", ts.Fetches())
	}
	// The token endpoint gone altogether (its connections refused): the same, naming the refusal.
	ts.Fail(0)
	ts.Down()
	e.publish("order.created", "evt_gone", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 2 }, "evt_gone not dead-lettered")
	for _, dl := range e.deadLetters() {
		if dl.EventID != "evt_gone" {
			continue
		}
		if len(dl.Attempts) != 3 {
			t.Fatalf("dead letter %+v, want 3 attempts", dl)
		}
		// The first attempt may still get the 503 (a failure is the answer for a second).
		for i, a := range dl.Attempts {
			if a.Reason != records.FailAuth || i > 0 && !strings.Contains(a.Error, "connection refused") {
				t.Fatalf("attempt %+v, want auth_failed naming the refused connection", a)
			}
		}
	}
	if rcv.Stats().Requests != 0 {
		t.Fatalf("the receiver got %d requests without a token", rcv.Stats().Requests)
	}
	if err := ts.Up(); err != nil {
		t.Fatal(err)
	}
	e.publish("order.created", "evt_back", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return rcv.Stats().Accepted == 1 }, "not delivered once the token endpoint is back")
	assertNowhere(t, e, "orders", clientSecret)
}

// A JWT the dispatcher signs, with each algorithm spec.auth offers (RS256, ES256, EdDSA), is
// verified by the receiver with go-jose: signature, key id, issuer, audience and expiry (no
// leeway); the delivery log shows the header redacted.
func TestSignedJWTBearerIsVerifiedByTheReceiver(t *testing.T) {
	e := newEnv(t)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]crypto.Signer{"RS256": rsaKey, "ES256": ecKey, "EdDSA": edKey}
	rcvs := map[string]*testenv.Receiver{}
	for alg, key := range keys {
		name := "orders-" + strings.ToLower(alg)
		rcv := newReceiver(t, func(r testenv.Request) testenv.Response {
			raw, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.SignatureAlgorithm(alg)})
			if err != nil {
				return testenv.Response{Status: http.StatusUnauthorized, Body: err.Error()}
			}
			var c jwt.Claims
			if err := tok.Claims(key.Public(), &c); err != nil {
				return testenv.Response{Status: http.StatusUnauthorized, Body: err.Error()}
			}
			if err := c.ValidateWithLeeway(jwt.Expected{Issuer: "webhook-operator", AnyAudience: jwt.Audience{"https://orders.example"}, Time: time.Now()}, 0); err != nil ||
				tok.Headers[0].KeyID != "2026-12" || c.ID == "" {
				return testenv.Response{Status: http.StatusUnauthorized, Body: fmt.Sprint(err)}
			}
			return testenv.Response{}
		})
		e.secret("jwt-"+strings.ToLower(alg), map[string]string{"key.pem": pemOf(t, key)}, name)
		rcv.Trust(e.endpoint(name, v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Auth: &v1alpha1.AuthSpec{SignedJWT: &v1alpha1.SignedJWT{
			KeyRef: v1alpha1.SecretKeySelector{Name: "jwt-" + strings.ToLower(alg), Key: "key.pem"}, Algorithm: v1alpha1.JWTAlgorithm(alg), KeyID: "2026-12",
			Issuer: "webhook-operator", Audience: "https://orders.example", Lifetime: dur(time.Minute)}}}))
		rcvs[name] = rcv
	}
	e.dispatcher("d1")
	for i := range 5 {
		e.publish("order.created", fmt.Sprintf("evt_%d", i), []byte(`{}`))
	}
	for name, rcv := range rcvs {
		testenv.Eventually(t, 15*time.Second, func() bool { return rcv.Stats().Accepted == 5 }, "%s: JWTs not accepted: %v", name, lazy(func() string {
			if r := rcv.Requests(); len(r) > 0 {
				return r[0].Header.Get("Authorization")
			}
			return "no request"
		}))
		if st := rcv.Stats(); st.Refused != 0 {
			t.Fatalf("%s: %+v", name, st)
		}
		for _, r := range e.logRecords(name) {
			if v := r.RequestHeaders["Authorization"]; v != "[redacted]" {
				t.Fatalf("the delivery log holds Authorization %q", v)
			}
		}
	}
}

// The URL of urlFrom (a receiver whose path is its secret) is used and never shown: not in the
// dead letter, the delivery log, the status, the dispatcher's log or its spans, even when the
// receiver echoes it back; neither is the OAuth2 client secret or the token.
func TestURLFromIsNeverShown(t *testing.T) {
	e := newEnv(t)
	const secretPath = "/hook/T0SECRET9/B0SECRET7/xoxbSecretToken42"
	ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "orders-dispatcher", ClientSecret: clientSecret})
	var mu sync.Mutex
	var tokens []string
	rcv := newReceiver(t, func(r testenv.Request) testenv.Response {
		mu.Lock()
		tokens = append(tokens, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		mu.Unlock()
		// A receiver that echoes what it got, path and credentials included.
		return testenv.Response{Status: http.StatusInternalServerError, Body: "no route for " + r.Path + " with " + r.Header.Get("Authorization")}
	})
	e.secret("hook", map[string]string{"url": rcv.URLWithPath(secretPath)}, "orders")
	e.secret("oauth", map[string]string{"client-id": "orders-dispatcher", "client-secret": clientSecret}, "orders")
	once := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	rcv.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URLFrom: &v1alpha1.URLFromSource{SecretKeyRef: v1alpha1.SecretKeySelector{Name: "hook", Key: "url"}},
		Auth: oauth2Spec(ts), RetryPolicyRef: once}))
	var logMu sync.Mutex
	var logs strings.Builder
	exp := tracetest.NewInMemoryExporter()
	e.dispatcher("d1", func(o *dispatcher.Options) {
		o.Tracer = tracing.New(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
		o.Logger = funcr.New(func(prefix, args string) {
			logMu.Lock()
			logs.WriteString(prefix + " " + args + "\n")
			logMu.Unlock()
		}, funcr.Options{Verbosity: 2})
	})
	e.publish("order.created", "evt_1", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "not dead-lettered")
	if got := rcv.Requests(); len(got) != 1 || got[0].Path != secretPath {
		t.Fatalf("the receiver got %d requests (want 1 on the secret path)", len(got))
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("orders").Status.Health
		return h != nil && h.LastFailure != nil
	}, "no last failure in status")
	secrets := []string{"T0SECRET9", "xoxbSecretToken42", clientSecret}
	mu.Lock()
	secrets = append(secrets, tokens...)
	mu.Unlock()
	assertNowhere(t, e, "orders", secrets...)
	logMu.Lock()
	defer logMu.Unlock()
	for _, s := range secrets {
		if strings.Contains(logs.String(), s) {
			t.Errorf("the dispatcher's log holds %q", s)
		}
	}
	for _, span := range exp.GetSpans() {
		b, _ := json.Marshal(span.Attributes)
		for _, s := range secrets {
			if strings.Contains(string(b), s) || strings.Contains(span.Status.Description, s) {
				t.Errorf("span %s holds %q", span.Name, s)
			}
		}
	}
}

// assertNowhere fails the test when one of secrets is in the endpoint's dead letters, delivery
// log or status.
func assertNowhere(t *testing.T, e *env, ep string, secrets ...string) {
	t.Helper()
	var stored []string
	for _, dl := range e.deadLetters() {
		b, _ := json.Marshal(dl)
		stored = append(stored, "dead letter "+string(b))
	}
	for _, r := range e.logRecords(ep) {
		b, _ := json.Marshal(r)
		stored = append(stored, "log record "+string(b))
	}
	b, _ := json.Marshal(e.get(ep).Status)
	stored = append(stored, "status "+string(b))
	for _, s := range stored {
		for _, secret := range secrets {
			if secret != "" && strings.Contains(s, secret) {
				t.Errorf("%q is stored: %s", secret, records.Bound(s, 600))
			}
		}
	}
}

// Every request (the token request included) goes through the proxy the test owns and none
// around it: the installation's for one endpoint, the endpoint's own (credentials from its
// Secret) for another. A receiver address the guard refuses is refused before the proxy hears
// of it.
func TestEgressProxyCarriesEveryRequest(t *testing.T) {
	e := newEnv(t)
	shared := testenv.StartProxy(t, testenv.ProxyOptions{User: "installation", Password: "pp-installation-1"})
	own := testenv.StartProxy(t, testenv.ProxyOptions{User: "orders", Password: "pp-orders-2"})
	credDir := t.TempDir()
	for k, v := range map[string]string{"username": "installation", "password": "pp-installation-1"} {
		if err := os.WriteFile(filepath.Join(credDir, k), []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e.cfg.EgressProxy = shared.URL()
	ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "orders-dispatcher", ClientSecret: clientSecret})
	viaShared, viaOwn := newReceiver(t, bearerOf(ts)), newReceiver(t, nil)
	blocked := newReceiver(t, nil)
	e.secret("oauth", map[string]string{"client-id": "orders-dispatcher", "client-secret": clientSecret}, "billing")
	e.secret("proxy", map[string]string{"username": "orders", "password": "pp-orders-2"}, "orders", "metadata")
	once := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	viaShared.Trust(e.endpoint("billing", v1alpha1.WebhookEndpointSpec{URL: viaShared.URL(), Auth: oauth2Spec(ts), EventTypes: []v1alpha1.EventTypePattern{"invoice.*"}}))
	viaOwn.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: viaOwn.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"},
		Proxy: &v1alpha1.ProxySpec{URL: own.URL(), CredentialsSecretRef: &v1alpha1.LocalObjectReference{Name: "proxy"}}}))
	// 127.0.0.2 is loopback like the rest, but outside what this dispatcher's guard allows.
	blockedURL := strings.Replace(blocked.URL(), "127.0.0.1", "127.0.0.2", 1)
	e.endpoint("metadata", v1alpha1.WebhookEndpointSpec{URL: blockedURL, EventTypes: []v1alpha1.EventTypePattern{"audit.*"}, RetryPolicyRef: once,
		Proxy: &v1alpha1.ProxySpec{URL: own.URL(), CredentialsSecretRef: &v1alpha1.LocalObjectReference{Name: "proxy"}}})
	e.cfg.AllowedCIDRs = append(e.cfg.AllowedCIDRs[:0:0], mustPrefix("127.0.0.1/32"))
	e.dispatcher("d1", func(o *dispatcher.Options) { o.EgressProxyCredentials = credDir })

	for i := range 5 {
		e.publish("invoice.paid", fmt.Sprintf("evt_inv_%d", i), []byte(`{}`))
		e.publish("order.created", fmt.Sprintf("evt_ord_%d", i), []byte(`{}`))
	}
	e.publish("audit.read", "evt_blocked", []byte(`{}`))
	testenv.Eventually(t, 15*time.Second, func() bool {
		return viaShared.Stats().Accepted == 5 && viaOwn.Stats().Accepted == 5 && len(e.deadLetters()) == 1
	}, "deliveries through the proxies: %v and %v accepted", lazyN(func() int { return viaShared.Stats().Accepted }), lazyN(func() int { return viaOwn.Stats().Accepted }))
	for _, tc := range []struct {
		rcv   *testenv.Receiver
		proxy *testenv.Proxy
	}{{viaShared, shared}, {viaOwn, own}} {
		for _, r := range tc.rcv.Requests() {
			if !tc.proxy.Tunnelled(r.RemoteAddr) {
				t.Errorf("a request from %s reached %s around its proxy", r.RemoteAddr, tc.rcv.Addr())
			}
		}
	}
	tokenHost := strings.TrimPrefix(strings.TrimSuffix(ts.URL(), "/token"), "http://")
	sawToken := false
	for _, target := range shared.Targets() {
		sawToken = sawToken || target == tokenHost
		if target != tokenHost && target != viaShared.Addr() {
			t.Errorf("the installation's proxy tunnelled to %s", target)
		}
	}
	if !sawToken {
		t.Errorf("the token request did not go through the proxy (tunnels %v)", shared.Targets())
	}
	for _, a := range ts.RemoteAddrs() {
		if !shared.Tunnelled(a) {
			t.Errorf("a token request from %s went around the installation's proxy", a)
		}
	}
	for _, target := range own.Targets() {
		if target != viaOwn.Addr() {
			t.Errorf("the endpoint's proxy tunnelled to %s", target)
		}
	}
	dl := e.deadLetters()[0]
	if dl.Endpoint != "metadata" || dl.Attempts[0].Reason != records.FailBlockedAddress {
		t.Fatalf("dead letter %+v, want metadata refused as blocked_address", dl)
	}
	if blocked.Stats().Requests != 0 {
		t.Fatal("the refused address got a request")
	}
	assertNowhere(t, e, "orders", "pp-orders-2")
}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func pemOf(t *testing.T, key crypto.Signer) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// captureLog makes the dispatcher log everything (verbosity 2) into a buffer; the returned
// function reads it.
func captureLog(o *dispatcher.Options) func() string {
	var mu sync.Mutex
	var logs strings.Builder
	o.Logger = funcr.New(func(prefix, args string) {
		mu.Lock()
		logs.WriteString(prefix + " " + args + "\n")
		mu.Unlock()
	}, funcr.Options{Verbosity: 2})
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return logs.String()
	}
}

// Neither the client's credentials nor the access token ever reach a host other than the
// token URL's and the receiver's: a token endpoint that redirects to another host is an
// auth_failed attempt that names the redirect, and a receiver that redirects is a failed
// attempt; the other host never hears of either (redirects are not followed).
func TestTokensNeverReachAnotherHost(t *testing.T) {
	e := newEnv(t)
	ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "orders-dispatcher", ClientSecret: clientSecret})
	elsewhere := newReceiver(t, nil)
	redirecting := newReceiver(t, func(r testenv.Request) testenv.Response {
		return testenv.Response{Status: http.StatusTemporaryRedirect, Header: http.Header{"Location": {elsewhere.URLWithPath("/token")}}}
	})
	var mu sync.Mutex
	var sent []string
	moved := newReceiver(t, func(r testenv.Request) testenv.Response {
		mu.Lock()
		sent = append(sent, r.Header.Get("Authorization"))
		mu.Unlock()
		return testenv.Response{Status: http.StatusPermanentRedirect, Header: http.Header{"Location": {elsewhere.URLWithPath("/hooks")}}}
	})
	untouched := newReceiver(t, nil)
	e.secret("oauth", map[string]string{"client-id": "orders-dispatcher", "client-secret": clientSecret}, "token-moved", "receiver-moved")
	once := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	viaRedirect := oauth2Spec(ts)
	viaRedirect.OAuth2ClientCredentials.TokenURL = redirecting.URLWithPath("/token")
	viaRedirect.OAuth2ClientCredentials.AuthStyle = v1alpha1.OAuth2AuthBody // the secret in the body a 307 would send again
	untouched.Trust(e.endpoint("token-moved", v1alpha1.WebhookEndpointSpec{URL: untouched.URL(), Auth: viaRedirect, RetryPolicyRef: once,
		EventTypes: []v1alpha1.EventTypePattern{"order.*"}}))
	moved.Trust(e.endpoint("receiver-moved", v1alpha1.WebhookEndpointSpec{URL: moved.URL(), Auth: oauth2Spec(ts), RetryPolicyRef: once,
		EventTypes: []v1alpha1.EventTypePattern{"invoice.*"}}))
	e.dispatcher("d1")

	e.publish("order.created", "evt_token_moved", []byte(`{}`))
	e.publish("invoice.paid", "evt_receiver_moved", []byte(`{}`))
	testenv.Eventually(t, 15*time.Second, func() bool { return len(e.deadLetters()) == 2 }, "not dead-lettered: %v", lazyN(func() int { return len(e.deadLetters()) }))
	for _, dl := range e.deadLetters() {
		a := dl.Attempts[0]
		switch dl.Endpoint {
		case "token-moved":
			if a.Reason != records.FailAuth || !strings.Contains(a.Error, "307") || !strings.Contains(a.Error, "redirects are not followed") {
				t.Errorf("token endpoint redirecting: attempt %+v, want auth_failed naming the 307", a)
			}
		case "receiver-moved":
			if a.Reason != records.FailRedirect || a.StatusCode != http.StatusPermanentRedirect {
				t.Errorf("receiver redirecting: attempt %+v, want a failed redirect", a)
			}
		}
	}
	if n := elsewhere.Stats().Requests; n != 0 {
		t.Fatalf("the other host got %d requests", n)
	}
	if redirecting.Stats().Requests == 0 || untouched.Stats().Requests != 0 {
		t.Fatalf("the redirecting token endpoint got %d requests, the receiver without a token %d", redirecting.Stats().Requests, untouched.Stats().Requests)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1 || !ts.Valid(sent[0]) {
		t.Fatalf("the redirecting receiver got %d requests, want 1 with the token", len(sent))
	}
}

// A token endpoint or an egress proxy may echo what it was sent in its error; the client
// secret (raw, form-encoded and inside the basic credentials), the client assertion and the
// key never reach the dead letter, the delivery log, the status or the dispatcher's log.
func TestEchoedCredentialsAreNeverStoredOrLogged(t *testing.T) {
	e := newEnv(t)
	// A secret whose form and URL encodings differ from it.
	const secret = "s3cr/t+Val=42&x"
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var assertions []string
	echo := newReceiver(t, func(r testenv.Request) testenv.Response {
		if a := regexpAssertion(string(r.Body)); a != "" {
			mu.Lock()
			assertions = append(assertions, a)
			mu.Unlock()
		}
		desc, _ := json.Marshal("no client for " + r.Header.Get("Authorization") + " " + string(r.Body))
		return testenv.Response{Status: http.StatusBadRequest, Header: http.Header{"Content-Type": {"application/json"}},
			Body: `{"error":"invalid_client","error_description":` + string(desc) + `}`}
	})
	rcv := newReceiver(t, nil)
	e.secret("oauth", map[string]string{"client-id": "orders-dispatcher", "client-secret": secret, "key.pem": pemOf(t, key)}, "basic", "body", "assertion")
	once := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	spec := func(style v1alpha1.OAuth2AuthStyle, assertion bool) *v1alpha1.AuthSpec {
		a := &v1alpha1.AuthSpec{OAuth2ClientCredentials: &v1alpha1.OAuth2ClientCredentials{TokenURL: echo.URLWithPath("/token"), AuthStyle: style,
			ClientIDRef: v1alpha1.SecretKeySelector{Name: "oauth", Key: "client-id"}, ClientSecretRef: &v1alpha1.SecretKeySelector{Name: "oauth", Key: "client-secret"}}}
		if assertion {
			a.OAuth2ClientCredentials.ClientSecretRef = nil
			a.OAuth2ClientCredentials.ClientAssertion = &v1alpha1.SignedJWT{KeyRef: v1alpha1.SecretKeySelector{Name: "oauth", Key: "key.pem"}, Algorithm: "ES256"}
		}
		return a
	}
	for _, ep := range []struct {
		name, events string
		auth         *v1alpha1.AuthSpec
	}{{"basic", "a.*", spec(v1alpha1.OAuth2AuthBasic, false)}, {"body", "b.*", spec(v1alpha1.OAuth2AuthBody, false)}, {"assertion", "c.*", spec("", true)}} {
		rcv.Trust(e.endpoint(ep.name, v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Auth: ep.auth, RetryPolicyRef: once,
			EventTypes: []v1alpha1.EventTypePattern{v1alpha1.EventTypePattern(ep.events)}}))
	}
	var logs func() string
	e.dispatcher("d1", func(o *dispatcher.Options) { logs = captureLog(o) })
	for _, typ := range []string{"a.x", "b.x", "c.x"} {
		e.publish(typ, "evt_"+typ, []byte(`{}`))
	}
	testenv.Eventually(t, 15*time.Second, func() bool { return len(e.deadLetters()) == 3 }, "not dead-lettered")
	for _, dl := range e.deadLetters() {
		if a := dl.Attempts[0]; a.Reason != records.FailAuth || !strings.Contains(a.Error, "invalid_client") || !strings.Contains(a.Error, "no client for") {
			t.Errorf("%s: attempt %+v, want auth_failed with what the token endpoint said", dl.Endpoint, a)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("basic").Status.Health
		return h != nil && h.LastFailure != nil
	}, "no last failure in status")
	basic := base64.StdEncoding.EncodeToString([]byte(url.QueryEscape("orders-dispatcher") + ":" + url.QueryEscape(secret)))
	pemBody := strings.Split(pemOf(t, key), "\n")[1]
	secrets := []string{secret, url.QueryEscape(secret), basic, pemBody}
	mu.Lock()
	secrets = append(secrets, assertions...)
	mu.Unlock()
	if len(secrets) == 4 {
		t.Fatal("the token endpoint saw no client assertion")
	}
	for _, ep := range []string{"basic", "body", "assertion"} {
		assertNowhere(t, e, ep, secrets...)
	}
	for _, s := range secrets {
		if strings.Contains(logs(), s) {
			t.Errorf("the dispatcher's log holds %q", s)
		}
	}
	if rcv.Stats().Requests != 0 {
		t.Fatal("the receiver got a request without a token")
	}
}

// regexpAssertion is the client_assertion of a token request's form ("" without one).
func regexpAssertion(form string) string {
	v, err := url.ParseQuery(form)
	if err != nil {
		return ""
	}
	return v.Get("client_assertion")
}

// An egress proxy that is down is not gone around: the delivery fails (reason proxy), a token
// that must be fetched meanwhile fails as auth_failed, and neither the receiver nor the token
// endpoint hears of any of it directly.
func TestADownProxyIsNotGoneAround(t *testing.T) {
	e := newEnv(t)
	proxy := testenv.StartProxy(t, testenv.ProxyOptions{})
	ts := testenv.StartTokenServer(t, testenv.TokenServerOptions{ClientID: "orders-dispatcher", ClientSecret: clientSecret})
	// The receiver closes its connections after answering: a tunnel kept for the next request
	// would be cut by the proxy's closing while the dispatcher may already be writing into it
	// (connection_reset), where this test is about the proxy being unreachable.
	rcv := newReceiver(t, func(r testenv.Request) testenv.Response {
		resp := bearerOf(ts)(r)
		resp.Header = http.Header{"Connection": {"close"}}
		return resp
	})
	later := newReceiver(t, bearerOf(ts))
	e.secret("oauth", map[string]string{"client-id": "orders-dispatcher", "client-secret": clientSecret}, "orders", "later")
	once := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	via := &v1alpha1.ProxySpec{URL: proxy.URL()}
	rcv.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Auth: oauth2Spec(ts), Proxy: via, RetryPolicyRef: once,
		EventTypes: []v1alpha1.EventTypePattern{"order.*"}}))
	later.Trust(e.endpoint("later", v1alpha1.WebhookEndpointSpec{URL: later.URL(), Auth: oauth2Spec(ts), Proxy: via, RetryPolicyRef: once,
		EventTypes: []v1alpha1.EventTypePattern{"invoice.*"}}))
	e.dispatcher("d1")

	e.publish("order.created", "evt_up", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return rcv.Stats().Accepted == 1 }, "not delivered through the proxy")
	fetches := ts.Fetches()
	proxy.Close()
	e.publish("order.created", "evt_down", []byte(`{}`))
	e.publish("invoice.paid", "evt_no_token", []byte(`{}`))
	testenv.Eventually(t, 15*time.Second, func() bool { return len(e.deadLetters()) == 2 }, "not dead-lettered")
	for _, dl := range e.deadLetters() {
		want := map[string]string{"orders": records.FailProxy, "later": records.FailAuth}[dl.Endpoint]
		if a := dl.Attempts[0]; a.Reason != want {
			t.Errorf("%s: attempt %+v, want %s", dl.Endpoint, a, want)
		}
	}
	if rcv.Stats().Requests != 1 || later.Stats().Requests != 0 || ts.Fetches() != fetches {
		t.Fatalf("around the proxy: the receivers got %d and %d requests (want 1 and 0), the token endpoint %d more",
			rcv.Stats().Requests, later.Stats().Requests, ts.Fetches()-fetches)
	}
	for _, r := range rcv.Requests() {
		if !proxy.Tunnelled(r.RemoteAddr) {
			t.Errorf("a request from %s went around the proxy", r.RemoteAddr)
		}
	}
	for _, a := range ts.RemoteAddrs() {
		if !proxy.Tunnelled(a) {
			t.Errorf("a token request from %s went around the proxy", a)
		}
	}
}
