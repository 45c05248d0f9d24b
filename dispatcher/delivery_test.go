package dispatcher_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Every event reaches the receiver once, signed (verified with the official Standard Webhooks
// library), with the headers the issue names and none a producer forged; the delivery log and
// the status say so.
func TestDeliversSignedEventsWithHeadersLogAndHealth(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	secret := e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"},
		Headers: []v1alpha1.HTTPHeader{{Name: "X-Team", Value: "payments"}}})
	rcv.Trust(secret)
	e.dispatcher("d1")

	const n = 50
	for i := range n {
		e.publish("order.created", fmt.Sprintf("evt_%03d", i), []byte(fmt.Sprintf(`{"n":%d}`, i)),
			"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			// A producer cannot forge the operator's headers (issue 20, item 5): the event is
			// delivered as itself, with its own id, as a first attempt, neither a test
			// delivery nor a replay.
			"Whk-Delivery-Id", "whdl_f", "Whk-Event-Id", "forged", "Whk-Attempts", "3", "Whk-Test", "true",
			"Whk-Replay-Of", "whdl_forged")
	}
	e.publish("invoice.created", "evt_other", []byte(`{}`)) // not subscribed
	testenv.Eventually(t, 20*time.Second, func() bool { return len(rcv.RequestsByID()) == n }, "want %d distinct events, got %v%s", n, lazyN(func() int { return len(rcv.RequestsByID()) }), lazy(e.dump))
	if bad := rcv.Stats().BadSignatures; bad != 0 {
		t.Fatalf("%d requests failed Standard Webhooks verification", bad)
	}
	hits := rcv.Requests()
	if len(hits) != n {
		t.Errorf("receiver saw %d requests for %d events (duplicates without failures)", len(hits), n)
	}
	var lastSeq uint64
	for _, h := range hits {
		if !strings.HasPrefix(h.ID, "evt_") {
			t.Fatalf("webhook-id %q is not the event id", h.ID)
		}
		for k, want := range map[string]string{
			"webhook-attempt": "1", "webhook-event-type": "order.created", "X-Team": "payments", "Content-Type": "application/json",
			"X-Webhook-Event-Id": h.ID, "X-Webhook-Delivery-Attempt": "1", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		} {
			if got := h.Header.Get(k); got != want {
				t.Errorf("header %s = %q, want %q", k, got, want)
			}
		}
		if v := h.Header.Get("webhook-replay-of"); v != "" {
			t.Errorf("a forged Whk-Replay-Of reached the receiver as webhook-replay-of %q", v)
		}
		if _, err := time.Parse(time.RFC3339Nano, h.Header.Get("webhook-event-time")); err != nil {
			t.Errorf("webhook-event-time: %v", err)
		}
		if !strings.HasPrefix(h.Header.Get("User-Agent"), "webhook-operator/") {
			t.Errorf("User-Agent = %q", h.Header.Get("User-Agent"))
		}
		seq, _ := strconv.ParseUint(h.Header.Get("webhook-sequence"), 10, 64)
		if seq == 0 {
			t.Errorf("no webhook-sequence")
		}
		_ = lastSeq
		lastSeq = seq
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.logRecords("orders")) == n }, "delivery log has %d records", lazyN(func() int { return len(e.logRecords("orders")) }))
	for _, r := range e.logRecords("orders") {
		if r.State != records.StateSucceeded || r.Response.StatusCode != 200 || r.Attempt != 1 || r.Test || r.ReplayOf != "" ||
			!strings.HasPrefix(r.EventID, "evt_") || r.DeliveryID != records.DeliveryID(r.EventID, e.ns, "orders") {
			t.Fatalf("log record %+v", r)
		}
		if v := r.RequestHeaders["Webhook-Signature"] + r.RequestHeaders["webhook-signature"]; v != "[redacted]" {
			t.Fatalf("signature not redacted in the log: %q", v)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("orders").Status.Health
		return h != nil && h.Delivered == n && h.SuccessRate == "100.0%" && h.CircuitState == v1alpha1.CircuitClosed && h.LastSuccessTime != nil
	}, "status health: %+v", e.get("orders").Status.Health)
	ep := e.get("orders")
	if c := condition(ep, v1alpha1.ConditionDisabled); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Disabled condition: %+v", c)
	}
	if c := condition(ep, v1alpha1.ConditionCircuitOpen); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("CircuitOpen condition: %+v", c)
	}
}

// attemptsOf groups a receiver's hits by webhook-id.
func attemptsOf(rcv *testenv.Receiver) map[string][]testenv.Request {
	out := map[string][]testenv.Request{}
	for _, h := range rcv.Requests() {
		out[h.ID] = append(out[h.ID], h)
	}
	return out
}

// Seed 002's schedule (0s, 30s, 5m, 30m, 2h, 12h, 24h), scaled down 20,000 times: seven
// attempts in order, none before its wait (short ones waited in place, long ones as JetStream
// message schedules), then a dead letter with every attempt and the last response. How late
// each comes is measured by BenchmarkRetryWaits, not asserted.
func TestSeed002ScheduleScaledDownEndsInADeadLetter(t *testing.T) {
	e, rcv, waits := runSeed002(t)
	hits := attemptsOf(rcv)["evt_pay_1"]
	if len(hits) != 7 {
		t.Fatalf("receiver saw %d attempts, want 7", len(hits))
	}
	for i, h := range hits {
		if h.Attempt != i+1 {
			t.Errorf("attempt %d carried webhook-attempt %d", i+1, h.Attempt)
		}
		// Waits are counted from the previous failure: never early.
		if gap := attemptGap(hits, i); gap < waits[i] {
			t.Errorf("attempt %d came %s after attempt %d, before its wait of %s", i+1, gap, i, waits[i])
		}
	}
	dl := e.deadLetters()[0]
	if dl.Reason != records.ReasonExhausted || dl.EventID != "evt_pay_1" || dl.Endpoint != "payments" || dl.EventType != "payment.failed" {
		t.Errorf("dead letter: %+v", dl)
	}
	if len(dl.Attempts) != 7 {
		t.Fatalf("dead letter lists %d attempts, want 7", len(dl.Attempts))
	}
	for i, a := range dl.Attempts {
		if a.N != i+1 || a.StatusCode != 500 || a.Reason != records.FailStatusCode || a.Time.IsZero() {
			t.Errorf("attempt %d in the dead letter: %+v", i+1, a)
		}
	}
	if dl.LastResponse == nil || dl.LastResponse.StatusCode != 500 || len(dl.LastResponse.Body) != records.MaxResponseBody || !dl.LastResponse.Truncated {
		t.Errorf("last response not kept to 2 KB: %+v", dl.LastResponse)
	}
	var states []string
	for _, r := range e.logRecords("payments") {
		states = append(states, r.State)
	}
	if got := strings.Join(states, ","); got != "failed,failed,failed,failed,failed,failed,dead_letter" {
		t.Errorf("delivery log states = %s", got)
	}
}

// runSeed002 delivers one event to a receiver that always fails, with seed 002's schedule
// scaled down 20,000 times, until it is dead-lettered; it returns the waits before each
// attempt.
func runSeed002(tb testing.TB) (*env, *testenv.Receiver, []time.Duration) {
	e := newEnv(tb)
	rcv := newReceiver(tb, func(h testenv.Request) testenv.Response {
		return testenv.Response{Status: 500, Body: "down for maintenance " + strings.Repeat("x", 3000)}
	})
	const scale = 20000
	waits := []time.Duration{0, 30 * time.Second / scale, 5 * time.Minute / scale, 30 * time.Minute / scale, 2 * time.Hour / scale, 12 * time.Hour / scale, 24 * time.Hour / scale}
	var sched []metav1.Duration
	for _, w := range waits {
		sched = append(sched, metav1.Duration{Duration: w})
	}
	ref := e.policy("payments", v1alpha1.RetryPolicySpec{Schedule: sched, CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 0}})
	e.endpoint("payments", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref})
	e.dispatcher("d1")
	e.publish("payment.failed", "evt_pay_1", []byte(`{"amount":100}`))
	testenv.Eventually(tb, 60*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "no dead letter; receiver saw %d attempts", lazyN(func() int { return rcv.Stats().Requests }))
	return e, rcv, waits
}

// attemptGap is how long after attempt i-1 attempt i reached the receiver (0 for the first).
func attemptGap(hits []testenv.Request, i int) time.Duration {
	if i == 0 {
		return 0
	}
	return hits[i].At.Sub(hits[i-1].At)
}

// Seed 001: success only on 200/201/202/204 (a 203 fails), five attempts at ~0/2/4/8/16s
// scaled down 100 times with equal jitter: each wait at least half its step (equal jitter's
// floor), seed 001's headers on each. How far above the step a wait ends is measured by
// BenchmarkRetryWaits.
func TestSeed001SuccessCodesAndFiveAttempts(t *testing.T) {
	rcv, steps := runSeed001(t)
	hits := attemptsOf(rcv)["evt_c1"]
	if len(hits) != 5 {
		t.Fatalf("%d attempts, want 5", len(hits))
	}
	for i := 1; i < 5; i++ {
		if gap := attemptGap(hits, i); gap < steps[i]/2 {
			t.Errorf("wait before attempt %d = %s, below equal jitter's floor %s", i+1, gap, steps[i]/2)
		}
		if hits[i].Attempt != i+1 || hits[i].Header.Get("X-Webhook-Event-Id") != "evt_c1" || hits[i].Header.Get("X-Webhook-Delivery-Attempt") != strconv.Itoa(i+1) {
			t.Errorf("attempt %d, seed 001 headers: %v", i+1, hits[i].Header)
		}
	}
}

// runSeed001 delivers one event to a receiver that answers 203 until it is dead-lettered after
// seed 001's five attempts; it returns each attempt's backoff step (the wait's upper bound).
func runSeed001(tb testing.TB) (*testenv.Receiver, []time.Duration) {
	e := newEnv(tb)
	rcv := newReceiver(tb, func(h testenv.Request) testenv.Response {
		return testenv.Response{Status: 203, Body: "non-authoritative"}
	})
	ref := e.policy("crm", v1alpha1.RetryPolicySpec{
		MaxAttempts: ptr[int32](5),
		Backoff: &v1alpha1.BackoffSpec{Strategy: v1alpha1.BackoffExponential, InitialInterval: &metav1.Duration{Duration: 20 * time.Millisecond},
			Factor: "2", MaxInterval: &metav1.Duration{Duration: 160 * time.Millisecond}, Jitter: v1alpha1.JitterEqual},
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 0}})
	e.endpoint("crm", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref, SuccessStatusCodes: []int32{200, 201, 202, 204}, Timeout: dur(30 * time.Second)})
	e.dispatcher("d1")
	e.publish("contact.updated", "evt_c1", []byte(`{}`))
	testenv.Eventually(tb, 30*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "no dead letter")
	return rcv, []time.Duration{0, 20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 160 * time.Millisecond}
}

// Seed 000: exponential backoff with full jitter; a receiver that recovers gets the event on a
// later attempt, in order, with the same webhook-id, and nothing is dead-lettered. How long
// the waits are against full jitter's bound is measured by BenchmarkRetryWaits.
func TestSeed000FullJitterUntilRecovery(t *testing.T) {
	e, rcv := runSeed000(t)
	for id, hs := range attemptsOf(rcv) {
		if len(hs) != 4 {
			t.Errorf("%s: %d attempts, want 4", id, len(hs))
		}
		for i, h := range hs {
			if h.Attempt != i+1 {
				t.Errorf("%s: attempt %d carried webhook-attempt %d", id, i+1, h.Attempt)
			}
		}
	}
	if n := len(e.deadLetters()); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}

// runSeed000 delivers ten events to a receiver that answers 503 to the first three attempts of
// each, with exponential backoff (20ms, factor 2, full jitter), until all succeeded.
func runSeed000(tb testing.TB) (*env, *testenv.Receiver) {
	e := newEnv(tb)
	rcv := newReceiver(tb, func(h testenv.Request) testenv.Response {
		if h.Attempt < 4 {
			return testenv.Response{Status: 503, Body: "busy"}
		}
		return testenv.Response{Status: 204}
	})
	ref := e.policy("exp", v1alpha1.RetryPolicySpec{
		MaxAttempts: ptr[int32](10),
		Backoff: &v1alpha1.BackoffSpec{Strategy: v1alpha1.BackoffExponential, InitialInterval: &metav1.Duration{Duration: 20 * time.Millisecond},
			Factor: "2", MaxInterval: &metav1.Duration{Duration: time.Second}, Jitter: v1alpha1.JitterFull},
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 0}})
	e.endpoint("audit", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref})
	e.dispatcher("d1")
	for i := range 10 {
		e.publish("order.created", fmt.Sprintf("evt_%d", i), []byte(`{}`))
	}
	testenv.Eventually(tb, 30*time.Second, func() bool {
		n := 0
		for _, r := range e.logRecords("audit") {
			if r.State == records.StateSucceeded {
				n++
			}
		}
		return n == 10
	}, "not all delivered")
	return e, rcv
}

// The documented outcome of each kind of failure: a redirect is not followed, a timeout, a
// refused connection, a 429 with Retry-After, an oversize and a malformed event.
func TestFailureOutcomes(t *testing.T) {
	e := newEnv(t)
	redirectTarget := newReceiver(t, nil)
	redirect := newReceiver(t, func(h testenv.Request) testenv.Response {
		return testenv.Response{Status: 302, Header: http.Header{"Location": []string{redirectTarget.URL()}}}
	})
	slow := newReceiver(t, func(h testenv.Request) testenv.Response {
		time.Sleep(1500 * time.Millisecond)
		return testenv.Response{Status: 200, Body: "late"}
	})
	limited := newReceiver(t, func(h testenv.Request) testenv.Response {
		if h.Attempt == 1 {
			return testenv.Response{Status: 429, Header: http.Header{"Retry-After": []string{"1"}}, Body: "slow down"}
		}
		return testenv.Response{Status: 200}
	})
	closed := newReceiver(t, nil)
	closedURL := closed.URL()
	closed.Close()

	once := &v1alpha1.RetryPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "once"}, Spec: v1alpha1.RetryPolicySpec{
		Schedule: []metav1.Duration{{}}, CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 0}}}
	twice := &v1alpha1.RetryPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "twice"}, Spec: v1alpha1.RetryPolicySpec{
		Schedule: []metav1.Duration{{}, {Duration: 10 * time.Millisecond}}, RetryAfter: &v1alpha1.RetryAfterSpec{Honor: true, MaxDelay: &metav1.Duration{Duration: time.Minute}},
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 0}}}
	for _, rp := range []*v1alpha1.RetryPolicy{once, twice} {
		if err := e.k8s.Create(context.Background(), rp); err != nil {
			t.Fatal(err)
		}
	}
	ref := func(n string) *v1alpha1.LocalObjectReference { return &v1alpha1.LocalObjectReference{Name: n} }
	e.endpoint("redirect", v1alpha1.WebhookEndpointSpec{URL: redirect.URL(), EventTypes: []v1alpha1.EventTypePattern{"redirect"}, RetryPolicyRef: ref("once")})
	e.endpoint("slow", v1alpha1.WebhookEndpointSpec{URL: slow.URL(), EventTypes: []v1alpha1.EventTypePattern{"slow"}, RetryPolicyRef: ref("once"), Timeout: dur(time.Second)})
	e.endpoint("closed", v1alpha1.WebhookEndpointSpec{URL: closedURL, EventTypes: []v1alpha1.EventTypePattern{"closed"}, RetryPolicyRef: ref("once")})
	e.endpoint("limited", v1alpha1.WebhookEndpointSpec{URL: limited.URL(), EventTypes: []v1alpha1.EventTypePattern{"limited"}, RetryPolicyRef: ref("twice")})
	e.endpoint("sizes", v1alpha1.WebhookEndpointSpec{URL: redirectTarget.URL(), EventTypes: []v1alpha1.EventTypePattern{"size.*"}, RetryPolicyRef: ref("once")})
	e.dispatcher("d1")

	e.publish("redirect", "evt_redirect", []byte(`{}`))
	e.publish("slow", "evt_slow", []byte(`{}`))
	e.publish("closed", "evt_closed", []byte(`{}`))
	e.publish("limited", "evt_limited", []byte(`{}`))
	e.publish("size.big", "evt_big", bytes.Repeat([]byte("x"), 65<<10))
	e.publish("size.bad", "evt bad id", []byte(`{}`))

	testenv.Eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 5 }, "want 5 dead letters, have %d", lazyN(func() int { return len(e.deadLetters()) }))
	byEvent := map[string]records.DeadLetter{}
	for _, dl := range e.deadLetters() {
		byEvent[dl.EventID] = dl
	}
	check := func(id, reason, attemptReason string) {
		t.Helper()
		dl, ok := byEvent[id]
		if !ok {
			t.Errorf("%s: no dead letter", id)
			return
		}
		if dl.Reason != reason {
			t.Errorf("%s: reason %q, want %q (%s)", id, dl.Reason, reason, dl.Message)
		}
		if attemptReason != "" && (len(dl.Attempts) != 1 || dl.Attempts[0].Reason != attemptReason) {
			t.Errorf("%s: attempts %+v, want one failing with %s", id, dl.Attempts, attemptReason)
		}
	}
	check("evt_redirect", records.ReasonExhausted, records.FailRedirect)
	check("evt_slow", records.ReasonExhausted, records.FailTimeout)
	check("evt_closed", records.ReasonExhausted, records.FailConnRefused)
	check("evt_big", records.ReasonPayloadTooLarge, "")
	check("evt bad id", records.ReasonInvalidEvent, "")
	if redirectTarget.Stats().Requests != 0 {
		t.Errorf("the redirect was followed")
	}
	if dl := byEvent["evt_big"]; dl.DeliveryID == "" {
		t.Errorf("oversize dead letter without id")
	}
	// 429 with Retry-After: 1 — the second attempt waits at least a second, then succeeds.
	testenv.Eventually(t, 10*time.Second, func() bool { return len(attemptsOf(limited)["evt_limited"]) == 2 }, "429 not retried")
	hs := attemptsOf(limited)["evt_limited"]
	if gap := hs[1].At.Sub(hs[0].At); gap < time.Second {
		t.Errorf("Retry-After: 1 not honoured: retried after %s", gap)
	}
}

// An endpoint created while the dispatcher runs gets every event published from its creation
// on, also those published before the dispatcher's informer reported it: its consumer, made
// with it, holds them; each is delivered once. (Its consumer starts at its creation time,
// which the API server keeps to the second: events of that second from before the creation
// may be delivered too, never fewer.)
func TestNewEndpointGetsEventsPublishedBeforeItWasLoaded(t *testing.T) {
	e := newEnv(t)
	first := newReceiver(t, nil)
	e.endpoint("first", v1alpha1.WebhookEndpointSpec{URL: first.URL()})
	e.dispatcher("d1")
	e.publish("a", "evt_warmup", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return first.Stats().Requests == 1 }, "warm-up not delivered")

	late := newReceiver(t, nil)
	spec := v1alpha1.WebhookEndpointSpec{URL: late.URL(), EventTypes: []v1alpha1.EventTypePattern{">"}}
	e.endpoint("late", spec)
	// Published at once: the dispatcher does not know the endpoint yet (its informer reports
	// it a moment later), but its consumer exists.
	for i := range 20 {
		e.publish("a", fmt.Sprintf("evt_early_%d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(first.RequestsByID()) == 21 }, "first did not get the early events")
	for i := range 20 {
		e.publish("a", fmt.Sprintf("evt_after_%d", i), []byte(`{}`))
	}
	got := func() int {
		n := 0
		for id := range late.RequestsByID() {
			if strings.HasPrefix(id, "evt_early_") || strings.HasPrefix(id, "evt_after_") {
				n++
			}
		}
		return n
	}
	testenv.Eventually(t, 15*time.Second, func() bool { return got() == 40 }, "the new endpoint got %d of 40 events", lazyN(got))
	for id, n := range late.RequestsByID() {
		if n != 1 {
			t.Errorf("%s delivered %d times: backfill and live routing both delivered", id, n)
		}
	}
}

// An event that fits the events stream but whose delivery (payload and the operator's
// headers) does not fit the server's maximum payload is delivered straight from the events
// stream; when its endpoint must hold it (here: suspended) it is dead-lettered once as
// payload_too_large, with a payload cut to fit, and never retried forever. The small event is
// held and delivered on resuming.
func TestOversizedDeliveryIsDeadLetteredOnce(t *testing.T) {
	e := newEnv(t)
	e.cfg.MaxEventBytes = 64 << 20 // the server's limit (8 MiB in tests) is what binds
	rcv := newReceiver(t, nil)
	e.endpoint("big", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Suspend: true})
	e.dispatcher("d1")
	// The test's own connection (the JetStream account's, 8 MiB) stores an event larger than
	// a tenant connection, the dispatcher's, may publish (and larger than one of its pulls may
	// bring): it is pulled alone and dead-lettered, and does not block the consumer.
	max := e.nc.MaxPayload()
	// Room for the event's own message id header, not for the delivery's.
	e.publish("a", "evt_big", bytes.Repeat([]byte("x"), int(max)-200))
	e.publish("a", "evt_small", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 1 && eventsPending(e, "big") == 0 },
		"want one dead letter and nothing pending on the events stream, have %d%s", lazyN(func() int { return len(e.deadLetters()) }), lazy(e.dump))
	dl := e.deadLetters()[0]
	if dl.EventID != "evt_big" || dl.Reason != records.ReasonPayloadTooLarge || !dl.PayloadTruncated || dl.DeliveryID == "" {
		t.Errorf("dead letter: %+v", dl)
	}
	e.updateSpec("big", func(s *v1alpha1.WebhookEndpointSpec) { s.Suspend = false })
	testenv.Eventually(t, 20*time.Second, func() bool { return rcv.Stats().Requests == 1 }, "the small event was not delivered after resuming%s", lazy(e.dump))
}

// Every string a receiver supplies is bounded before it is stored: a 1.5 MB Location header
// ends up cut in the delivery log, the dead letter and the status.
func TestHugeReceiverStringsAreBounded(t *testing.T) {
	e := newEnv(t)
	// Within the response headers the dispatcher reads (TestHugeResponseHeadersFailTheAttempt).
	huge := "https://elsewhere.example.com/" + strings.Repeat("a", 48<<10)
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		return testenv.Response{Status: 302, Header: http.Header{"Location": []string{huge}}, Body: strings.Repeat("b", 1<<20)}
	})
	ref := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	e.endpoint("moved", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref})
	e.dispatcher("d1")
	e.publish("a", "evt_1", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 1 && len(e.logRecords("moved")) == 1 }, "no dead letter and log record%s", lazy(e.dump))
	dl := e.deadLetters()[0]
	if b, _ := json.Marshal(dl); len(b) > 16<<10 {
		t.Errorf("the dead letter record is %d bytes", len(b))
	}
	for _, r := range e.logRecords("moved") {
		if b, _ := json.Marshal(r); len(b) > 16<<10 {
			t.Errorf("the log record is %d bytes", len(b))
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("moved").Status.Health
		return h != nil && h.LastFailure != nil
	}, "no last failure in the status")
	if m := e.get("moved").Status.Health.LastFailure.Message; len(m) > 1024 {
		t.Errorf("the status' last failure is %d bytes", len(m))
	}
}

// A receiver answering with response headers larger than the dispatcher reads
// (records.MaxResponseHeaderBytes, 64 KiB; Go's default is 10 MiB) fails the attempt as
// response_headers_too_large: retried like any failure, then dead-lettered as exhausted with
// that reason on every attempt. Headers well within the bound are read as before.
func TestHugeResponseHeadersFailTheAttempt(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		size := 16 << 10
		if h.ID == "evt_huge" {
			size = records.MaxResponseHeaderBytes + 1<<10
		}
		return testenv.Response{Status: 200, Header: http.Header{"X-Padding": []string{strings.Repeat("p", size)}}}
	})
	ref := e.policy("thrice", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 10 * time.Millisecond}, {Duration: 10 * time.Millisecond}},
		CircuitBreaker: noCircuit()})
	e.endpoint("headers", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref})
	e.dispatcher("d1")
	e.publish("a", "evt_ok", []byte(`{}`))
	e.publish("a", "evt_huge", []byte(`{}`))

	testenv.Eventually(t, 30*time.Second, func() bool { return len(e.deadLetters()) == 1 && len(e.logRecords("headers")) == 4 },
		"want a dead letter and 4 log records, have %d and %d%s", lazyN(func() int { return len(e.deadLetters()) }),
		lazyN(func() int { return len(e.logRecords("headers")) }), lazy(e.dump))
	dl := e.deadLetters()[0]
	if dl.EventID != "evt_huge" || dl.Reason != records.ReasonExhausted || len(dl.Attempts) != 3 || !strings.Contains(dl.Message, records.FailResponseHeaders) {
		t.Fatalf("dead letter: %+v", dl)
	}
	for _, a := range dl.Attempts {
		if a.Reason != records.FailResponseHeaders || a.StatusCode != 0 {
			t.Errorf("attempt %d in the dead letter: %+v, want %s without a status", a.N, a, records.FailResponseHeaders)
		}
	}
	if n := len(attemptsOf(rcv)["evt_huge"]); n != 3 {
		t.Errorf("the receiver got %d attempts of evt_huge, want 3", n)
	}
	states := map[string][]string{}
	for _, r := range e.logRecords("headers") {
		states[r.EventID] = append(states[r.EventID], r.State+"/"+r.Reason)
	}
	want := map[string][]string{
		"evt_ok":   {records.StateSucceeded + "/"},
		"evt_huge": {"failed/" + records.FailResponseHeaders, "failed/" + records.FailResponseHeaders, records.StateDeadLetter + "/" + records.FailResponseHeaders},
	}
	if fmt.Sprint(states) != fmt.Sprint(want) {
		t.Errorf("delivery log: %v, want %v", states, want)
	}
}

// A token in the endpoint's URL query never reaches a stored error: the delivery log, dead
// letters and the status show the URL without it.
func TestURLQueryTokensAreRedactedInStoredErrors(t *testing.T) {
	e := newEnv(t)
	closed := newReceiver(t, nil)
	url := closed.URL() + "?token=s3cr3t-t0k3n"
	closed.Close()
	ref := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	e.endpoint("tokened", v1alpha1.WebhookEndpointSpec{URL: url, RetryPolicyRef: ref})
	e.dispatcher("d1")
	e.publish("a", "evt_1", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "no dead letter")
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("tokened").Status.Health
		return h != nil && h.LastFailure != nil
	}, "no last failure in the status")
	status, _ := json.Marshal(e.get("tokened").Status.Health)
	logs, _ := json.Marshal(e.logRecords("tokened"))
	dls, _ := json.Marshal(e.deadLetters())
	for what, text := range map[string]string{"status": string(status), "delivery log": string(logs), "dead letter": string(dls)} {
		if strings.Contains(text, "s3cr3t-t0k3n") {
			t.Errorf("the %s holds the URL's token: %s", what, text)
		}
	}
}

// Producer values Go's HTTP client refuses to send are found at routing time: the event is
// dead-lettered as invalid_event, the receiver sees nothing and its health counts nothing.
func TestUnsendableProducerValuesAreInvalidEvents(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	ref := e.policy("three", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {}, {}}, CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 2}})
	e.endpoint("strict", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref})
	e.dispatcher("d1")
	e.publish("a", "evt_ct", []byte(`{}`), "Content-Type", "application/json\x01")
	e.publish("a", "evt_trace", []byte(`{}`), "traceparent", "00-\x7f")
	e.publish("a", "evt_ok", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 2 && rcv.Stats().Requests == 1 },
		"want 2 dead letters and 1 delivery, have %d and %d", lazyN(func() int { return len(e.deadLetters()) }), lazyN(func() int { return rcv.Stats().Requests }))
	for _, dl := range e.deadLetters() {
		if dl.Reason != records.ReasonInvalidEvent || len(dl.Attempts) != 0 {
			t.Errorf("dead letter of %s: reason %s after %d attempts (%s)", dl.EventID, dl.Reason, len(dl.Attempts), dl.Message)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("strict").Status.Health
		return h != nil && h.Delivered == 1
	}, "status: %v", lazy(func() string { return fmt.Sprint(e.get("strict").Status.Health) }))
	h := e.get("strict").Status.Health
	if h.Failures != 0 || h.ConsecutiveFailures != 0 || h.CircuitState != v1alpha1.CircuitClosed {
		t.Errorf("the producer's bad values counted against the receiver: %+v", h)
	}
}

// eventsPending is how many events an endpoint's consumer on the events stream has not
// settled: its own, or on the shared lane its namespace's intake.
func eventsPending(e *env, ep string) int {
	ci, err := e.js.Consumer(context.Background(), e.set.EventsStream(), e.set.EndpointConsumer(ep))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		ci, err = e.js.Consumer(context.Background(), e.set.EventsStream(), streams.IntakeConsumer(e.ns))
	}
	if err != nil {
		return -1
	}
	info, err := ci.Info(context.Background())
	if err != nil {
		return -1
	}
	return int(info.NumPending) + info.NumAckPending
}
