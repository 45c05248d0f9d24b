package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// TokenServerOptions configure a TokenServer.
type TokenServerOptions struct {
	// ClientID and ClientSecret are the one client it knows. The secret is accepted as HTTP
	// basic authentication or in the body.
	ClientID, ClientSecret string
	// AssertionKey, when set, is the public key (or JSONWebKey) that verifies private_key_jwt
	// client assertions (RFC 7523), whose issuer and subject must be the client id and whose
	// audience must be the token URL.
	AssertionKey any
	// Lifetime is the expires_in of the tokens it issues; default an hour.
	Lifetime time.Duration
	// Path is the token endpoint's path; default /token.
	Path string
	// JWTAccessTokens makes the access tokens JWTs (RFC 9068) signed by the server's own
	// ES256 key, which it publishes at JWKSPath, so that a receiver verifies them with a JOSE
	// library as it would a real authorization server's: iss the server's base URL, sub and
	// client_id the client, aud the request's audience (or resource, or the client id), scope,
	// iat, jti, and exp rounded up to the second (never before the expires_in it says).
	JWTAccessTokens bool
}

// JWKSPath is where a TokenServer publishes the public key of its JWT access tokens.
const JWKSPath = "/.well-known/jwks.json"

// TokenServer is an OAuth2 token endpoint on loopback (client-credentials grant, RFC 6749
// section 4.4): it authenticates its one client by secret or by a signed JWT, issues opaque
// tokens that expire (or JWTs a receiver verifies with its published key: JWTAccessTokens), and
// says which tokens are valid (Valid), for a receiver to check. It can fail on purpose (Fail),
// hold its answers (Hold), go down and come back on the same address (Down, Up), and revoke
// what it issued (Revoke); it records where each request came from (RemoteAddrs).
type TokenServer struct {
	o    TokenServerOptions
	url  string
	addr string
	hold chan struct{}
	// key signs JWT access tokens (JWTAccessTokens).
	key    *ecdsa.PrivateKey
	signer jose.Signer

	srvMu sync.Mutex
	srv   *http.Server

	mu       sync.Mutex
	remotes  []string
	issued   map[string]time.Time // token -> expiry
	requests []url.Values
	fetches  int
	fail     int
	jtis     map[string]bool
}

// maxTokenServerRecords bounds what a TokenServer keeps.
const maxTokenServerRecords = 10_000

// NewTokenServer starts a token server on loopback; Close stops it. In a test,
// StartTokenServer.
func NewTokenServer(o TokenServerOptions) (*TokenServer, error) {
	if o.Lifetime <= 0 {
		o.Lifetime = time.Hour
	}
	if o.Path == "" {
		o.Path = "/token"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	s := &TokenServer{o: o, url: "http://" + addr + o.Path, addr: addr, issued: map[string]time.Time{}, jtis: map[string]bool{}}
	if o.JWTAccessTokens {
		if s.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			_ = l.Close()
			return nil, err
		}
		s.signer, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: s.key, KeyID: "ts-1"}},
			(&jose.SignerOptions{}).WithType("at+jwt"))
		if err != nil {
			_ = l.Close()
			return nil, err
		}
	}
	s.serve(l)
	return s, nil
}

// StartTokenServer starts a token server that stops when the test ends.
func StartTokenServer(t testing.TB, o TokenServerOptions) *TokenServer {
	t.Helper()
	s, err := NewTokenServer(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func (s *TokenServer) serve(l net.Listener) {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	s.srvMu.Lock()
	s.srv = srv
	s.srvMu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

// Close answers the held requests and stops the server.
func (s *TokenServer) Close() {
	s.Release()
	s.Down()
}

// Down closes the listener and every connection, so that clients see refused connections
// (a token endpoint that is down), until Up.
func (s *TokenServer) Down() {
	s.srvMu.Lock()
	defer s.srvMu.Unlock()
	_ = s.srv.Close()
}

// Up listens again on the same address after Down, trying for up to 5s while the address is
// still taken.
func (s *TokenServer) Up() error {
	return Poll(5*time.Second, func() error {
		l, err := net.Listen("tcp", s.addr)
		if err != nil {
			return fmt.Errorf("token server: listening again on %s: %w", s.addr, err)
		}
		s.serve(l)
		return nil
	})
}

// URL is the token endpoint, e.g. http://127.0.0.1:41234/token.
func (s *TokenServer) URL() string { return s.url }

// Addr is the server's host and port, e.g. 127.0.0.1:41234.
func (s *TokenServer) Addr() string { return s.addr }

// Issuer is the iss of its JWT access tokens: the server's base URL.
func (s *TokenServer) Issuer() string { return "http://" + s.addr }

// RemoteAddrs are the remote addresses of the requests it received (the most recent 10,000),
// for a test to tell whether they came through a proxy.
func (s *TokenServer) RemoteAddrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.remotes...)
}

// Fail answers every token request with status (e.g. 503) from now on; 0 issues tokens again.
func (s *TokenServer) Fail(status int) {
	s.mu.Lock()
	s.fail = status
	s.mu.Unlock()
}

// Hold makes token requests wait until Release.
func (s *TokenServer) Hold() {
	s.mu.Lock()
	if s.hold == nil {
		s.hold = make(chan struct{})
	}
	s.mu.Unlock()
}

// Release answers the held token requests and those that come.
func (s *TokenServer) Release() {
	s.mu.Lock()
	if s.hold != nil {
		close(s.hold)
		s.hold = nil
	}
	s.mu.Unlock()
}

// Revoke makes every token issued so far invalid (a key rotation at the authorization server).
func (s *TokenServer) Revoke() {
	s.mu.Lock()
	s.issued = map[string]time.Time{}
	s.mu.Unlock()
}

// Fetches counts the token requests received (issued or refused).
func (s *TokenServer) Fetches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches
}

// Issued counts the tokens issued and not revoked.
func (s *TokenServer) Issued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.issued)
}

// Requests are the forms of the token requests received (the most recent 10,000).
func (s *TokenServer) Requests() []url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]url.Values(nil), s.requests...)
}

// Valid reports whether authorization (an Authorization header value, "Bearer <token>") holds
// a token this server issued, not revoked and not expired.
func (s *TokenServer) Valid(authorization string) bool {
	tok, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.issued[tok]
	return ok && time.Now().Before(exp)
}

func (s *TokenServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == JWKSPath && s.key != nil {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: s.key.Public(), KeyID: "ts-1", Algorithm: string(jose.ES256), Use: "sig"}}})
		return
	}
	s.mu.Lock()
	s.fetches++
	if len(s.remotes) < maxTokenServerRecords {
		s.remotes = append(s.remotes, r.RemoteAddr)
	}
	hold, fail := s.hold, s.fail
	s.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	if r.Method != http.MethodPost || r.URL.Path != s.o.Path {
		oauthError(w, http.StatusNotFound, "invalid_request", "POST to "+s.o.Path)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request", "the body is not a form")
		return
	}
	form := r.PostForm
	s.mu.Lock()
	if len(s.requests) < maxTokenServerRecords {
		s.requests = append(s.requests, form)
	}
	s.mu.Unlock()
	if fail != 0 {
		oauthError(w, fail, "temporarily_unavailable", "failing on purpose")
		return
	}
	if form.Get("grant_type") != "client_credentials" {
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type", "only client_credentials")
		return
	}
	if why := s.authenticate(r, form); why != "" {
		oauthError(w, http.StatusUnauthorized, "invalid_client", why)
		return
	}
	raw := make([]byte, 24)
	_, _ = rand.Read(raw)
	tok := base64.RawURLEncoding.EncodeToString(raw)
	now := time.Now()
	expiry := now.Add(s.o.Lifetime)
	if s.signer != nil {
		var err error
		if tok, expiry, err = s.accessJWT(form, tok, now); err != nil {
			oauthError(w, http.StatusInternalServerError, "server_error", err.Error())
			return
		}
	}
	s.mu.Lock()
	if len(s.issued) >= maxTokenServerRecords {
		s.issued = map[string]time.Time{}
	}
	s.issued[tok] = expiry
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": tok, "token_type": "Bearer",
		"expires_in": max(int(s.o.Lifetime.Seconds()), 1), "scope": form.Get("scope")})
}

// accessJWT signs a JWT access token (RFC 9068) with id jti, valid from now until its exp,
// which is rounded up to the second.
func (s *TokenServer) accessJWT(form url.Values, jti string, now time.Time) (string, time.Time, error) {
	exp := now.Add(s.o.Lifetime).Truncate(time.Second).Add(time.Second)
	aud := first(form.Get("audience"), form.Get("resource"), s.o.ClientID)
	claims := struct {
		jwt.Claims
		ClientID string `json:"client_id"`
		Scope    string `json:"scope,omitempty"`
	}{jwt.Claims{Issuer: s.Issuer(), Subject: s.o.ClientID, Audience: jwt.Audience{aud}, IssuedAt: jwt.NewNumericDate(now),
		Expiry: jwt.NewNumericDate(exp), ID: jti}, s.o.ClientID, form.Get("scope")}
	tok, err := jwt.Signed(s.signer).Claims(claims).Serialize()
	return tok, exp, err
}

func first(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// authenticate says why the client is not authenticated ("" when it is): the secret in basic
// authentication or the body, or a client assertion.
func (s *TokenServer) authenticate(r *http.Request, form url.Values) string {
	if user, pass, ok := r.BasicAuth(); ok {
		id, err1 := url.QueryUnescape(user)
		secret, err2 := url.QueryUnescape(pass)
		if err1 != nil || err2 != nil || id != s.o.ClientID || secret != s.o.ClientSecret || s.o.ClientSecret == "" {
			return "bad client credentials (basic)"
		}
		return ""
	}
	if form.Get("client_assertion_type") != "" {
		return s.verifyAssertion(form)
	}
	if form.Get("client_id") != s.o.ClientID || form.Get("client_secret") != s.o.ClientSecret || s.o.ClientSecret == "" {
		return "bad client credentials (body)"
	}
	return ""
}

func (s *TokenServer) verifyAssertion(form url.Values) string {
	if s.o.AssertionKey == nil {
		return "client assertions are not accepted"
	}
	if form.Get("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer" {
		return "unknown client_assertion_type"
	}
	tok, err := jwt.ParseSigned(form.Get("client_assertion"), []jose.SignatureAlgorithm{jose.RS256, jose.ES256, jose.EdDSA})
	if err != nil {
		return "the assertion does not parse: " + err.Error()
	}
	var c jwt.Claims
	if err := tok.Claims(s.o.AssertionKey, &c); err != nil {
		return "the assertion's signature does not verify: " + err.Error()
	}
	if err := c.ValidateWithLeeway(jwt.Expected{Issuer: s.o.ClientID, Subject: s.o.ClientID, AnyAudience: jwt.Audience{s.url}, Time: time.Now()}, 0); err != nil {
		return "the assertion's claims: " + err.Error()
	}
	if c.Expiry == nil || c.ID == "" {
		return "the assertion has no exp or jti"
	}
	if id := form.Get("client_id"); id != "" && id != s.o.ClientID {
		return "client_id is not the assertion's subject"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.jtis[c.ID] {
		return "the assertion was used before (jti " + c.ID + ")"
	}
	if len(s.jtis) >= maxTokenServerRecords {
		s.jtis = map[string]bool{}
	}
	s.jtis[c.ID] = true
	return ""
}

func oauthError(w http.ResponseWriter, status int, code, desc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, `{"error":%q,"error_description":%q}`, code, desc)
}
