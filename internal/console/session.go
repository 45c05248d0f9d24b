package console

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"
)

// Cookie names. The __Host- prefix makes browsers accept them only when Secure, for this
// host alone and for every path: no subdomain can set or read them.
const (
	sessionCookie = "__Host-webhook-console"
	// flowCookie holds an OIDC sign-in in progress (state, nonce, PKCE verifier) for at most
	// flowLifetime.
	flowCookie   = "__Host-webhook-console-signin"
	flowLifetime = 10 * time.Minute
	// maxCookieBytes is what a browser keeps of a cookie (4 KB with its name).
	maxCookieBytes = 4000
)

// session is what the console knows of a signed-in user, sealed in their cookie: nothing is
// kept on the server, so any replica with the key serves any user, and a stolen database
// cannot exist.
type session struct {
	// Token is the bearer token every call to the Kubernetes API is made with.
	Token string `json:"t"`
	// User and Groups are who the API server says the token is (SelfSubjectReview).
	User   string   `json:"u"`
	Groups []string `json:"g,omitempty"`
	// Via is how the user signed in: token or oidc.
	Via string `json:"v"`
	// Expires is when the token expires (or the session's bound, if sooner).
	Expires time.Time `json:"e"`
	// CSRF is the session's anti-forgery token, in every form and sent by the scripts.
	CSRF string `json:"c"`
}

// oidcFlow is an OIDC sign-in in progress.
type oidcFlow struct {
	State    string    `json:"s"`
	Nonce    string    `json:"n"`
	Verifier string    `json:"v"`
	Expires  time.Time `json:"e"`
}

// sealer encrypts and authenticates cookies (AES-256-GCM); the cookie's name is bound into
// the seal, so one cookie cannot stand for another.
type sealer struct{ aead cipher.AEAD }

func newSealer(key []byte) (*sealer, error) {
	if len(key) != 32 {
		return nil, errors.New("console: the session key must be 32 bytes")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
}

func (s *sealer) seal(name string, v any) (string, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, plain, []byte(name))), nil
}

func (s *sealer) open(name, value string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(b) < s.aead.NonceSize() {
		return errors.New("malformed cookie")
	}
	plain, err := s.aead.Open(nil, b[:s.aead.NonceSize()], b[s.aead.NonceSize():], []byte(name))
	if err != nil {
		return errors.New("cookie not sealed by this console")
	}
	return json.Unmarshal(plain, v)
}

// setCookie writes a sealed cookie that expires at expires: Secure, HTTP-only, SameSite
// strict (lax for the OIDC flow, whose callback is a top-level navigation from the
// provider).
func (s *sealer) setCookie(w http.ResponseWriter, name string, v any, expires time.Time, sameSite http.SameSite) error {
	value, err := s.seal(name, v)
	if err != nil {
		return err
	}
	if len(name)+len(value) > maxCookieBytes {
		return errors.New("the token is too large to keep in a browser cookie (about 2,900 bytes at most)")
	}
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/", Expires: expires,
		MaxAge: max(1, int(time.Until(expires).Seconds())), Secure: true, HttpOnly: true, SameSite: sameSite})
	return nil
}

func clearCookie(w http.ResponseWriter, name string) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: "/", MaxAge: -1, Secure: true, HttpOnly: true, SameSite: http.SameSiteStrictMode})
}

// readSession is the request's session, or nil when it has none, a forged one or an expired
// one.
func (s *sealer) readSession(r *http.Request, now time.Time) *session {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil
	}
	var sess session
	if s.open(sessionCookie, c.Value, &sess) != nil || sess.Token == "" || !now.Before(sess.Expires) {
		return nil
	}
	return &sess
}

// randomToken is 32 random bytes, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// sameToken compares two anti-forgery tokens in constant time.
func sameToken(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// tokenExpiry is when a bearer token expires, read from its exp claim when it is a JWT (the
// API server verifies the token; this only bounds the session), else zero.
func tokenExpiry(token string) time.Time {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}
	}
	var claims struct {
		Exp json.Number `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil {
		return time.Time{}
	}
	exp, err := claims.Exp.Int64()
	if err != nil || exp <= 0 {
		return time.Time{}
	}
	return time.Unix(exp, 0)
}

// tokenNamespace is the namespace of a ServiceAccount token (its kubernetes.io claim), a
// first guess of where its user works; "" for other tokens.
func tokenNamespace(token string) string {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return ""
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return ""
	}
	var claims struct {
		K8s struct {
			Namespace string `json:"namespace"`
		} `json:"kubernetes.io"`
	}
	if json.Unmarshal(b, &claims) != nil {
		return ""
	}
	return claims.K8s.Namespace
}
