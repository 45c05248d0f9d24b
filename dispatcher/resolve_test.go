package dispatcher_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A change of one endpoint resolves that endpoint again, not every endpoint of the namespace:
// its status.secretsVersion changing (a referenced Secret changed) makes the dispatcher read
// its Secrets again, and only its own. Before, every endpoint was resolved again on every
// change, reading every endpoint's Secrets again after each such change: creating n endpoints
// cost about n²/2 Secret reads and as much garbage.
func TestAChangedEndpointAloneIsResolvedAgain(t *testing.T) {
	e := newEnv(t)
	const n, rounds = 10, 5
	for i := range n {
		e.endpoint(fmt.Sprintf("ep-%d", i), v1alpha1.WebhookEndpointSpec{URL: "http://127.0.0.1:9/hook"})
	}
	var reads atomic.Int64
	e.dispatcher("d1", func(o *dispatcher.Options) {
		cfg := rest.CopyConfig(o.RestConfig)
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/secrets/") {
					reads.Add(1)
				}
				return rt.RoundTrip(r)
			})
		})
		o.RestConfig = cfg
	})
	testenv.Eventually(t, 20*time.Second, func() bool { return reads.Load() >= n }, "the endpoints' signing Secrets were not read")
	for r := range rounds {
		before := reads.Load()
		e.updateStatus("ep-0", func(st *v1alpha1.WebhookEndpointStatus) { st.SecretsVersion = fmt.Sprintf("v%d", r) })
		testenv.Eventually(t, 20*time.Second, func() bool { return reads.Load() > before }, "the changed endpoint's Secret was not read again")
	}
	// Each round read ep-0's signing Secret again (one read; two at most if a read raced).
	if got, most := reads.Load(), int64(n+2*rounds); got > most {
		t.Fatalf("%d Secret reads for %d endpoints and %d changes of one endpoint, want at most %d", got, n, rounds, most)
	}
}
