package receiverauth

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// Token is an Authorization header value ("Bearer ...") and when it expires.
type Token struct {
	Header string
	Expiry time.Time
}

// assumedLifetime is how long a token whose endpoint gave no expiry is used (unless the
// receiver refuses it first).
const assumedLifetime = time.Hour

// failureHold is how long a failed fetch is the answer without asking again: the attempts of
// a burst fail together instead of each asking a token endpoint that is down.
const failureHold = time.Second

// Source is the token of one endpoint: cached, refreshed in the background before it expires,
// one fetch at a time. It is safe for concurrent use.
type Source struct {
	settings *Settings
	now      func() time.Time

	mu  sync.Mutex
	tok *cached
	// fetching is closed when the fetch in flight ends; nil when none is.
	fetching chan struct{}
	// failed is the last fetch's error, until failedUntil.
	failed      error
	failedUntil time.Time
	// fetches counts the fetches started (for tests).
	fetches int
}

type cached struct {
	Token
	// refreshAt: a fetch starts in the background; expiresAt: the token is no longer used.
	refreshAt, expiresAt time.Time
}

// NewSource returns the token source of settings.
func NewSource(s *Settings) *Source {
	return &Source{settings: s, now: time.Now}
}

// Settings are what the source was made from.
func (src *Source) Settings() *Settings { return src.settings }

// Token returns a token to send: the cached one while it is fresh; otherwise it waits (up to
// ctx) for the one fetch in flight, starting it if none is. Once three quarters of a token's
// lifetime have passed a fetch starts in the background and the token still serves. client
// makes the token request (the endpoint's client: the outbound guard, the egress proxy, no
// redirects). The error is an *Error.
func (src *Source) Token(ctx context.Context, client *http.Client) (Token, error) {
	for {
		src.mu.Lock()
		if t, ok := src.fresh(client); ok {
			src.mu.Unlock()
			return t, nil
		}
		now := src.now()
		if src.failed != nil && now.Before(src.failedUntil) {
			err := src.failed
			src.mu.Unlock()
			return Token{}, err
		}
		if src.fetching == nil {
			src.startFetch(client)
		}
		wait := src.fetching
		src.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return Token{}, errorf("no token within the attempt's timeout (the token endpoint is slow)")
		}
		src.mu.Lock()
		t, err := src.tok, src.failed
		fresh := t != nil && src.now().Before(t.expiresAt)
		src.mu.Unlock()
		switch {
		case fresh:
			return t.Token, nil
		case err != nil:
			return Token{}, err
		}
		// Invalidated or expired meanwhile: look again.
	}
}

// Cached returns the cached token while it is fresh, without waiting and without a context:
// the path of every attempt but the few that need a fetch (then Token). Like Token, it starts
// the background refresh once three quarters of the token's lifetime have passed.
func (src *Source) Cached(client *http.Client) (Token, bool) {
	src.mu.Lock()
	defer src.mu.Unlock()
	return src.fresh(client)
}

// fresh is the cached token while it is fresh, starting the background refresh when it is due
// (src.mu held).
func (src *Source) fresh(client *http.Client) (Token, bool) {
	now := src.now()
	t := src.tok
	if t == nil || !now.Before(t.expiresAt) {
		return Token{}, false
	}
	if !now.Before(t.refreshAt) && src.fetching == nil && !now.Before(src.failedUntil) {
		src.startFetch(client)
	}
	return t.Token, true
}

// startFetch starts the one fetch (src.mu held). It runs on its own deadline (the endpoint's
// timeout), not on a caller's context: it serves every caller waiting.
func (src *Source) startFetch(client *http.Client) {
	done := make(chan struct{})
	src.fetching = done
	src.fetches++
	go func() {
		timeout := src.settings.Timeout
		if timeout <= 0 {
			timeout = 10 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := src.now()
		value, expiry, err := src.settings.fetch(ctx, client, start)
		if err == nil && !expiry.IsZero() && !expiry.After(start) {
			// Used at once it would be refused, and fetched again at once: say so instead.
			err = errorf("the token endpoint issued a token that has expired already (expires_in not positive)")
		}
		src.mu.Lock()
		defer src.mu.Unlock()
		defer close(done)
		src.fetching = nil
		if err != nil {
			src.failed, src.failedUntil = err, src.now().Add(failureHold)
			if e, ok := err.(*Error); !ok || e == nil {
				src.failed = errorf("%v", err)
			}
			return
		}
		src.failed, src.failedUntil = nil, time.Time{}
		src.tok = lifetimeOf(value, start, expiry)
	}()
}

// lifetimeOf caches a token fetched at start: refreshed in the background after three
// quarters of its lifetime, no longer used in its last tenth (at most its last 10 seconds).
func lifetimeOf(value string, start, expiry time.Time) *cached {
	if expiry.IsZero() {
		expiry = start.Add(assumedLifetime)
	}
	life := max(expiry.Sub(start), 0)
	return &cached{Token: Token{Header: value, Expiry: expiry},
		refreshAt: start.Add(life * 3 / 4), expiresAt: expiry.Add(-min(life/10, 10*time.Second))}
}

// Invalidate drops t if it is still the cached token (the receiver answered 401 to it): the
// next Token fetches a new one. A newer token is kept.
func (src *Source) Invalidate(t Token) {
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.tok != nil && src.tok.Header == t.Header {
		src.tok = nil
	}
}

// Fetches is how many fetches the source started.
func (src *Source) Fetches() int {
	src.mu.Lock()
	defer src.mu.Unlock()
	return src.fetches
}
