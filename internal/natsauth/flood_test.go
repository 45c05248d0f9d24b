package natsauth_test

import (
	"crypto/rand"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// countingReviews makes w's callout count the TokenReviews it asks the API server for.
func countingReviews(w *world) *atomic.Int64 {
	var n atomic.Int64
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if strings.HasSuffix(r.URL.Path, "/tokenreviews") {
				n.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	w.svc.Kube.Client = kubernetes.NewForConfigOrDie(cfg)
	return &n
}

// from makes a connection come from the loopback address ip, a host of its own to the server.
func from(ip string) nats.Option {
	return nats.SetCustomDialer(&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: natsauth.ConnectTimeout})
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "not-a-token-" + base64.RawURLEncoding.EncodeToString(b)
}

// A flood of CONNECTs with bad tokens from one host costs the API server at most that host's
// rate in TokenReviews, and other tenants' connections keep being authorized meanwhile (each
// within the server's authorization timeout, or it would be refused).
func TestCalloutHoldsAgainstAFloodOfBadConnects(t *testing.T) {
	w := newWorld(t, false)
	reviews := countingReviews(w)
	const rate, burst = 5, 20
	w.svc.RatePerHost, w.svc.BurstPerHost = rate, burst
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	tok := token(t, "a", "producer", natsauth.DefaultAudience)

	start, before := time.Now(), reviews.Load()
	stop := make(chan struct{})
	var attempts atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	end := func() { once.Do(func() { close(stop); wg.Wait() }) }
	t.Cleanup(end)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				nc, err := nats.Connect(w.nats.URL(), proving(from("127.0.0.2"), nats.Token(randomToken()), nats.UserInfo("a", ""),
					nats.MaxReconnects(0), nats.Timeout(natsauth.ConnectTimeout))...)
				if err == nil {
					nc.Close()
				}
				attempts.Add(1)
			}
		}()
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return attempts.Load() >= 200 }, "the flood made %d attempts", attempts.Load())
	// Fewer than the burst: the tenants' host has its own bucket.
	const tenants = 10
	for range tenants {
		c := w.mustConnect(tok, "a")
		c.nc.Close()
	}
	end()
	elapsed := time.Since(start)
	made := reviews.Load() - before
	bound := int64(burst + rate*elapsed.Seconds() + tenants + 2)
	t.Logf("%d bad CONNECTs in %s cost %d TokenReviews (bound %d)", attempts.Load(), elapsed.Round(time.Millisecond), made, bound)
	if made > bound {
		t.Errorf("%d bad CONNECTs from one host cost %d TokenReviews in %s; its rate allows %d", attempts.Load(), made, elapsed, bound)
	}
	if !w.log.has("bus connections refused", "too many connection attempts from 127.0.0.2", "refusedSinceLastLogged") {
		t.Errorf("the host over its rate is not logged:\n%.3000s", w.log)
	}
}

// A token the API server refused is refused again for a while without asking it.
func TestRefusedTokensAreRememberedBriefly(t *testing.T) {
	w := newWorld(t, false)
	reviews := countingReviews(w)
	bad := randomToken()
	before := reviews.Load()
	for range 10 {
		if _, err := nats.Connect(w.nats.URL(), proving(nats.Token(bad), nats.UserInfo("a", ""), nats.MaxReconnects(0), nats.Timeout(natsauth.ConnectTimeout))...); err == nil {
			t.Fatal("connected with a bad token")
		}
	}
	if made := reviews.Load() - before; made != 1 {
		t.Errorf("10 CONNECTs with one bad token made %d TokenReviews, want 1", made)
	}
	if !w.log.has("bus connection refused", "did not accept this token a moment ago") {
		t.Errorf("the remembered refusal is not logged:\n%s", w.log)
	}
}

// holdingReviews makes w's callout hold every TokenReview of a flood's token (randomToken)
// until release is closed, counting those held; the others go through.
func holdingReviews(w *world, release <-chan struct{}) *atomic.Int64 {
	var held atomic.Int64
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if strings.HasSuffix(r.URL.Path, "/tokenreviews") && r.GetBody != nil {
				if body, err := r.GetBody(); err == nil {
					b, _ := io.ReadAll(io.LimitReader(body, 1<<20))
					body.Close()
					if strings.Contains(string(b), "not-a-token-") {
						held.Add(1)
						select {
						case <-release:
						case <-r.Context().Done():
						}
						held.Add(-1)
					}
				}
			}
			return rt.RoundTrip(r)
		})
	})
	w.svc.Kube.Client = kubernetes.NewForConfigOrDie(cfg)
	return &held
}

// A flood whose decisions hang (its TokenReviews held) takes no more of the callout than its
// bounds: one host has at most MaxPendingPerHost requests waiting or in a decision, one
// namespace MaxPendingPerNamespace, whatever hosts it comes from, and the excess is refused at
// once, saying which bound; a tenant of another namespace and host is authorized meanwhile.
// Before, the reader stopped reading at Concurrency decisions in flight, and every connection
// waited behind the flood until the server's authorization timeout refused it.
func TestCalloutFloodIsBoundedPerHostAndNamespace(t *testing.T) {
	w := newWorld(t, false)
	w.stopService()
	svc, err := w.nats.Auth.CalloutService(w.svc.Kube, w.log.logger())
	if err != nil {
		t.Fatal(err)
	}
	svc.Kube = &natsauth.Kube{Client: cs, Audience: natsauth.DefaultAudience, Dispatchers: labelledDispatchers}
	svc.Concurrency, svc.MaxPendingPerHost, svc.MaxPendingPerNamespace = 4, 2, 3
	svc.Timeout = time.Minute // held decisions stay held
	w.svc = svc
	release := make(chan struct{})
	held := holdingReviews(w, release)
	w.startService()
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	tok := token(t, "a", "producer", natsauth.DefaultAudience)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var once sync.Once
	end := func() { once.Do(func() { close(stop); close(release); wg.Wait() }) }
	t.Cleanup(end)
	var attempts atomic.Int64
	flood := func(host string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				nc, err := nats.Connect(w.nats.URL(), proving(from(host), nats.Token(randomToken()), nats.UserInfo("b", ""),
					nats.MaxReconnects(0), nats.Timeout(natsauth.ConnectTimeout))...)
				if err == nil {
					nc.Close()
				}
				attempts.Add(1)
			}
		}()
	}
	// One host, several connections at once: its bound of 2 is held, the rest refused.
	for range 4 {
		flood("127.0.0.2")
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return w.log.has("bus connections refused", "from 127.0.0.2 are waiting or in a decision, the bound per client host")
	}, "the host's excess refused at once, saying why:\n%.3000s", w.log)
	// Namespace b from other hosts: the namespace's bound of 3 is held in all.
	for _, host := range []string{"127.0.0.4", "127.0.0.5", "127.0.0.6"} {
		flood(host)
		flood(host)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return w.log.has("bus connections refused", `for namespace \"b\" are waiting or in a decision, the bound per namespace`)
	}, "the namespace's excess refused at once, saying why:\n%.3000s", w.log)
	if got := held.Load(); got > 3 {
		t.Errorf("%d of the flood's decisions are held, more than namespace b's bound of 3", got)
	}
	// A tenant of namespace a on another host is decided while the flood holds its bounds.
	before := attempts.Load()
	nc, err := nats.Connect(w.nats.URL(), append(natsauth.ClientOptions(func() string { return tok }, "a"), from("127.0.0.3"), nats.MaxReconnects(0))...)
	if err != nil {
		t.Fatalf("a tenant during the flood (%d decisions held): %v\ncallout log:\n%.3000s", held.Load(), err, w.log)
	}
	nc.Close()
	t.Logf("the tenant connected while the flood held %d decisions and made %d attempts meanwhile", held.Load(), attempts.Load()-before)
	end()
}
