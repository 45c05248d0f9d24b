package dispatcher_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// An event that fits the events stream but whose delivery (payload and the operator's
// headers) does not fit the server's maximum payload is dead-lettered as payload_too_large,
// with a payload cut to fit; the router does not retry it forever.
func TestOversizedDeliveryIsDeadLetteredOnce(t *testing.T) {
	e := newEnv(t)
	e.cfg.MaxEventBytes = 64 << 20 // the server's limit (8 MiB in tests) is what binds
	rcv := newReceiver(t, nil)
	e.endpoint("big", v1alpha1.WebhookEndpointSpec{URL: rcv.URL()})
	e.dispatcher("d1")
	max := e.nc.MaxPayload()
	// Room for the event's own message id header, not for the delivery's.
	e.publish("a", "evt_big", bytes.Repeat([]byte("x"), int(max)-200))
	e.publish("a", "evt_small", []byte(`{}`))
	eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 1 && rcv.count() == 1 },
		"want one dead letter and one delivery, have %d and %d%s", lazyN(func() int { return len(e.deadLetters()) }), lazyN(rcv.count), lazy(e.dump))
	dl := e.deadLetters()[0]
	if dl.EventID != "evt_big" || dl.Reason != records.ReasonPayloadTooLarge || !dl.PayloadTruncated || dl.DeliveryID == "" {
		t.Errorf("dead letter: %+v", dl)
	}
	eventually(t, 10*time.Second, func() bool { return routerPending(e) == 0 }, "the router still holds the event%s", lazy(e.dump))
}

// Every string a receiver supplies is bounded before it is stored: a 1.5 MB Location header
// ends up cut in the delivery log, the dead letter and the status.
func TestHugeReceiverStringsAreBounded(t *testing.T) {
	e := newEnv(t)
	huge := "https://elsewhere.example.com/" + strings.Repeat("a", 1500<<10)
	rcv := newReceiver(t, func(h hit) (int, http.Header, string) {
		return 302, http.Header{"Location": []string{huge}}, strings.Repeat("b", 1<<20)
	})
	ref := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	e.endpoint("moved", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref})
	e.dispatcher("d1")
	e.publish("a", "evt_1", []byte(`{}`))
	eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 1 && len(e.logRecords("moved")) == 1 }, "no dead letter and log record%s", lazy(e.dump))
	dl := e.deadLetters()[0]
	if b, _ := json.Marshal(dl); len(b) > 16<<10 {
		t.Errorf("the dead letter record is %d bytes", len(b))
	}
	for _, r := range e.logRecords("moved") {
		if b, _ := json.Marshal(r); len(b) > 16<<10 {
			t.Errorf("the log record is %d bytes", len(b))
		}
	}
	eventually(t, 10*time.Second, func() bool {
		h := e.get("moved").Status.Health
		return h != nil && h.LastFailure != nil
	}, "no last failure in the status")
	if m := e.get("moved").Status.Health.LastFailure.Message; len(m) > 1024 {
		t.Errorf("the status' last failure is %d bytes", len(m))
	}
}

// A token in the endpoint's URL query never reaches a stored error: the delivery log, dead
// letters and the status show the URL without it.
func TestURLQueryTokensAreRedactedInStoredErrors(t *testing.T) {
	e := newEnv(t)
	closed := newReceiver(t, nil)
	url := closed.URL() + "?token=s3cr3t-t0k3n"
	closed.srv.Close()
	ref := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	e.endpoint("tokened", v1alpha1.WebhookEndpointSpec{URL: url, RetryPolicyRef: ref})
	e.dispatcher("d1")
	e.publish("a", "evt_1", []byte(`{}`))
	eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "no dead letter")
	eventually(t, 10*time.Second, func() bool {
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
	eventually(t, 20*time.Second, func() bool { return len(e.deadLetters()) == 2 && rcv.count() == 1 },
		"want 2 dead letters and 1 delivery, have %d and %d", lazyN(func() int { return len(e.deadLetters()) }), lazyN(rcv.count))
	for _, dl := range e.deadLetters() {
		if dl.Reason != records.ReasonInvalidEvent || len(dl.Attempts) != 0 {
			t.Errorf("dead letter of %s: reason %s after %d attempts (%s)", dl.EventID, dl.Reason, len(dl.Attempts), dl.Message)
		}
	}
	eventually(t, 10*time.Second, func() bool {
		h := e.get("strict").Status.Health
		return h != nil && h.Delivered == 1
	}, "status: %v", lazy(func() string { return fmt.Sprint(e.get("strict").Status.Health) }))
	h := e.get("strict").Status.Health
	if h.Failures != 0 || h.ConsecutiveFailures != 0 || h.CircuitState != v1alpha1.CircuitClosed {
		t.Errorf("the producer's bad values counted against the receiver: %+v", h)
	}
}

// A producer cannot forge the operator's headers: a Whk-Replay-Of or Whk-Attempts set on the
// event never reaches the delivery.
func TestForgedOperatorHeadersAreStripped(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	e.endpoint("plain", v1alpha1.WebhookEndpointSpec{URL: rcv.URL()})
	e.dispatcher("d1")
	e.publish("a", "evt_1", []byte(`{}`), "Whk-Replay-Of", "whdl_forged", "Whk-Attempts", "5", "X-Tenant", "acme")
	eventually(t, 10*time.Second, func() bool { return rcv.count() == 1 }, "not delivered")
	h := rcv.all()[0].Header
	if h.Get("webhook-replay-of") != "" || h.Get("webhook-attempt") != "1" {
		t.Errorf("forged operator headers reached the receiver: replay-of %q, attempt %q", h.Get("webhook-replay-of"), h.Get("webhook-attempt"))
	}
}

// routerPending is how many events the namespace's router has not settled.
func routerPending(e *env) int {
	ci, err := e.js.Consumer(context.Background(), e.set.EventsStream(), streams.RouterConsumer(e.ns, ""))
	if err != nil {
		return -1
	}
	info, err := ci.Info(context.Background())
	if err != nil {
		return -1
	}
	return int(info.NumPending) + info.NumAckPending
}
