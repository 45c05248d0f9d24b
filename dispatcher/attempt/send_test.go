package attempt_test

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/dispatcher/attempt"
	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// What one attempt comes to, for what a real receiver on loopback answers: a success, a
// redirect (never followed), a busy receiver's Retry-After, an answer larger than what is
// kept, a receiver slower than the endpoint's timeout, and an address the guard refuses.
func TestSendComesToAnOutcomeForWhateverTheReceiverAnswers(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	srv := testenv.StartReceiver(t, testenv.ReceiverOptions{Respond: func(r testenv.Request) testenv.Response {
		switch r.Path {
		case "/redirect":
			return testenv.Response{Status: http.StatusFound, Header: http.Header{"Location": {"http://127.0.0.1:1/elsewhere"}}}
		case "/busy":
			return testenv.Response{Status: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {"7"}}}
		case "/huge":
			return testenv.Response{Status: http.StatusBadRequest, Body: huge}
		case "/slow":
			return testenv.Response{Delay: 2 * time.Second}
		}
		return testenv.Response{Status: http.StatusNoContent}
	}})
	guard := netguard.Policy{AllowHTTP: true, Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	client := attempt.NewClient(attempt.NewTransport(guard, nil, 4, nil))
	meta := records.DeliveryMeta{DeliveryID: "whdl_0123456789abcdefghjkmnpqrs", EventID: "evt_1", EventType: "order.created", Namespace: "ns", Endpoint: "ep"}
	ok2xx := func(c int) bool { return c/100 == 2 }
	for _, tc := range []struct {
		name, path string
		timeout    time.Duration
		blocked    error
		check      func(t *testing.T, o decide.Outcome)
	}{
		{name: "success", path: "/ok", check: func(t *testing.T, o decide.Outcome) {
			if !o.Success || o.StatusCode != http.StatusNoContent || o.Reason != "" {
				t.Fatalf("%+v", o)
			}
			if o.Sent[records.SendID] == "" || o.Sent[records.SendAttempt] != "1" || o.Sent[records.SendEventType] != "order.created" {
				t.Fatalf("headers sent: %v", o.Sent)
			}
		}},
		{name: "a redirect is a failure, not followed", path: "/redirect", check: func(t *testing.T, o decide.Outcome) {
			if o.Success || o.StatusCode != http.StatusFound || o.Reason != records.FailRedirect || !strings.Contains(o.Err, "/elsewhere") {
				t.Fatalf("%+v", o)
			}
		}},
		{name: "a busy receiver's Retry-After is kept", path: "/busy", check: func(t *testing.T, o decide.Outcome) {
			if o.Success || o.Reason != records.FailStatusCode || o.RetryAfter != 7*time.Second {
				t.Fatalf("%+v", o)
			}
		}},
		{name: "a huge answer is cut to what is kept", path: "/huge", check: func(t *testing.T, o decide.Outcome) {
			if o.Success || o.StatusCode != http.StatusBadRequest || !o.Truncated || len(o.Body) > records.MaxResponseBody {
				t.Fatalf("status %d, truncated %v, body of %d bytes", o.StatusCode, o.Truncated, len(o.Body))
			}
		}},
		{name: "a receiver slower than the timeout", path: "/slow", timeout: 200 * time.Millisecond, check: func(t *testing.T, o decide.Outcome) {
			if o.Success || o.Reason != records.FailTimeout || o.Latency > 2*time.Second {
				t.Fatalf("%+v", o)
			}
		}},
		{name: "a blocked address is not dialled", path: "/ok", blocked: errors.New("blocked for the test"), check: func(t *testing.T, o decide.Outcome) {
			if o.Success || o.Reason != records.FailBlockedAddress || o.StatusCode != 0 {
				t.Fatalf("%+v", o)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 5 * time.Second
			}
			ep := &endpoint.Config{Namespace: "ns", Name: "ep", URL: srv.URLWithPath(tc.path), Timeout: timeout, MaxInFlight: 4,
				SuccessCode: ok2xx, URLBlocked: tc.blocked}
			o := attempt.Send(context.Background(), client, ep, &attempt.Request{Meta: meta, Attempt: 1, Body: []byte(`{}`)}, time.Now())
			tc.check(t, o)
		})
	}
}
