package ingress_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/kubeauth"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// reviewCounter is an API client that counts the TokenReviews it sends and holds those of
// tokens other than pass until release closes.
type reviewCounter struct {
	reviews, held atomic.Int64
	pass          string
	release       chan struct{}
}

func (c *reviewCounter) client(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(restCfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if strings.HasSuffix(r.URL.Path, "/tokenreviews") {
				c.reviews.Add(1)
				if c.release != nil && r.GetBody != nil {
					b, _ := r.GetBody()
					body, _ := io.ReadAll(b)
					if !bytes.Contains(body, []byte(c.pass)) {
						c.held.Add(1)
						select {
						case <-c.release:
						case <-r.Context().Done():
						}
					}
				}
			}
			return rt.RoundTrip(r)
		})
	}
	return kubernetes.NewForConfigOrDie(cfg)
}

// What cannot be a token of the ingress costs no TokenReview: no JWT, another audience, no
// expiry, expired, not valid yet, the algorithm none. A well-formed token of the audience is
// still the API server's to judge.
func TestPrecheckRefusesWithoutAReview(t *testing.T) {
	ensureNamespace(t, "a")
	apiToken := producer(t, "a", "precheck", true, "")
	var c reviewCounter
	a := &ingress.Authorizer{Reviewer: kubeauth.Reviewer{Client: c.client(t)}}
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	unsigned := func(header, claims string) string { return enc(header) + "." + enc(claims) + ".c2ln" }
	future, past := time.Now().Add(time.Hour).Unix(), time.Now().Add(-time.Minute).Unix()
	for _, tc := range []struct{ name, token, want string }{
		{"garbage", "not-a-token", "not a Kubernetes ServiceAccount token"},
		{"three parts of garbage", "a.b.c", "not a Kubernetes ServiceAccount token"},
		{"the algorithm none", unsigned(`{"alg":"none"}`, fmt.Sprintf(`{"aud":["%s"],"exp":%d}`, ingress.DefaultAudience, future)), "not a Kubernetes ServiceAccount token"},
		{"a token of the API server's audience", apiToken, "not for audience " + ingress.DefaultAudience},
		{"another audience", unsigned(`{"alg":"RS256"}`, fmt.Sprintf(`{"aud":"nats.webhook-operator.io","exp":%d}`, future)), "not for audience"},
		{"no expiry", unsigned(`{"alg":"RS256"}`, fmt.Sprintf(`{"aud":"%s"}`, ingress.DefaultAudience)), "no expiry"},
		{"expired", unsigned(`{"alg":"RS256"}`, fmt.Sprintf(`{"aud":["%s"],"exp":%d}`, ingress.DefaultAudience, past)), "expired"},
		{"not valid yet", unsigned(`{"alg":"RS256"}`, fmt.Sprintf(`{"aud":["%s"],"exp":%d,"nbf":%d}`, ingress.DefaultAudience, future, future-60)), "not valid before"},
	} {
		d, err := a.Authorize(context.Background(), tc.token, "a")
		if err != nil || d.Status != http.StatusUnauthorized || !strings.Contains(d.Reason, tc.want) {
			t.Errorf("%s: %+v %v, want 401 with %q", tc.name, d, err, tc.want)
		}
	}
	if n := c.reviews.Load(); n != 0 {
		t.Errorf("%d TokenReviews for tokens that cannot be the ingress's, want none", n)
	}
	if d, _ := a.Authorize(context.Background(), forged(ingress.DefaultAudience, time.Hour), "a"); d.Status != http.StatusUnauthorized || c.reviews.Load() != 1 {
		t.Errorf("a well-formed forged token: %+v after %d reviews, want refused by one", d, c.reviews.Load())
	}
}

// Refusals are kept apart from decisions that allow: however many callers are refused, a
// producer's decision stays cached (before, each refusal could evict it, and every unseen
// token cost the producers a TokenReview of their own).
func TestRefusalsDoNotEvictDecisions(t *testing.T) {
	ensureNamespace(t, "a")
	tok := producer(t, "a", "kept", true)
	var c reviewCounter
	misses := 0
	a := &ingress.Authorizer{Reviewer: kubeauth.Reviewer{Client: c.client(t)}, Size: 2, TTL: time.Hour,
		Observe: func(hit bool) {
			if !hit {
				misses++
			}
		}}
	if d, err := a.Authorize(context.Background(), tok, "a"); err != nil || d.Status != 0 {
		t.Fatalf("%+v %v", d, err)
	}
	for range 10 {
		if d, _ := a.Authorize(context.Background(), forged(ingress.DefaultAudience, time.Hour), "a"); d.Status != http.StatusUnauthorized {
			t.Fatalf("a forged token: %+v", d)
		}
	}
	if d, _ := a.Authorize(context.Background(), tok, "b"); d.Status != http.StatusForbidden {
		t.Fatalf("another namespace: %+v", d)
	}
	before := misses
	if d, err := a.Authorize(context.Background(), tok, "a"); err != nil || d.Status != 0 || misses != before {
		t.Errorf("the producer's decision after 11 refusals: %+v %v, %d misses (want a hit)", d, err, misses-before)
	}
	if allowed, refused := a.Len(); allowed != 1 || refused != 2 {
		t.Errorf("%d decisions and %d refusals kept, want 1 and 2", allowed, refused)
	}
}

// A caller is authenticated before it takes one of the requests' slots, and the reviews in
// flight are bounded: unseen tokens whose reviews hang take no slot, those beyond the bound
// are answered 503 at once, and a producer with a cached decision publishes meanwhile.
func TestUnauthenticatedCallersTakeNoSlot(t *testing.T) {
	ensureNamespace(t, "a")
	tok := producer(t, "a", "slots", true)
	c := &reviewCounter{pass: tok, release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(c.release)
		}
	}
	defer release()
	w := newWorld(t, func(o *ingress.Options) {
		o.MaxConcurrent = 2
		o.Auth = &ingress.Authorizer{Reviewer: kubeauth.Reviewer{Client: c.client(t)}, MaxReviews: 2}
	})
	if status, _, resp := w.post("/v1/namespaces/a/events", tok, "application/json", event("evt_warm", "t", "1")); status != http.StatusAccepted {
		t.Fatalf("%d %s", status, resp)
	}
	type answer struct {
		status int
		body   string
	}
	answers := make(chan answer, 6)
	for i := range 6 {
		go func() {
			status, _, resp := w.post("/v1/namespaces/a/events", forged(ingress.DefaultAudience, time.Hour), "application/json", event(fmt.Sprintf("evt_x%d", i), "t", "1"))
			answers <- answer{status, string(resp)}
		}()
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return c.held.Load() == 2 }, "2 reviews held, %d", &c.held)
	for range 4 {
		select {
		case a := <-answers:
			if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, "verifying 2 new callers at once") {
				t.Errorf("a caller beyond the reviews in flight: %d %s", a.status, a.body)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the callers beyond the reviews in flight were not answered")
		}
	}
	// Both held callers wait for their review, holding no slot.
	if status, _, resp := w.post("/v1/namespaces/a/events", tok, "application/json", event("evt_meanwhile", "t", "1")); status != http.StatusAccepted {
		t.Errorf("a producer while 2 unseen tokens are reviewed: %d %s", status, resp)
	}
	release()
	for range 2 {
		if a := <-answers; a.status != http.StatusUnauthorized {
			t.Errorf("a forged token: %d %s", a.status, a.body)
		}
	}
	if n := len(w.stored("a")); n != 2 {
		t.Errorf("%d events stored, want 2", n)
	}
}

// closedAtOnce says whether the server closed c without answering (read within a bound that
// only a server keeping it open would reach).
func closedAtOnce(c net.Conn) error {
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	switch {
	case n > 0:
		return errors.New("the server answered")
	case errors.As(err, &ne) && ne.Timeout():
		return errors.New("the server kept it open")
	}
	return nil
}

// dialFrom connects to host from the loopback address from (127.0.0.x: another client).
func dialFrom(t *testing.T, from, host string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Connections are bounded, in all and per client address: one more is closed as soon as it is
// accepted, idle or not, and a place given back serves again.
func TestConnectionsAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := ingress.NewMetrics(reg)
	w := newServingWorld(t, func(o *ingress.Options) { o.Metrics = m },
		ingress.ServerOptions{Addr: "127.0.0.1:0", ReadHeaderTimeout: time.Minute, Idle: time.Minute, MaxConnections: 3, MaxConnectionsPerClient: 2, Metrics: m})
	tok := producer(t, "a", "conns", true)
	host := strings.TrimPrefix(w.url, "http://")
	first := dialFrom(t, "127.0.0.1", host)
	dialFrom(t, "127.0.0.1", host)
	testenv.Eventually(t, 20*time.Second, func() bool { return gauge(t, reg, "webhook_ingress_connections") == 2 }, "2 connections open")
	if err := closedAtOnce(dialFrom(t, "127.0.0.1", host)); err != nil {
		t.Errorf("a third connection of one client: %v", err)
	}
	// Another client gets its own; it is served.
	other := dialFrom(t, "127.0.0.2", host)
	body := event("evt_conn", "t", "1")
	fmt.Fprintf(other, "POST /v1/namespaces/a/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", host, tok, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(other), nil)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("another client: %v %v", resp, err)
	}
	resp.Body.Close()
	// At the bound in all: a third client's is closed too.
	if err := closedAtOnce(dialFrom(t, "127.0.0.3", host)); err != nil {
		t.Errorf("a connection beyond the bound in all: %v", err)
	}
	// A place given back serves again.
	first.Close()
	testenv.Eventually(t, 20*time.Second, func() error {
		req, _ := http.NewRequest(http.MethodPost, w.url+"/v1/namespaces/a/events", bytes.NewReader(event("evt_again", "t", "1")))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}, "a request once a connection closed")
	if n := gauge(t, reg, "webhook_ingress_connections"); n > 3 {
		t.Errorf("%v connections open, bound 3", n)
	}
}

// rawPost sends a request's headers announcing contentLength and the first bytes of its body on
// a connection of its own, and leaves it there.
func rawPost(t *testing.T, host, path, token string, contentLength int, prefix []byte) net.Conn {
	t.Helper()
	c := dialFrom(t, "127.0.0.1", host)
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, host, token, contentLength, prefix); err != nil {
		t.Fatal(err)
	}
	return c
}

// A body's memory follows what arrives, not what Content-Length announces: 32 requests
// announcing 4 MiB and sending 10 bytes hold kilobytes (before, each allocated its 4 MiB before
// reading a byte: 128 MiB here, every replica's memory at 512 requests).
func TestBodyMemoryFollowsWhatArrives(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := ingress.NewMetrics(reg)
	// A budget that would not stop them: the buffers alone are measured.
	w := newServingWorld(t, func(o *ingress.Options) {
		o.Metrics, o.MaxBodyBytesInFlight, o.MaxBodyBytesPerNamespace = m, 1<<30, 1<<30
	},
		ingress.ServerOptions{Addr: "127.0.0.1:0", ReadTimeout: 2 * time.Minute, MaxConnections: 100, MaxConnectionsPerClient: 100})
	tok := producer(t, "a", "memory", true)
	host := strings.TrimPrefix(w.url, "http://")
	if status, _, resp := w.post("/v1/namespaces/a/events", tok, "application/json", event("evt_warm", "t", "1")); status != http.StatusAccepted {
		t.Fatalf("%d %s", status, resp)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 32
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = rawPost(t, host, "/v1/namespaces/a/events", tok, ingress.DefaultMaxBatchBytes, []byte(`[{"id":"x"`))
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return gauge(t, reg, "webhook_ingress_requests_in_flight") == n },
		"%d requests reading their bodies", n)
	var during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&during)
	if grew := int64(during.HeapAlloc) - int64(before.HeapAlloc); grew > 32<<20 {
		t.Errorf("the heap grew by %d MiB for %d requests that sent 10 bytes each", grew>>20, n)
	}
	if held := gauge(t, reg, "webhook_ingress_body_bytes"); held > n*16<<10 {
		t.Errorf("%v bytes of bodies held for %d requests that sent 10 bytes each", held, n)
	}
	for _, c := range conns {
		c.Close()
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return gauge(t, reg, "webhook_ingress_requests_in_flight") == 0 && gauge(t, reg, "webhook_ingress_body_bytes") == 0
	}, "the abandoned requests' budget given back")
}

// The bytes of bodies held at once are budgeted, in all and per namespace: a namespace at its
// share is answered 503 with Retry-After, another namespace publishes, and the share serves
// again once the body held is answered.
func TestBodyBytesAreBudgeted(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := ingress.NewMetrics(reg)
	w := newServingWorld(t, func(o *ingress.Options) {
		o.Metrics, o.MaxBodyBytesInFlight, o.MaxBodyBytesPerNamespace, o.MaxBatchBytes = m, 1<<20, 256<<10, 256<<10
	}, ingress.ServerOptions{Addr: "127.0.0.1:0", ReadTimeout: 2 * time.Minute})
	a, b := producer(t, "a", "budget", true), producer(t, "b", "budget", true)
	host := strings.TrimPrefix(w.url, "http://")
	// A batch of 4 events of 49 KiB: about 200 KiB, of which 150 KiB arrive.
	var batch bytes.Buffer
	batch.WriteByte('[')
	for i := range 4 {
		if i > 0 {
			batch.WriteByte(',')
		}
		batch.Write(event(fmt.Sprintf("evt_big%d", i), "t", `"`+strings.Repeat("x", 49<<10)+`"`))
	}
	batch.WriteByte(']')
	held := rawPost(t, host, "/v1/namespaces/a/events", a, batch.Len(), batch.Bytes()[:150<<10])
	testenv.Eventually(t, 30*time.Second, func() bool { return gauge(t, reg, "webhook_ingress_body_bytes") == 256<<10 },
		"namespace a's share held by one body")
	status, h, resp := w.post("/v1/namespaces/a/events", a, "application/json", event("evt_a", "t", "1"))
	if status != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(string(resp), "namespace a's request bodies") {
		t.Errorf("namespace a at its share: %d %v %s", status, h, resp)
	}
	if status, _, resp := w.post("/v1/namespaces/b/events", b, "application/json", event("evt_b", "t", "1")); status != http.StatusAccepted {
		t.Errorf("namespace b meanwhile: %d %s", status, resp)
	}
	if _, err := held.Write(batch.Bytes()[150<<10:]); err != nil {
		t.Fatal(err)
	}
	r, err := http.ReadResponse(bufio.NewReader(held), nil)
	if err != nil || r.StatusCode != http.StatusAccepted {
		t.Fatalf("the held batch: %v %v", r, err)
	}
	r.Body.Close()
	if status, _, resp := w.post("/v1/namespaces/a/events", a, "application/json", event("evt_a", "t", "1")); status != http.StatusAccepted {
		t.Errorf("namespace a once its body was answered: %d %s", status, resp)
	}
	if n := gauge(t, reg, "webhook_ingress_body_bytes"); n != 0 {
		t.Errorf("%v bytes of bodies held after every answer", n)
	}
}

// A namespace over its rate is refused before its body is read: a request announcing 1 MiB
// and sending none of it is answered 429 at once.
func TestRateLimitedBeforeTheBodyIsRead(t *testing.T) {
	w := newServingWorld(t, func(o *ingress.Options) { o.RateLimit = &ingress.RateLimiter{Rate: 0.001, Burst: 1} },
		ingress.ServerOptions{Addr: "127.0.0.1:0", ReadTimeout: 2 * time.Minute})
	tok := producer(t, "a", "early", true)
	if status, _, resp := w.post("/v1/namespaces/a/events", tok, "application/json", event("evt_1", "t", "1")); status != http.StatusAccepted {
		t.Fatalf("%d %s", status, resp)
	}
	c := rawPost(t, strings.TrimPrefix(w.url, "http://"), "/v1/namespaces/a/events", tok, 1<<20, nil)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer before the body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("over the rate: %d %v", resp.StatusCode, resp.Header)
	}
}
