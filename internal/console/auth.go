package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
	"k8s.io/client-go/rest"
)

// OIDCOptions configure sign-in with the cluster's OIDC provider (Dex, Keycloak, a cloud
// identity): the authorization code flow with PKCE. The API server must accept the
// provider's ID tokens for ClientID (its --oidc-* flags or an AuthenticationConfiguration),
// since the ID token is what the console calls the API with.
type OIDCOptions struct {
	// IssuerURL is the provider's issuer (its /.well-known/openid-configuration is read).
	IssuerURL string
	// ClientID is the console's client at the provider, the audience the API server expects.
	ClientID string
	// ClientSecret, when the provider gives the console one (a confidential client); a
	// public client relies on PKCE alone.
	ClientSecret string
	// RedirectURL is the console's /oidc/callback as the browser reaches it.
	RedirectURL string
	// Scopes asked besides openid (e.g. email, groups, profile).
	Scopes []string
	// CAFile, when the provider's certificate is not signed by a public CA.
	CAFile string
}

type oidcProvider struct {
	verifier *oidc.IDTokenVerifier
	config   oauth2.Config
	client   *http.Client
}

func newOIDCProvider(ctx context.Context, o OIDCOptions) (*oidcProvider, error) {
	if o.ClientID == "" || o.RedirectURL == "" {
		return nil, errors.New("console: OIDC needs a client id and a redirect URL")
	}
	hc := &http.Client{Timeout: 15 * time.Second}
	if o.CAFile != "" {
		if _, err := os.Stat(o.CAFile); err != nil {
			return nil, fmt.Errorf("console: the OIDC provider's CA: %w", err)
		}
		rt, err := rest.TransportFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAFile: o.CAFile}})
		if err != nil {
			return nil, fmt.Errorf("console: the OIDC provider's CA: %w", err)
		}
		hc.Transport = rt
	}
	ctx = oidc.ClientContext(ctx, hc)
	p, err := oidc.NewProvider(ctx, o.IssuerURL)
	if err != nil {
		return nil, fmt.Errorf("console: the OIDC provider %s: %w", o.IssuerURL, err)
	}
	return &oidcProvider{
		verifier: p.Verifier(&oidc.Config{ClientID: o.ClientID}),
		config: oauth2.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret, Endpoint: p.Endpoint(),
			RedirectURL: o.RedirectURL, Scopes: append([]string{oidc.ScopeOpenID}, o.Scopes...)},
		client: hc,
	}, nil
}

// signInView is the sign-in page.
type signInView struct {
	OIDC    bool
	Next    string
	Form    string
	Error   string
	Expired bool
}

// formCookie holds the sign-in form's anti-forgery token (double submit) for an hour.
const formCookie = "__Host-webhook-console-form"

func (s *Server) signInPage(w http.ResponseWriter, r *http.Request) {
	s.showSignIn(w, r, http.StatusOK, "")
}

func (s *Server) showSignIn(w http.ResponseWriter, r *http.Request, code int, msg string) {
	token := randomToken()
	if err := s.seal.setCookie(w, formCookie, oidcFlow{State: token, Expires: s.o.Now().Add(time.Hour)}, s.o.Now().Add(time.Hour), http.SameSiteStrictMode); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.render(w, r, code, "signin", nil, signInView{OIDC: s.oidc != nil, Next: localPath(r.FormValue("next")), Form: token, Error: msg,
		Expired: r.URL.Query().Get("expired") != ""})
}

// signInWithToken signs in with a bearer token the user pastes (`kubectl create token`, a
// break-glass user): the API server says who it is, and it is the session.
func (s *Server) signInWithToken(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	var flow oidcFlow
	c, err := r.Cookie(formCookie)
	if err != nil || s.seal.open(formCookie, c.Value, &flow) != nil || !sameToken(r.PostFormValue("form"), flow.State) || !s.o.Now().Before(flow.Expires) {
		s.showSignIn(w, r, http.StatusForbidden, "The sign-in form expired or is not from this console: try again.")
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	token = strings.TrimPrefix(token, "Bearer ")
	if token == "" || strings.ContainsAny(token, " \t\r\n") {
		s.showSignIn(w, r, http.StatusBadRequest, "Paste one bearer token, for example the output of kubectl create token.")
		return
	}
	expires := tokenExpiry(token)
	if err := s.startSession(w, r, token, "token", expires); err != nil {
		s.showSignIn(w, r, http.StatusUnauthorized, err.Error())
		return
	}
	clearCookie(w, formCookie)
	http.Redirect(w, r, nextOr(r.PostFormValue("next")), http.StatusSeeOther)
}

// startSession asks the API server who token is and seals the session, expiring with the
// token (or MaxSession, if sooner).
func (s *Server) startSession(w http.ResponseWriter, r *http.Request, token, via string, expires time.Time) error {
	now := s.o.Now()
	if !expires.IsZero() && !now.Before(expires) {
		return errors.New("the token has expired")
	}
	if bound := now.Add(s.o.MaxSession); expires.IsZero() || expires.After(bound) {
		expires = bound
	}
	who, err := s.api.as(token).whoAmI(r.Context())
	switch {
	case errCode(err) == http.StatusUnauthorized:
		return errors.New("the Kubernetes API does not accept this token")
	case err != nil:
		return fmt.Errorf("could not ask the Kubernetes API who the token is: %w", err)
	}
	sess := session{Token: token, User: who.Username, Groups: who.Groups, Via: via, Expires: expires, CSRF: randomToken()}
	if len(sess.Groups) > 20 {
		sess.Groups = sess.Groups[:20]
	}
	if err := s.seal.setCookie(w, sessionCookie, sess, expires, http.SameSiteStrictMode); err != nil {
		return err
	}
	s.log.Info("signed in", "user", who.Username, "via", via, "expires", expires.UTC().Format(time.RFC3339))
	return nil
}

func (s *Server) signOut(q *request) {
	clearCookie(q.w, sessionCookie)
	http.Redirect(q.w, q.r, "/signin", http.StatusSeeOther)
}

// oidcLogin starts the authorization code flow with PKCE: a state, a nonce and a verifier
// kept in a sealed cookie, and the browser sent to the provider.
func (s *Server) oidcLogin(w http.ResponseWriter, r *http.Request) {
	if s.oidc == nil {
		http.Error(w, "OIDC sign-in is not configured", http.StatusNotFound)
		return
	}
	flow := oidcFlow{State: randomToken(), Nonce: randomToken(), Verifier: oauth2.GenerateVerifier(), Expires: s.o.Now().Add(flowLifetime)}
	// Lax: the provider's redirect back is a top-level navigation from another site.
	if err := s.seal.setCookie(w, flowCookie, flow, flow.Expires, http.SameSiteLaxMode); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	next := localPath(r.URL.Query().Get("next"))
	if next != "" {
		http.SetCookie(w, &http.Cookie{Name: "__Host-webhook-console-next", Value: url.QueryEscape(next), Path: "/", MaxAge: int(flowLifetime.Seconds()),
			Secure: true, HttpOnly: true, SameSite: http.SameSiteLaxMode})
	}
	http.Redirect(w, r, s.oidc.config.AuthCodeURL(flow.State, oidc.Nonce(flow.Nonce), oauth2.S256ChallengeOption(flow.Verifier)), http.StatusFound)
}

// oidcCallback ends the flow: the state checked, the code exchanged with the verifier, the
// ID token verified (issuer, audience, expiry, nonce) and made the session's token.
func (s *Server) oidcCallback(w http.ResponseWriter, r *http.Request) {
	if s.oidc == nil {
		http.Error(w, "OIDC sign-in is not configured", http.StatusNotFound)
		return
	}
	fail := func(msg string) {
		clearCookie(w, flowCookie)
		s.showSignIn(w, r, http.StatusUnauthorized, msg)
	}
	var flow oidcFlow
	c, err := r.Cookie(flowCookie)
	if err != nil || s.seal.open(flowCookie, c.Value, &flow) != nil || !s.o.Now().Before(flow.Expires) {
		fail("The sign-in took too long or was not started here: try again.")
		return
	}
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		fail("The identity provider refused the sign-in: " + bounded(e+" "+q.Get("error_description"), 300))
		return
	}
	if !sameToken(q.Get("state"), flow.State) {
		fail("The sign-in's state does not match: try again.")
		return
	}
	ctx := oidc.ClientContext(r.Context(), s.oidc.client)
	tok, err := s.oidc.config.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(flow.Verifier))
	if err != nil {
		fail("The identity provider did not give a token for the code: " + bounded(err.Error(), 300))
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		fail("The identity provider's answer holds no ID token.")
		return
	}
	idt, err := s.oidc.verifier.Verify(ctx, raw)
	if err != nil {
		fail("The ID token is not valid: " + bounded(err.Error(), 300))
		return
	}
	if !sameToken(idt.Nonce, flow.Nonce) {
		fail("The ID token's nonce does not match: try again.")
		return
	}
	if err := s.startSession(w, r, raw, "oidc", idt.Expiry); err != nil {
		fail(err.Error())
		return
	}
	clearCookie(w, flowCookie)
	next := "/"
	if c, err := r.Cookie("__Host-webhook-console-next"); err == nil {
		if v, err := url.QueryUnescape(c.Value); err == nil {
			next = nextOr(v)
		}
		clearCookie(w, "__Host-webhook-console-next")
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// localPath is p when it is a path of this console ("/..."), else "": a sign-in never sends
// the browser to another site.
func localPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\\r\n") || len(p) > 2048 {
		return ""
	}
	return p
}

func nextOr(p string) string {
	if p = localPath(p); p == "" || strings.HasPrefix(p, "/signin") {
		return "/"
	}
	return p
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// bounded cuts s to n bytes for a message.
func bounded(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
