package dispatcher_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/netip"
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

// Tokens that expire every two seconds are refreshed before they expire while events keep
// coming: every event is accepted with a valid token at its first attempt, by the one token
// source of the endpoint (a handful of token requests, not one per event), for a client
// authenticated by a secret and by a signed JWT (private_key_jwt, verified by the token server
// with go-jose).
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
				AssertionKey: key.Public(), Lifetime: 2 * time.Second})
			rcv := newReceiver(t, bearerOf(ts))
			e.secret("oauth", map[string]string{"client-id": "orders-dispatcher", "client-secret": clientSecret, "key.pem": pemOf(t, key)}, "orders")
			auth := oauth2Spec(ts)
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

// A token endpoint that is down fails each attempt as auth_failed without a request to the
// receiver; the delivery is retried and dead-lettered like any failure, and nothing stored says
// the client secret. When the token endpoint is back, deliveries flow again.
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
	ts.Fail(0)
	e.publish("order.created", "evt_back", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return rcv.Stats().Accepted == 1 }, "not delivered once the token endpoint is back")
	assertNowhere(t, e, "orders", clientSecret)
}

// A JWT the dispatcher signs (ES256 here) is verified by the receiver with go-jose: issuer,
// audience, expiry and the key id.
func TestSignedJWTBearerIsVerifiedByTheReceiver(t *testing.T) {
	e := newEnv(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ids []string
	rcv := newReceiver(t, func(r testenv.Request) testenv.Response {
		raw, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		tok, err := jwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.ES256})
		if err != nil {
			return testenv.Response{Status: http.StatusUnauthorized, Body: err.Error()}
		}
		var c jwt.Claims
		if err := tok.Claims(key.Public(), &c); err != nil {
			return testenv.Response{Status: http.StatusUnauthorized, Body: err.Error()}
		}
		if err := c.Validate(jwt.Expected{Issuer: "webhook-operator", AnyAudience: jwt.Audience{"https://orders.example"}, Time: time.Now()}); err != nil ||
			tok.Headers[0].KeyID != "2026-12" {
			return testenv.Response{Status: http.StatusUnauthorized, Body: fmt.Sprint(err)}
		}
		mu.Lock()
		ids = append(ids, c.ID)
		mu.Unlock()
		return testenv.Response{}
	})
	e.secret("jwt", map[string]string{"key.pem": pemOf(t, key)}, "orders")
	rcv.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Auth: &v1alpha1.AuthSpec{SignedJWT: &v1alpha1.SignedJWT{
		KeyRef: v1alpha1.SecretKeySelector{Name: "jwt", Key: "key.pem"}, Algorithm: "ES256", KeyID: "2026-12",
		Issuer: "webhook-operator", Audience: "https://orders.example", Lifetime: dur(time.Minute)}}}))
	e.dispatcher("d1")
	for i := range 5 {
		e.publish("order.created", fmt.Sprintf("evt_%d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return rcv.Stats().Accepted == 5 }, "JWTs not accepted: %v", lazy(func() string {
		if r := rcv.Requests(); len(r) > 0 {
			return r[0].Header.Get("Authorization")
		}
		return "no request"
	}))
	for _, r := range e.logRecords("orders") {
		if v := r.RequestHeaders["Authorization"]; v != "[redacted]" {
			t.Fatalf("the delivery log holds Authorization %q", v)
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
