package ingress

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/kubeauth"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// DefaultAudience is the audience of the tokens the ingress accepts by default: a token of it
// is useless against the API server and NATS, so whoever sees it on its way to the ingress
// can only publish what its identity may, until it expires.
const DefaultAudience = "ingress.webhook-operator.io"

// Defaults of the authorization cache and of the reviews in flight.
const (
	DefaultAuthCacheTTL  = 10 * time.Second
	DefaultAuthCacheSize = 10000
	DefaultMaxReviews    = 64
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
// may publish at the ingress exactly where it may publish on the bus).
//
// What cannot be a token of the ingress is refused before the API server is asked (precheck:
// not a JWT, of none of the audiences, expired or not yet valid), so garbage costs no review.
// Decisions are kept for TTL (never beyond the token's expiry), keyed by a hash of the token
// and the namespace, in two caches of at most Size each: decisions that allow and refusals, so
// no number of refused callers evicts an allowed one. Errors of the API server are not kept.
// One review runs per key at a time, whoever else asks meanwhile waits for it (a decision
// expiring under thousands of requests a second costs one TokenReview and one
// SubjectAccessReview, not one per request in flight), at most MaxReviews at once: beyond, an
// unseen token is answered ErrBusy at once (503) while cached callers go on. A decision in use
// is reviewed again in the background during the last fifth of its TTL, so callers that keep
// publishing never wait for the API server.
type Authorizer struct {
	Reviewer kubeauth.Reviewer
	// Audiences the token may be issued for (default DefaultAudience); an installer may add
	// the API server's own to accept kubeconfig tokens too.
	Audiences []string
	TTL       time.Duration
	Size      int
	// MaxReviews bounds the reviews in flight (default DefaultMaxReviews).
	MaxReviews int
	// Observe, when set, is told of every lookup: hit or miss of the cache.
	Observe func(hit bool)
	Now     func() time.Time

	mu      sync.Mutex
	allowed map[authKey]authEntry
	refused map[authKey]authEntry
	flights map[authKey]*flight
}

// ErrBusy says the reviews in flight are at their bound: the caller may retry.
var ErrBusy = errors.New("the ingress is verifying as many new callers as it may at once")

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
// now (the API server did not answer, or ErrBusy): 503, not cached.
func (a *Authorizer) Authorize(ctx context.Context, token, namespace string) (Decision, error) {
	if token == "" {
		return Decision{Status: http.StatusUnauthorized,
			Reason: "no bearer token: send Authorization: Bearer <token>, a Kubernetes ServiceAccount token of audience " + a.audiences()[0] +
				" (e.g. kubectl create token <serviceaccount> -n " + namespace + " --audience " + a.audiences()[0] + ")"}, nil
	}
	if len(token) > natsauth.MaxTokenBytes {
		return Decision{Status: http.StatusUnauthorized, Reason: fmt.Sprintf("the bearer token is longer than %d bytes", natsauth.MaxTokenBytes)}, nil
	}
	now := a.now()
	key := authKey{token: sha256.Sum256([]byte(token)), namespace: namespace}
	a.mu.Lock()
	if e, ok := a.allowed[key]; ok && now.Before(e.expires) {
		if !now.Before(e.refresh) && a.flights[key] == nil && len(a.flights) < a.maxReviews() {
			a.fly(key, token, namespace)
		}
		a.mu.Unlock()
		a.observe(true)
		return e.d, nil
	}
	if e, ok := a.refused[key]; ok && now.Before(e.expires) {
		a.mu.Unlock()
		a.observe(true)
		return e.d, nil
	}
	f := a.flights[key]
	if f == nil {
		// A cached decision never outlives its token; an unseen token is checked before it
		// costs a review.
		a.mu.Unlock()
		if why := a.precheck(token, now); why != "" {
			return Decision{Status: http.StatusUnauthorized, Reason: why}, nil
		}
		a.mu.Lock()
		f = a.flights[key]
	}
	if f == nil {
		if len(a.flights) >= a.maxReviews() {
			a.mu.Unlock()
			return Decision{}, ErrBusy
		}
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

func (a *Authorizer) maxReviews() int {
	if a.MaxReviews > 0 {
		return a.MaxReviews
	}
	return DefaultMaxReviews
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
			if d.Status == 0 {
				delete(a.refused, key)
				a.allowed = a.storeLocked(a.allowed, key, e, now)
			} else {
				// A refusal replaces a decision that allowed (the RoleBinding went).
				delete(a.allowed, key)
				a.refused = a.storeLocked(a.refused, key, e, now)
			}
		}
		f.d, f.err = d, err
		delete(a.flights, key)
		a.mu.Unlock()
		close(f.done)
	}()
	return f
}

// claims are what precheck reads of a JWT.
type claims struct {
	Aud audiences `json:"aud"`
	Exp *float64  `json:"exp"`
	Nbf *float64  `json:"nbf"`
}

// audiences is a JWT's aud claim: one string or an array of them.
type audiences []string

func (a *audiences) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = audiences{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*a = many
	return nil
}

// clockSkew is how far a token's nbf may be ahead of the ingress's clock.
const clockSkew = time.Minute

// precheck says why token cannot be one the ingress accepts, without asking the API server:
// it is not a JWT (three base64url parts, a header naming an algorithm other than none, a
// payload of claims), none of its audiences is one of the ingress's, it has no expiry (a
// legacy ServiceAccount token Secret), it expired or is not valid yet. "" lets it through to
// the TokenReview, which checks its signature.
func (a *Authorizer) precheck(token string, now time.Time) string {
	aud := a.audiences()
	notJWT := "the bearer token is not a Kubernetes ServiceAccount token (a JWT): send one of audience " + aud[0] +
		" (e.g. kubectl create token <serviceaccount> --audience " + aud[0] + ")"
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[2] == "" {
		return notJWT
	}
	var header struct {
		Alg string `json:"alg"`
	}
	var c claims
	hb, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	pb, err2 := base64.RawURLEncoding.DecodeString(parts[1])
	if err1 != nil || err2 != nil || json.Unmarshal(hb, &header) != nil || header.Alg == "" || strings.EqualFold(header.Alg, "none") || json.Unmarshal(pb, &c) != nil {
		return notJWT
	}
	if !slices.ContainsFunc(c.Aud, func(x string) bool { return slices.Contains(aud, x) }) {
		return fmt.Sprintf("the bearer token is not for audience %s (it is for %s): request one of it (kubectl create token <serviceaccount> --audience %s)",
			strings.Join(aud, " or "), records.Bound(strings.Join(c.Aud, " "), 128), aud[0])
	}
	if c.Exp == nil {
		return "the bearer token has no expiry (a legacy ServiceAccount token Secret): send a bound token of audience " + aud[0] + " (kubectl create token, a projected volume)"
	}
	if exp := time.Unix(int64(*c.Exp), 0); !now.Before(exp) {
		return fmt.Sprintf("the bearer token expired at %s: request a new one", exp.UTC().Format(time.RFC3339))
	}
	if c.Nbf != nil {
		if nbf := time.Unix(int64(*c.Nbf), 0); now.Add(clockSkew).Before(nbf) {
			return fmt.Sprintf("the bearer token is not valid before %s", nbf.UTC().Format(time.RFC3339))
		}
	}
	return ""
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

// storeLocked keeps e in m (made when nil, and returned), making room first: expired entries
// go, then, if still full, any one. a.mu is held.
func (a *Authorizer) storeLocked(m map[authKey]authEntry, key authKey, e authEntry, now time.Time) map[authKey]authEntry {
	size := a.Size
	if size <= 0 {
		size = DefaultAuthCacheSize
	}
	if m == nil {
		m = make(map[authKey]authEntry)
	}
	if _, ok := m[key]; !ok && len(m) >= size {
		for k, old := range m {
			if !now.Before(old.expires) {
				delete(m, k)
			}
		}
		for k := range m {
			if len(m) < size {
				break
			}
			delete(m, k)
		}
	}
	m[key] = e
	return m
}

// InFlight is how many reviews are in flight (at most MaxReviews).
func (a *Authorizer) InFlight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.flights)
}

// Len is how many decisions are kept: those that allow and refusals.
func (a *Authorizer) Len() (allowed, refused int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.allowed), len(a.refused)
}

// bearerToken is the token of an Authorization: Bearer header.
func bearerToken(h http.Header) string {
	v := h.Get("Authorization")
	if len(v) < 7 || !strings.EqualFold(v[:7], "bearer ") {
		return ""
	}
	return strings.TrimSpace(v[7:])
}
