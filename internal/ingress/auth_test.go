package ingress_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/kubeauth"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A decision missing under many concurrent requests costs one review, not one per request in
// flight (which, through a client's rate limit, stalled every request for hundreds of
// milliseconds each time a decision expired); a decision in use is reviewed again in the
// background in the last fifth of its TTL, so callers that keep publishing never miss.
func TestAuthorizerReviewsOnceAndAhead(t *testing.T) {
	ensureNamespace(t, "a")
	tok := producer(t, "a", "flights", true)
	var reviews atomic.Int64
	cfg := rest.CopyConfig(restCfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if strings.HasSuffix(r.URL.Path, "/tokenreviews") {
				reviews.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	var (
		mu     sync.Mutex
		now    = time.Now()
		misses atomic.Int64
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	a := &ingress.Authorizer{Reviewer: kubeauth.Reviewer{Client: kubernetes.NewForConfigOrDie(cfg)}, TTL: time.Minute, Now: clock,
		Observe: func(hit bool) {
			if !hit {
				misses.Add(1)
			}
		}}
	authorize := func() error {
		d, err := a.Authorize(context.Background(), tok, "a")
		if err != nil || d.Status != 0 {
			return fmt.Errorf("decision %+v, error %v", d, err)
		}
		return nil
	}

	const callers = 64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			if err := authorize(); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := reviews.Load(); n != 1 {
		t.Fatalf("%d TokenReviews for %d concurrent callers of one token, want 1", n, callers)
	}

	// 50 s into a 60 s decision: answered from the cache, reviewed again behind it.
	advance(50 * time.Second)
	before := misses.Load()
	if err := authorize(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := reviews.Load(); n != 2 {
			return fmt.Errorf("%d TokenReviews, want the background one too", n)
		}
		if n := a.InFlight(); n != 0 {
			return fmt.Errorf("%d reviews in flight: the background one is not decided yet", n)
		}
		return nil
	}, "the decision reviewed ahead of its expiry")
	// Past the first decision's expiry, the renewed one answers: no caller waited.
	advance(20 * time.Second)
	if err := authorize(); err != nil {
		t.Fatal(err)
	}
	if m := misses.Load(); m != before {
		t.Errorf("%d lookups missed the cache after the decision was reviewed ahead, want none", m-before)
	}
}
