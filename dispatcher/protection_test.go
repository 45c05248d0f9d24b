package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/leases"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

func (e *env) policy(name string, spec v1alpha1.RetryPolicySpec) *v1alpha1.LocalObjectReference {
	e.t.Helper()
	rp := &v1alpha1.RetryPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name}, Spec: spec}
	if err := e.k8s.Create(context.Background(), rp); err != nil {
		e.t.Fatal(err)
	}
	return &v1alpha1.LocalObjectReference{Name: name}
}

func noCircuit() *v1alpha1.CircuitBreakerSpec {
	return &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 0}
}

func (e *env) events(reason string) []corev1.Event {
	var list corev1.EventList
	if err := e.k8s.List(context.Background(), &list, client.InNamespace(e.ns)); err != nil {
		e.t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range list.Items {
		if ev.Reason == reason {
			out = append(out, ev)
		}
	}
	return out
}

func (e *env) enable(name string) {
	e.t.Helper()
	ep := e.get(name)
	patch := client.MergeFrom(ep.DeepCopy())
	if ep.Annotations == nil {
		ep.Annotations = map[string]string{}
	}
	ep.Annotations[v1alpha1.AnnotationEnable] = time.Now().UTC().Format(time.RFC3339Nano)
	if err := e.k8s.Patch(context.Background(), ep, patch); err != nil {
		e.t.Fatal(err)
	}
}

// The circuit opens after exactly the policy's consecutive failures, parks deliveries (neither
// replica pulls), sends one half-open probe after openDuration, closes after the policy's
// successes, then ramps up instead of releasing the backlog at once. Two replicas agree.
func TestCircuitBreakerSharedByTwoReplicas(t *testing.T) {
	e := newEnv(t)
	var failing atomic.Bool
	failing.Store(true)
	var inflight, maxInflight atomic.Int64
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			m := maxInflight.Load()
			if n <= m || maxInflight.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		if failing.Load() {
			return testenv.Response{Status: 500, Body: "down"}
		}
		return testenv.Response{Status: 200, Body: "ok"}
	})
	ref := e.policy("cb", v1alpha1.RetryPolicySpec{
		Schedule:       []metav1.Duration{{}, {Duration: time.Hour}},
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 3, OpenDuration: dur(1500 * time.Millisecond), SuccessesToClose: 2, RampUp: dur(3 * time.Second)},
	})
	e.endpoint("flaky", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref, MaxInFlight: ptr[int32](1)})
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	e.dispatcher("a", func(o *dispatcher.Options) { o.Replicas, o.Registry = 2, regs[0] })
	e.dispatcher("b", func(o *dispatcher.Options) { o.Replicas, o.Registry = 2, regs[1] })

	for i := range 3 {
		e.publish("x", fmt.Sprintf("evt_fail_%d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("flaky").Status.Health
		return h != nil && h.CircuitState == v1alpha1.CircuitOpen
	}, "circuit never opened: %v", lazy(func() string { return fmt.Sprint(e.get("flaky").Status.Health) }))
	if n := rcv.Stats().Requests; n != 3 {
		t.Fatalf("the circuit opened after %d attempts, want exactly 3", n)
	}
	// The circuit opened after the third failure's response, so after the receiver got it.
	opened := rcv.Requests()[2].At
	if c := condition(e.get("flaky"), v1alpha1.ConditionCircuitOpen); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("CircuitOpen condition: %+v", c)
	}
	// While open, new deliveries are parked: neither replica attempts them.
	failing.Store(false)
	for i := range 200 {
		e.publish("x", fmt.Sprintf("evt_new_%03d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return rcv.Stats().Requests > 3 }, "no half-open probe")
	if probe := rcv.Requests()[3].At.Sub(opened); probe < 1500*time.Millisecond {
		t.Errorf("half-open probe %s after the failure that opened the circuit, before openDuration (1.5s)", probe)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("flaky").Status.Health
		return h != nil && h.CircuitState == v1alpha1.CircuitClosed
	}, "circuit never closed")
	// Closing needs two successful probes, one at a time.
	hits := rcv.Requests()
	if len(hits) < 5 || hits[4].At.Before(hits[3].At) {
		t.Fatalf("want two sequential probes, got %d hits", len(hits))
	}
	closedAt := hits[4].At
	// Ramp-up: right after closing only a trickle goes out, not the 200 parked deliveries.
	early := 0
	for _, h := range rcv.Requests()[5:] {
		if h.At.Sub(closedAt) < 500*time.Millisecond {
			early++
		}
	}
	if early > 10 {
		t.Errorf("%d deliveries in the first 500ms after closing: the backlog burst out instead of ramping up", early)
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return len(rcv.RequestsByID()) == 203 }, "backlog not drained after ramp-up: %d", lazyN(func() int { return len(rcv.RequestsByID()) }))
	// Once the ramp-up is over, the replicas are back to the endpoint's full limits: the one
	// that holds its maxInFlight (1) may have one request in flight; the other, which holds
	// no part of it, delivers none of its deliveries (a limit of 0, or none of its series).
	active := 0
	for i, reg := range regs {
		if len(series(t, reg, "webhook_endpoint_concurrency_limit", "flaky")) == 0 || gauge(t, reg, "webhook_endpoint_concurrency_limit", "flaky") == 0 {
			continue // no part of its maxInFlight (on the shared lane it parks what it gets)
		}
		active++
		testenv.Eventually(t, 10*time.Second, func() bool {
			return math.IsInf(gauge(t, reg, "webhook_endpoint_rate_limit", "flaky"), 1) && gauge(t, reg, "webhook_endpoint_concurrency_limit", "flaky") == 1
		}, "replica %d still limited after the ramp-up: rate %v/s, concurrency %v", i,
			lazy(func() string { return fmt.Sprint(gauge(t, reg, "webhook_endpoint_rate_limit", "flaky")) }),
			lazy(func() string { return fmt.Sprint(gauge(t, reg, "webhook_endpoint_concurrency_limit", "flaky")) }))
	}
	if active == 0 {
		t.Errorf("no replica delivered the endpoint's deliveries")
	}
	if m := maxInflight.Load(); m > 1 {
		t.Errorf("%d requests at once at the receiver, want at most maxInFlight (1)", m)
	}
	if c := condition(e.get("flaky"), v1alpha1.ConditionCircuitOpen); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("CircuitOpen condition after closing: %+v", c)
	}
	if len(e.events("CircuitOpened")) == 0 || len(e.events("CircuitClosed")) == 0 {
		t.Errorf("no CircuitOpened/CircuitClosed Events recorded")
	}
}

// Seed 001: the endpoint pauses itself at the 10th consecutive failed attempt (retries
// included), not one earlier; what arrives meanwhile is dead-lettered as endpoint_disabled;
// an Event and the status say so; re-enabling resets the counters and deliveries resume.
func TestAutoDisableAtTheTenthConsecutiveFailure(t *testing.T) {
	e := newEnv(t)
	var failing atomic.Bool
	failing.Store(true)
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		if failing.Load() {
			return testenv.Response{Status: 500, Body: "down"}
		}
		return testenv.Response{Status: 200, Body: "ok"}
	})
	ref := e.policy("crm", v1alpha1.RetryPolicySpec{
		MaxAttempts:    ptr[int32](5),
		Backoff:        &v1alpha1.BackoffSpec{InitialInterval: dur(5 * time.Millisecond), MaxInterval: dur(20 * time.Millisecond), Jitter: v1alpha1.JitterNone},
		CircuitBreaker: noCircuit(),
		AutoDisable:    &v1alpha1.AutoDisableSpec{ConsecutiveFailures: ptr[int32](10)},
	})
	e.endpoint("crm", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref})
	e.dispatcher("d1")

	e.publish("contact.created", "evt_1", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "first delivery not exhausted")
	testenv.Eventually(t, 5*time.Second, func() bool {
		h := e.get("crm").Status.Health
		return h != nil && h.ConsecutiveFailures == 5
	}, "status does not show 5 consecutive failures")
	if c := condition(e.get("crm"), v1alpha1.ConditionDisabled); c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("disabled after 5 failures: %+v", c)
	}
	e.publish("contact.created", "evt_2", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool {
		c := condition(e.get("crm"), v1alpha1.ConditionDisabled)
		return c != nil && c.Status == metav1.ConditionTrue
	}, "never disabled")
	// The 10th attempt was made (so it was not disabled at the 9th), and no 11th.
	testenv.Eventually(t, 5*time.Second, func() bool { return len(e.deadLetters()) == 2 }, "second delivery not dead-lettered")
	if n := rcv.Stats().Requests; n != 10 {
		t.Fatalf("receiver saw %d attempts, want exactly 10", n)
	}
	ep := e.get("crm")
	if c := condition(ep, v1alpha1.ConditionDisabled); c.Reason != v1alpha1.ReasonConsecutiveFailures || !strings.Contains(c.Message, "10 consecutive failed attempts") {
		t.Errorf("Disabled condition: %+v", c)
	}
	if ep.Status.Health.DisabledSince == nil || ep.Status.Health.DisabledReason == "" {
		t.Errorf("status lacks since when and why: %+v", ep.Status.Health)
	}
	if len(e.events("Disabled")) == 0 {
		t.Errorf("no Disabled Event recorded")
	}
	// While disabled, new deliveries are dead-lettered, not attempted.
	failing.Store(false)
	e.publish("contact.created", "evt_3", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.deadLetters()) == 3 }, "delivery to a disabled endpoint not dead-lettered")
	for _, dl := range e.deadLetters() {
		if dl.EventID == "evt_3" && dl.Reason != records.ReasonEndpointDisabled {
			t.Errorf("evt_3 dead-lettered as %q", dl.Reason)
		}
	}
	if n := rcv.Stats().Requests; n != 10 {
		t.Fatalf("a disabled endpoint was attempted: %d requests", n)
	}
	// Re-enable: counters reset, circuit closed, deliveries resume.
	e.enable("crm")
	testenv.Eventually(t, 10*time.Second, func() bool {
		c := condition(e.get("crm"), v1alpha1.ConditionDisabled)
		return c != nil && c.Status == metav1.ConditionFalse
	}, "not re-enabled")
	if h := e.get("crm").Status.Health; h.ConsecutiveFailures != 0 || h.DisabledSince != nil {
		t.Errorf("counters not reset: %+v", h)
	}
	e.publish("contact.created", "evt_4", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return len(attemptsOf(rcv)["evt_4"]) == 1 }, "no delivery after re-enabling")
	if len(e.events("Enabled")) == 0 {
		t.Errorf("no Enabled Event recorded")
	}
}

// Seed 002: disabled when >= 95% of the completed deliveries in the window failed, with at
// least 20 of them: 19 dead letters are never enough, the 20th is.
func TestAutoDisableByFailureRateNeedsTwentyDeliveries(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response { return testenv.Response{Status: 503, Body: "down"} })
	ref := e.policy("payments", v1alpha1.RetryPolicySpec{
		Schedule:       []metav1.Duration{{}},
		CircuitBreaker: noCircuit(),
		AutoDisable:    &v1alpha1.AutoDisableSpec{FailureRatePercent: ptr[int32](95), Window: dur(72 * time.Hour), MinAttempts: ptr[int32](20)},
	})
	e.endpoint("payments", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref, MaxInFlight: ptr[int32](1)})
	e.dispatcher("d1")
	for i := range 19 {
		e.publish("payment.failed", fmt.Sprintf("evt_%02d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.deadLetters()) == 19 }, "19 dead letters expected, have %d", lazyN(func() int { return len(e.deadLetters()) }))
	testenv.Eventually(t, 5*time.Second, func() bool { h := e.get("payments").Status.Health; return h != nil && h.DeadLettered == 19 }, "status not updated")
	if c := condition(e.get("payments"), v1alpha1.ConditionDisabled); c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("disabled with only 19 deliveries: %+v", c)
	}
	e.publish("payment.failed", "evt_19", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool {
		c := condition(e.get("payments"), v1alpha1.ConditionDisabled)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonFailureRate
	}, "not disabled at the 20th failed delivery")
	if n := rcv.Stats().Requests; n != 20 {
		t.Errorf("receiver saw %d attempts, want 20", n)
	}
	e.publish("payment.failed", "evt_20", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, dl := range e.deadLetters() {
			if dl.EventID == "evt_20" {
				return dl.Reason == records.ReasonEndpointDisabled
			}
		}
		return false
	}, "delivery to a disabled endpoint not dead-lettered as endpoint_disabled")
	if n := rcv.Stats().Requests; n != 20 {
		t.Errorf("a disabled endpoint was attempted")
	}
}

// The outbound guard: private, loopback, link-local, metadata and IPv6 forms are refused
// without a request, including a hostname that resolves to loopback; the allow list opens
// exactly what it names.
func TestBlockedAddressesAreFailuresWithoutARequest(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	_, port, err := net.SplitHostPort(rcv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	urls := map[string]string{
		"loopback":  fmt.Sprintf("http://127.0.0.1:%s/hook", port),
		"localhost": fmt.Sprintf("http://localhost:%s/hook", port),
		"private":   "http://10.1.2.3/hook",
		"linklocal": "http://169.254.10.10/hook",
		"metadata":  "http://169.254.169.254/latest/meta-data/",
		"v6loop":    fmt.Sprintf("http://[::1]:%s/hook", port),
		"v4mapped":  fmt.Sprintf("http://[::ffff:10.0.0.1]:%s/hook", port),
		"ula":       "http://[fd00::1]/hook",
		"other":     fmt.Sprintf("http://127.0.0.2:%s/hook", port),
	}
	ref := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	for name, u := range urls {
		e.endpoint(name, v1alpha1.WebhookEndpointSpec{URL: u, RetryPolicyRef: ref, EventTypes: []v1alpha1.EventTypePattern{v1alpha1.EventTypePattern(name)}})
	}
	// Only 127.0.0.1 itself is allowed: 127.0.0.2 and every other form stay blocked.
	e.dispatcher("d1", func(o *dispatcher.Options) {
		o.Config.AllowedCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	for name := range urls {
		e.publish(name, "evt_"+name, []byte(`{}`))
	}
	testenv.Eventually(t, 15*time.Second, func() bool { return len(e.deadLetters()) == len(urls)-2 }, "want %d dead letters, have %v%s", len(urls)-2, lazyN(func() int { return len(e.deadLetters()) }), lazy(e.dump))
	for _, dl := range e.deadLetters() {
		if len(dl.Attempts) != 1 || dl.Attempts[0].Reason != records.FailBlockedAddress {
			t.Errorf("%s: attempts %+v, want one blocked_address", dl.Endpoint, dl.Attempts)
		}
		if dl.Endpoint == "loopback" || dl.Endpoint == "localhost" {
			t.Errorf("%s is allowed by 127.0.0.1/32 but was refused", dl.Endpoint)
		}
	}
	// The allowed literal and the hostname resolving to it were delivered; nothing else
	// reached the receiver.
	testenv.Eventually(t, 10*time.Second, func() bool { return len(rcv.RequestsByID()) == 2 }, "allowed endpoints not delivered: %v", lazy(func() string { return fmt.Sprint(sortedKeys(rcv.RequestsByID())) }))
	if got := sortedKeys(rcv.RequestsByID()); got[0] != "evt_localhost" || got[1] != "evt_loopback" {
		t.Errorf("receiver saw %v", got)
	}
}

// The installer's blocked ranges (--blocked-cidrs) are refused at connect time whatever the
// allow list opens, a hostname resolving into one included; the NAT64 prefix and Azure's wire
// server are refused by default. Each is one blocked_address attempt, no request.
func TestInstallerBlockedRangesAreFailuresWithoutARequest(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	_, port, err := net.SplitHostPort(rcv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	urls := map[string]string{
		"allowed":   fmt.Sprintf("http://127.0.0.2:%s/hook", port),
		"blocked":   fmt.Sprintf("http://127.0.0.1:%s/hook", port),
		"localhost": fmt.Sprintf("http://localhost:%s/hook", port),
		"nat64":     "http://[64:ff9b::808:808]/hook",
		"wire":      "http://168.63.129.16/machine",
	}
	ref := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	for name, u := range urls {
		e.endpoint(name, v1alpha1.WebhookEndpointSpec{URL: u, RetryPolicyRef: ref, EventTypes: []v1alpha1.EventTypePattern{v1alpha1.EventTypePattern(name)}})
	}
	// The receiver listens on 127.0.0.1 only: the allowed endpoint's connection is refused by
	// the host, not by the guard.
	e.dispatcher("d1", func(o *dispatcher.Options) {
		o.Config.AllowedCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		o.Config.BlockedCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}
	})
	for name := range urls {
		e.publish(name, "evt_"+name, []byte(`{}`))
	}
	testenv.Eventually(t, 15*time.Second, func() bool { return len(e.deadLetters()) == len(urls) }, "want %d dead letters, have %v%s", len(urls), lazyN(func() int { return len(e.deadLetters()) }), lazy(e.dump))
	for _, dl := range e.deadLetters() {
		blocked := len(dl.Attempts) == 1 && dl.Attempts[0].Reason == records.FailBlockedAddress
		if blocked == (dl.Endpoint == "allowed") {
			t.Errorf("%s: attempts %+v", dl.Endpoint, dl.Attempts)
		}
	}
	if n := rcv.Stats().Requests; n != 0 {
		t.Errorf("the receiver got %d requests", n)
	}
}

// A rate limit and maxInFlight hold across two replicas of a dispatcher: the receiver never
// has more than maxInFlight requests at once, and the rate-limited endpoint's attempts never
// start faster than its rate allows (the last one no sooner after the first event was
// published than about (n-1-burst)/rate, from the dispatcher's own times in the delivery log).
// How close to the rate they come is measured by BenchmarkRateLimit.
func TestRateLimitAndMaxInFlightAcrossReplicas(t *testing.T) {
	r := runRateLimit(t)
	if m := r.maxInflight; m > rateLimitMaxInFlight {
		t.Errorf("max concurrent requests at the receiver = %d, want at most maxInFlight (%d)", m, rateLimitMaxInFlight)
	}
	recs := r.e.logRecords("limited")
	if len(recs) < rateLimitEvents {
		t.Fatalf("%d records of the rate-limited endpoint, want %d", len(recs), rateLimitEvents)
	}
	last := recs[0].Time
	for _, rec := range recs {
		if rec.Time.After(last) {
			last = rec.Time
		}
	}
	// One replica at a time holds a rate-limited endpoint, and a replica that takes it over
	// starts with a full bucket: allow up to four takeovers (the second replica's start takes
	// one) before calling it too fast. Each replica at the full rate would take half as long.
	const takeovers = 4
	least := time.Duration(float64(rateLimitEvents-1-(1+takeovers)*rateLimitBurst) / rateLimitRate * float64(time.Second))
	if got := last.Sub(r.published); got < least {
		t.Errorf("%d attempts started within %s of the first event's publication: faster than %v/s (burst %d) allows (%s)",
			rateLimitEvents, got, rateLimitRate, rateLimitBurst, least)
	}
}

// The rate-limit world: a slow endpoint with maxInFlight 8 and one limited to 40/s (burst 2),
// two replicas.
const (
	rateLimitMaxInFlight = 8
	rateLimitRate        = 40.0
	rateLimitBurst       = 2
	rateLimitEvents      = 200
)

type rateLimitRun struct {
	e             *env
	slow, limited *testenv.Receiver
	maxInflight   int64
	published     time.Time
}

// runRateLimit delivers 400 events to the slow endpoint and 200 to the rate-limited one with
// two replicas, until all arrived.
func runRateLimit(tb testing.TB) rateLimitRun {
	e := newEnv(tb)
	var inflight, maxInflight atomic.Int64
	slow := newReceiver(tb, func(h testenv.Request) testenv.Response {
		n := inflight.Add(1)
		for {
			m := maxInflight.Load()
			if n <= m || maxInflight.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
		inflight.Add(-1)
		return testenv.Response{Status: 200}
	})
	limited := newReceiver(tb, nil)
	e.endpoint("slow", v1alpha1.WebhookEndpointSpec{URL: slow.URL(), EventTypes: []v1alpha1.EventTypePattern{"slow"}, MaxInFlight: ptr[int32](rateLimitMaxInFlight)})
	e.endpoint("limited", v1alpha1.WebhookEndpointSpec{URL: limited.URL(), EventTypes: []v1alpha1.EventTypePattern{"limited"},
		RateLimit: &v1alpha1.RateLimitSpec{RequestsPerSecond: rateLimitRate, Burst: ptr[int32](rateLimitBurst)}})
	e.dispatcher("a", func(o *dispatcher.Options) { o.Replicas = 2 })
	e.dispatcher("b", func(o *dispatcher.Options) { o.Replicas = 2 })
	for i := range 400 {
		e.publish("slow", fmt.Sprintf("evt_s%d", i), []byte(`{}`))
	}
	published := time.Now()
	for i := range rateLimitEvents {
		e.publish("limited", fmt.Sprintf("evt_l%d", i), []byte(`{}`))
	}
	testenv.Eventually(tb, 60*time.Second, func() bool {
		return len(slow.RequestsByID()) == 400 && len(limited.RequestsByID()) == rateLimitEvents
	}, "not all delivered: slow %d of 400, limited %d of %d%s",
		lazyN(func() int { return len(slow.RequestsByID()) }), lazyN(func() int { return len(limited.RequestsByID()) }), rateLimitEvents, lazy(e.dump))
	return rateLimitRun{e: e, slow: slow, limited: limited, maxInflight: maxInflight.Load(), published: published}
}

// PerKey ordering over 10,000 events on 100 keys with injected failures: per key, the receiver
// sees events in publish order, and a retrying event blocks only its own key.
func TestPerKeyOrderingWithInjectedFailures(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	seen := map[string][]int{}
	sends := map[string][]string{} // what each key's requests were, to explain a failure
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		var ev struct {
			Order struct {
				ID string `json:"id"`
			} `json:"order"`
			Seq int `json:"seq"`
		}
		_ = json.Unmarshal(h.Body, &ev)
		key, seq := ev.Order.ID, ev.Seq
		mu.Lock()
		seen[key] = append(seen[key], seq)
		sends[key] = append(sends[key], fmt.Sprintf("%d(attempt %d, %s, %s)", seq, h.Attempt, h.At.Format("15:04:05.000000"), h.Header.Get("Webhook-Id")))
		mu.Unlock()
		// Fail deterministically 1 in 7 first attempts.
		if h.Attempt == 1 && seq%7 == 3 {
			return testenv.Response{Status: 500, Body: "injected"}
		}
		return testenv.Response{Status: 200}
	})
	ref := e.policy("fast", v1alpha1.RetryPolicySpec{MaxAttempts: ptr[int32](10), CircuitBreaker: noCircuit(),
		Backoff: &v1alpha1.BackoffSpec{InitialInterval: dur(2 * time.Millisecond), MaxInterval: dur(10 * time.Millisecond), Jitter: v1alpha1.JitterNone}})
	e.endpoint("ordered", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref, MaxInFlight: ptr[int32](64),
		Headers:  []v1alpha1.HTTPHeader{},
		Ordering: &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{JSONField: "order.id"}}})
	regs := map[string]*prometheus.Registry{"a": prometheus.NewRegistry(), "b": prometheus.NewRegistry()}
	e.dispatcher("a", func(o *dispatcher.Options) { o.Replicas = 2; o.Registry = regs["a"] })
	e.dispatcher("b", func(o *dispatcher.Options) { o.Replicas = 2; o.Registry = regs["b"] })
	began := time.Now()
	const n, keys = 10000, 100
	for i := range n {
		key := "k" + strconv.Itoa(i%keys)
		e.publish("order.updated", fmt.Sprintf("evt_%05d", i), []byte(fmt.Sprintf(`{"order":{"id":%q},"seq":%d}`, key, i)))
	}
	testenv.Eventually(t, 120*time.Second, func() bool { return len(rcv.RequestsByID()) == n }, "delivered %d of %d", lazyN(func() int { return len(rcv.RequestsByID()) }), n)
	mu.Lock()
	defer mu.Unlock()
	failed := 0
	for key, seqs := range seen {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] < seqs[i-1] {
				// Which replica did what: only the lease holder may deliver a PerKey endpoint.
				var who []string
				for _, id := range []string{"a", "b"} {
					who = append(who, fmt.Sprintf("dispatcher %s: %v attempts, %v deliveries created, %v events routed", id,
						counterSum(t, regs[id], "webhook_deliveries_total", "ordered"), counterSum(t, regs[id], "webhook_deliveries_created_total", ""),
						counterSum(t, regs[id], "webhook_events_routed_total", "")))
				}
				t.Fatalf("key %s: event %d was sent after event %d (%s after the dispatchers started); the key's requests: %s; %s",
					key, seqs[i], seqs[i-1], time.Since(began).Round(time.Millisecond), strings.Join(sends[key], ", "), strings.Join(who, "; "))
			}
			if seqs[i] == seqs[i-1] {
				failed++
			}
		}
	}
	if failed < n/7-keys {
		t.Errorf("only %d retries observed; the injected failures did not happen", failed)
	}
}

// When the endpoint's partition moves to another live replica (here: a third replica joins
// and takes its share), the one that lost it hands back the PerKey deliveries it holds (queued
// behind their keys) instead of keeping them, and the new holder delivers them: nothing stays
// with a replica that may never get the partition back.
func TestPerKeyPartitionMovesToAnotherReplica(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		time.Sleep(20 * time.Millisecond) // 10 keys: about 500/s, so deliveries queue behind their keys
		return testenv.Response{Status: 200}
	})
	e.endpoint("ordered", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), MaxInFlight: ptr[int32](64),
		Ordering: &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{JSONField: "key"}}})
	regs := map[string]*prometheus.Registry{}
	start := func(id string) {
		regs[id] = prometheus.NewRegistry()
		e.dispatcher(id, func(o *dispatcher.Options) { o.Replicas = 2; o.Registry = regs[id] })
	}
	start("b")
	start("d")
	// Partition p belongs to the (p mod R)th live replica in name order.
	part := leases.PartitionOf("ordered", dispatcher.DefaultPartitions)
	holder := []string{"b", "d"}[part%2]
	// The third replica's name puts the partition on a replica other than its holder.
	var joiner, other string
	for _, id := range []string{"a", "c", "e"} {
		members := []string{"b", "d", id}
		slices.Sort(members)
		if o := members[part%3]; o != holder {
			joiner, other = id, o
			break
		}
	}
	const n, keys = 2000, 10
	for i := range n {
		e.publish("order.updated", fmt.Sprintf("evt_%05d", i), []byte(fmt.Sprintf(`{"key":"k%d","seq":%d}`, i%keys, i)))
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return len(rcv.RequestsByID()) >= 200 }, "the first deliveries did not arrive")
	start(joiner)
	moved := len(rcv.RequestsByID())
	t.Logf("replica %s joined after %d of %d deliveries: the partition moves from %s to %s", joiner, moved, n, holder, other)

	testenv.Eventually(t, 60*time.Second, func() bool { return len(rcv.RequestsByID()) == n },
		"delivered %d of %d after the partition moved from %s to %s", lazyN(func() int { return len(rcv.RequestsByID()) }), n, holder, other)
	if got := counterSum(t, regs[other], "webhook_deliveries_total", "ordered"); got == 0 {
		t.Errorf("the new holder %s attempted nothing", other)
	}
	if moved == n {
		t.Error("everything was delivered before the partition moved: the test proves nothing")
	}
}

// gauge reads one endpoint's gauge from a dispatcher's registry (NaN when absent).
func gauge(t testing.TB, reg *prometheus.Registry, name, endpoint string) float64 {
	t.Helper()
	if ms := series(t, reg, name, endpoint); len(ms) > 0 {
		return ms[0].GetGauge().GetValue()
	}
	return math.NaN()
}

// counterSum adds up a counter over all its series (of one endpoint, when endpoint is set).
func counterSum(t testing.TB, reg *prometheus.Registry, name, endpoint string) float64 {
	t.Helper()
	sum := 0.0
	for _, m := range series(t, reg, name, endpoint) {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// series gathers a metric's series from a dispatcher's registry: those labelled with
// endpoint, or all of them when endpoint is empty.
func series(t testing.TB, reg *prometheus.Registry, name, endpoint string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := endpoint == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == "endpoint" && l.GetValue() == endpoint)
			}
			if match {
				out = append(out, m)
			}
		}
	}
	return out
}
