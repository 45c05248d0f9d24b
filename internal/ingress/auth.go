package ingress

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/kubeauth"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
)

// DefaultAudience is the audience of the tokens the ingress accepts by default: a token of it
// is useless against the API server and NATS, so whoever sees it on its way to the ingress
// can only publish what its identity may, until it expires.
const DefaultAudience = "ingress.webhook-operator.io"

// Defaults of the authorization cache.
const (
	DefaultAuthCacheTTL  = 10 * time.Second
	DefaultAuthCacheSize = 10000
)

// Decision is what the ingress decided about a caller in a namespace.
type Decision struct {
	// Status is 0 when the caller may publish, else http.StatusUnauthorized or
	// http.StatusForbidden.
	Status int
	// User is who the API server says the token is ("" when it does not accept it).
	User string
	// Reason says why the caller may not publish.
	Reason string
}

// Authorizer decides whether a bearer token may publish events of a namespace: a TokenReview
// for the ingress's audiences, then a SubjectAccessReview of create on webhookevents in the
// namespace (the virtual resource the auth callout grants producers by, so a ServiceAccount
// may publish at the ingress exactly where it may publish on the bus). Decisions, refusals
// included, are kept for TTL (never beyond the token's expiry), at most Size of them, keyed
// by a hash of the token and the namespace; errors of the API server are not kept. One review
// runs per key at a time, whoever else asks meanwhile waits for it (a decision expiring under
// thousands of requests a second costs one TokenReview and one SubjectAccessReview, not one
// per request in flight), and a decision in use is reviewed again in the background during the
// last fifth of its TTL, so callers that keep publishing never wait for the API server.
type Authorizer struct {
	Reviewer kubeauth.Reviewer
	// Audiences the token may be issued for (default DefaultAudience); an installer may add
	// the API server's own to accept kubeconfig tokens too.
	Audiences []string
	TTL       time.Duration
	Size      int
	// Observe, when set, is told of every lookup: hit or miss of the cache.
	Observe func(hit bool)
	Now     func() time.Time

	mu      sync.Mutex
	entries map[authKey]authEntry
	flights map[authKey]*flight
}

// flight is one review in progress; done closes when d and err are set.
type flight struct {
	done chan struct{}
	d    Decision
	err  error
}

// reviewTimeout bounds one review, which runs apart from the request that started it.
const reviewTimeout = 10 * time.Second

type authKey struct {
	token     [sha256.Size]byte
	namespace string
}

type authEntry struct {
	d       Decision
	expires time.Time
	// refresh is when a lookup starts reviewing the decision again in the background.
	refresh time.Time
}

func (a *Authorizer) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// errUnavailable says the API server could not be asked: the caller may retry.
var errUnavailable = errors.New("cannot ask the Kubernetes API server now")

// Authorize decides for token in namespace. An error means the decision could not be made
// now (the API server did not answer): 503, not cached.
func (a *Authorizer) Authorize(ctx context.Context, token, namespace string) (Decision, error) {
	if token == "" {
		return Decision{Status: http.StatusUnauthorized,
			Reason: "no bearer token: send Authorization: Bearer <token>, a Kubernetes ServiceAccount token of audience " + a.audiences()[0] +
				" (e.g. kubectl create token <serviceaccount> -n " + namespace + " --audience " + a.audiences()[0] + ")"}, nil
	}
	if len(token) > natsauth.MaxTokenBytes {
		return Decision{Status: http.StatusUnauthorized, Reason: fmt.Sprintf("the bearer token is longer than %d bytes", natsauth.MaxTokenBytes)}, nil
	}
	key := authKey{token: sha256.Sum256([]byte(token)), namespace: namespace}
	now := a.now()
	a.mu.Lock()
	if e, ok := a.entries[key]; ok && now.Before(e.expires) {
		if !now.Before(e.refresh) && a.flights[key] == nil {
			a.fly(key, token, namespace)
		}
		a.mu.Unlock()
		a.observe(true)
		return e.d, nil
	}
	f := a.flights[key]
	if f == nil {
		f = a.fly(key, token, namespace)
	}
	a.mu.Unlock()
	a.observe(false)
	select {
	case <-f.done:
		return f.d, f.err
	case <-ctx.Done():
		return Decision{}, fmt.Errorf("%w: %v", errUnavailable, ctx.Err())
	}
}

// fly starts the review of key, which a.mu guards, and returns its flight; the decision is
// kept when it is made.
func (a *Authorizer) fly(key authKey, token, namespace string) *flight {
	if a.flights == nil {
		a.flights = make(map[authKey]*flight)
	}
	f := &flight{done: make(chan struct{})}
	a.flights[key] = f
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), reviewTimeout)
		defer cancel()
		d, err := a.review(ctx, token, namespace)
		now := a.now()
		a.mu.Lock()
		if err == nil {
			ttl := a.TTL
			if ttl <= 0 {
				ttl = DefaultAuthCacheTTL
			}
			e := authEntry{d: d, expires: now.Add(ttl), refresh: now.Add(ttl - ttl/5)}
			if exp, ok := kubeauth.TokenExpiry(token); ok && exp.Before(e.expires) {
				e.expires = exp
			}
			a.storeLocked(key, e, now)
		}
		f.d, f.err = d, err
		delete(a.flights, key)
		a.mu.Unlock()
		close(f.done)
	}()
	return f
}

func (a *Authorizer) observe(hit bool) {
	if a.Observe != nil {
		a.Observe(hit)
	}
}

func (a *Authorizer) audiences() []string {
	if len(a.Audiences) == 0 {
		return []string{DefaultAudience}
	}
	return a.Audiences
}

// review asks the API server.
func (a *Authorizer) review(ctx context.Context, token, namespace string) (Decision, error) {
	user, _, err := a.Reviewer.Authenticate(ctx, token, a.audiences())
	if errors.Is(err, kubeauth.ErrNotAuthenticated) {
		return Decision{Status: http.StatusUnauthorized,
			Reason: "the Kubernetes API server does not accept the bearer token for audience " + strings.Join(a.audiences(), " or ") +
				" (expired, revoked, of another audience or of another cluster)"}, nil
	}
	if err != nil {
		return Decision{}, fmt.Errorf("%w: %v", errUnavailable, err)
	}
	ok, err := a.Reviewer.Allowed(ctx, user, namespace, kubeauth.ResourceEvents, "create")
	if err != nil {
		return Decision{User: user.Username}, fmt.Errorf("%w: %v", errUnavailable, err)
	}
	if !ok {
		return Decision{Status: http.StatusForbidden, User: user.Username,
			Reason: fmt.Sprintf("%s may not publish events in namespace %s: Kubernetes RBAC grants it no create on %s (API group webhook-operator.io) there; bind the ClusterRole webhook-operator-producer to it in that namespace",
				user.Username, namespace, kubeauth.ResourceEvents)}, nil
	}
	return Decision{User: user.Username}, nil
}

// storeLocked keeps e, making room first: expired entries go, then, if still full, any one.
// a.mu is held.
func (a *Authorizer) storeLocked(key authKey, e authEntry, now time.Time) {
	size := a.Size
	if size <= 0 {
		size = DefaultAuthCacheSize
	}
	if a.entries == nil {
		a.entries = make(map[authKey]authEntry)
	}
	if _, ok := a.entries[key]; !ok && len(a.entries) >= size {
		for k, old := range a.entries {
			if !now.Before(old.expires) {
				delete(a.entries, k)
			}
		}
		for k := range a.entries {
			if len(a.entries) < size {
				break
			}
			delete(a.entries, k)
		}
	}
	a.entries[key] = e
}

// Len is how many decisions are kept.
func (a *Authorizer) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.entries)
}

// bearerToken is the token of an Authorization: Bearer header.
func bearerToken(h http.Header) string {
	v := h.Get("Authorization")
	if len(v) < 7 || !strings.EqualFold(v[:7], "bearer ") {
		return ""
	}
	return strings.TrimSpace(v[7:])
}
