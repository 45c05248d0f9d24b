package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configure the console.
type Options struct {
	// Kube is how to reach the Kubernetes API server: its address and CA. Any credential it
	// holds is ignored: every call is made as the signed-in user.
	Kube *rest.Config
	// SessionKey seals the session cookies (32 bytes). Replicas must share it; empty: a
	// random key, so sessions end when the process does.
	SessionKey []byte
	// MaxSession bounds a session, whatever the token's own expiry (default 12h; a token
	// without an expiry it can read lasts this long in the console).
	MaxSession time.Duration
	// OIDC, when its IssuerURL is set, offers sign-in with the cluster's OIDC provider.
	OIDC OIDCOptions
	// Namespaces are offered to users who may neither list namespaces nor endpoints
	// cluster-wide (besides their ServiceAccount's own namespace and any they type).
	Namespaces []string
	// Logger logs what the console does (never a token).
	Logger *slog.Logger
	// Now is the clock (tests).
	Now func() time.Time
}

// Server is the console's HTTP handler.
type Server struct {
	o      Options
	api    *apiServer
	seal   *sealer
	pages  map[string]*template.Template
	static http.Handler
	oidc   *oidcProvider
	log    *slog.Logger
	mux    *http.ServeMux
}

// New builds the console. With OIDC configured, it reads the provider's discovery document
// (ctx bounds that).
func New(ctx context.Context, o Options) (*Server, error) {
	if o.MaxSession <= 0 {
		o.MaxSession = 12 * time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	key := o.SessionKey
	if len(key) == 0 {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
	}
	seal, err := newSealer(key)
	if err != nil {
		return nil, err
	}
	api, err := newAPIServer(o.Kube)
	if err != nil {
		return nil, err
	}
	s := &Server{o: o, api: api, seal: seal, log: o.Logger}
	if s.pages, err = parseTemplates(); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	s.static = http.StripPrefix("/static/", http.FileServerFS(sub))
	if o.OIDC.IssuerURL != "" {
		if s.oidc, err = newOIDCProvider(ctx, o.OIDC); err != nil {
			return nil, err
		}
	}
	s.routes()
	return s, nil
}

// contentSecurityPolicy lets the pages load only the console's own scripts, styles and
// images: no inline script or style, no other origin, no frames, forms posting only here.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// ServeHTTP serves a request with the security headers every answer carries, and refuses
// state-changing requests from other sites.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=()")
	if !strings.HasPrefix(r.URL.Path, "/static/") {
		h.Set("Cache-Control", "no-store")
	}
	if r.TLS != nil {
		h.Set("Strict-Transport-Security", "max-age=31536000")
	}
	if err := crossOrigin.Check(r); err != nil {
		http.Error(w, "cross-site request refused", http.StatusForbidden)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// crossOrigin refuses non-safe requests a browser says come from another origin (Fetch
// metadata, Origin): the first line against forgery, before each form's token.
var crossOrigin = http.NewCrossOriginProtection()

func (s *Server) routes() {
	m := http.NewServeMux()
	m.Handle("GET /static/", s.static)
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	m.HandleFunc("GET /signin", s.signInPage)
	m.HandleFunc("POST /signin", s.signInWithToken)
	m.HandleFunc("GET /oidc/login", s.oidcLogin)
	m.HandleFunc("GET /oidc/callback", s.oidcCallback)
	m.HandleFunc("POST /signout", s.user(s.signOut))

	m.HandleFunc("GET /{$}", s.user(s.namespacesPage))
	m.HandleFunc("GET /ns", s.user(s.openNamespace))
	m.HandleFunc("GET /ns/{ns}", s.user(s.namespacePage))
	m.HandleFunc("GET /ns/{ns}/endpoints/{name}", s.user(s.endpointPage))
	m.HandleFunc("POST /ns/{ns}/endpoints/{name}/enable", s.user(s.enable))
	m.HandleFunc("POST /ns/{ns}/endpoints/{name}/test", s.user(s.sendTest))
	m.HandleFunc("POST /ns/{ns}/endpoints/{name}/eval", s.user(s.evaluate))
	m.HandleFunc("POST /ns/{ns}/endpoints/{name}/rotate", s.user(s.rotate))
	m.HandleFunc("GET /ns/{ns}/endpoints/{name}/expressions", s.user(s.expressionsPage))
	m.HandleFunc("POST /ns/{ns}/endpoints/{name}/expressions/evaluate", s.user(s.evaluateExpressions))
	m.HandleFunc("POST /ns/{ns}/endpoints/{name}/expressions/save", s.user(s.saveExpressions))
	m.HandleFunc("POST /ns/{ns}/endpoints/{name}/end-overlap", s.user(s.endOverlap))
	m.HandleFunc("GET /ns/{ns}/deliveries/{id}", s.user(s.deliveryPage))
	m.HandleFunc("GET /ns/{ns}/deadletters", s.user(s.deadLettersPage))
	m.HandleFunc("GET /ns/{ns}/deadletters/{id}", s.user(s.deadLetterPage))
	m.HandleFunc("POST /ns/{ns}/deadletters/replay", s.user(s.replay))
	m.HandleFunc("POST /ns/{ns}/deadletters/replay-many", s.user(s.replayMany))
	m.HandleFunc("POST /ns/{ns}/deadletters/purge", s.user(s.purge))
	m.HandleFunc("GET /ns/{ns}/replays/{name}", s.user(s.replayPage))
	m.HandleFunc("GET /ns/{ns}/quota", s.user(s.quotaPage))
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.render(w, r, http.StatusNotFound, "error", nil, errorView{Title: "Not found", Message: "There is no page at " + r.URL.Path + "."})
	})
	s.mux = m
}

// request is one request of a signed-in user.
type request struct {
	w    http.ResponseWriter
	r    *http.Request
	sess *session
	kube *kube
	// testEventID is the test event the request published.
	testEventID string
}

// user serves h only to a signed-in user (others are sent to sign in), and only with the
// session's anti-forgery token on every POST.
func (s *Server) user(h func(*request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sess := s.seal.readSession(r, s.o.Now())
		if sess == nil {
			if r.Method != http.MethodGet || r.Header.Get("Accept") == "application/json" {
				http.Error(w, "your session ended: sign in again", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/signin?next="+urlQueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			token := r.Header.Get("X-CSRF-Token")
			if token == "" {
				token = r.PostFormValue("csrf")
			}
			if !sameToken(token, sess.CSRF) {
				s.render(w, r, http.StatusForbidden, "error", sess, errorView{Title: "Refused", Message: "The form is not from this session (its anti-forgery token does not match). Go back, reload the page and try again."})
				return
			}
		}
		h(&request{w: w, r: r, sess: sess, kube: s.api.as(sess.Token)})
	}
}

// maxFormBytes bounds a form or a JSON request.
const maxFormBytes = 256 << 10

// apiFailed renders what the Kubernetes API answered when a page could not be read: a 401
// ends the session (the token expired or was revoked).
func (s *Server) apiFailed(q *request, what string, err error) {
	switch errCode(err) {
	case http.StatusUnauthorized:
		clearCookie(q.w, sessionCookie)
		http.Redirect(q.w, q.r, "/signin?expired=1", http.StatusSeeOther)
		return
	case http.StatusForbidden:
		s.render(q.w, q.r, http.StatusForbidden, "error", q.sess, errorView{Title: "Not allowed", Message: what + ": " + err.Error()})
		return
	case http.StatusNotFound:
		s.render(q.w, q.r, http.StatusNotFound, "error", q.sess, errorView{Title: "Not found", Message: what + ": " + err.Error()})
		return
	}
	s.log.Info("a call to the Kubernetes API failed", "what", what, "user", q.sess.User, "error", err.Error())
	s.render(q.w, q.r, http.StatusBadGateway, "error", q.sess, errorView{Title: "The Kubernetes API failed", Message: what + ": " + err.Error()})
}

// errorView is the error page.
type errorView struct {
	Title   string
	Message string
}

// render writes page name with data, within the layout.
func (s *Server) render(w http.ResponseWriter, r *http.Request, code int, name string, sess *session, data any) {
	t, ok := s.pages[name]
	if !ok {
		http.Error(w, "no page "+name, http.StatusInternalServerError)
		return
	}
	v := layoutView{Page: data, Path: r.URL.Path}
	if sess != nil {
		v.User, v.CSRF, v.Expires = sess.User, sess.CSRF, sess.Expires
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if err := t.ExecuteTemplate(w, "layout", v); err != nil {
		s.log.Error("rendering a page", "page", name, "error", err.Error())
	}
}

// layoutView is what every page's frame shows.
type layoutView struct {
	User    string
	CSRF    string
	Expires time.Time
	Path    string
	Page    any
}

// Run serves the console on addr until ctx ends, over TLS when certFile and keyFile are set.
func (s *Server) Run(ctx context.Context, addr, certFile, keyFile string) error {
	srv := &http.Server{Addr: addr, Handler: s, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	errc := make(chan error, 1)
	go func() {
		if certFile != "" {
			errc <- srv.ListenAndServeTLS(certFile, keyFile)
		} else {
			errc <- srv.ListenAndServe()
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console: shutting down: %w", err)
	}
	return nil
}
