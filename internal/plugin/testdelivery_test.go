package plugin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// answering is a receiver's Responder that answers every request with status.
func answering(status int) testenv.Responder {
	return func(testenv.Request) testenv.Response { return testenv.Response{Status: status} }
}

// wiredEndpoint creates an endpoint at url with what the controller would create for it (the
// signing Secret, the namespace's shared-lane consumers and the endpoint's place on it).
func (e *env) wiredEndpoint(name, url string, mutate func(*v1alpha1.WebhookEndpointSpec)) {
	e.t.Helper()
	ctx := context.Background()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name + "-signing", Annotations: map[string]string{consent.AllowedEndpoints: name}},
		StringData: map[string]string{"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}
	if err := cp.Client.Create(ctx, s); err != nil {
		e.t.Fatal(err)
	}
	ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: v1alpha1.WebhookEndpointSpec{URL: url, EventTypes: []v1alpha1.EventTypePattern{"order.*"}}}
	if mutate != nil {
		mutate(&ep.Spec)
	}
	if err := cp.Client.Create(ctx, ep); err != nil {
		e.t.Fatal(err)
	}
	if err := e.cfg.For(e.ns).EnsureSharedLane(ctx, e.js, ep.CreationTimestamp.Time); err != nil {
		e.t.Fatal(err)
	}
	e.setStatus(name, func(ep *v1alpha1.WebhookEndpoint) {
		ep.Status.Lane, ep.Status.SharedSince = streams.LaneShared.String(), &ep.CreationTimestamp
	})
}

// runDispatcher runs the namespace's dispatcher in this process until the test ends.
func (e *env) runDispatcher() {
	e.t.Helper()
	ctrllog.SetLogger(logr.Discard())
	cfg := opconfig.Default()
	cfg.NATS.URL = e.nats.URL()
	cfg.Streams = e.cfg
	cfg.AllowHTTP = true
	cfg.AllowedCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	set := e.cfg.For(e.ns)
	rc := set.RouterConsumerConfig(e.ns, "", time.Now())
	if _, err := e.js.CreateOrUpdateConsumer(context.Background(), set.EventsStream(), rc); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- dispatcher.Run(ctx, dispatcher.Options{Namespace: e.ns, Config: cfg, Identity: "d1", RestConfig: cp.Config,
			StatusInterval: 200 * time.Millisecond, HealthFlushInterval: 100 * time.Millisecond, LeaseTTL: 3 * time.Second,
			ShutdownGrace: 5 * time.Second, Registry: prometheus.NewRegistry(), Logger: logr.Discard()})
	}()
	e.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("dispatcher: %v", err)
			}
		case <-time.After(30 * time.Second):
			e.t.Error("the dispatcher did not stop")
		}
	})
}

// Seed 002's one-shot test delivery: `kubectl webhooks test` reaches the one endpoint named
// (not another whose event types match), is signed and reported like any delivery, and a
// failing one is dead-lettered as test_failed after its single attempt. Disabled and
// suspended endpoints refuse it.
func TestTestDeliveryIsOneShotAndReportedLikeAnyDelivery(t *testing.T) {
	e := newEnv(t)
	good := testenv.StartReceiver(t, testenv.ReceiverOptions{Respond: answering(http.StatusOK)})
	bad := testenv.StartReceiver(t, testenv.ReceiverOptions{Respond: answering(http.StatusServiceUnavailable)})
	bystander := testenv.StartReceiver(t, testenv.ReceiverOptions{Respond: answering(http.StatusOK)})
	e.wiredEndpoint("good", good.URL(), nil)
	e.wiredEndpoint("bad", bad.URL(), nil) // the built-in policy: 7 attempts over 38h
	e.wiredEndpoint("bystander", bystander.URL(), nil)
	e.wiredEndpoint("off", good.URLWithPath("/off"), nil)
	e.wiredEndpoint("held", good.URLWithPath("/held"), func(s *v1alpha1.WebhookEndpointSpec) { s.Suspend = true })
	e.disable("off", time.Now().Add(-time.Minute))

	if r := e.run("test", "off"); r.code != plugin.ExitRefused || !strings.Contains(r.errOut, "disabled") {
		t.Errorf("a test delivery to a disabled endpoint: %s", r)
	}
	if r := e.run("test", "held"); r.code != plugin.ExitRefused || !strings.Contains(r.errOut, "suspended") {
		t.Errorf("a test delivery to a suspended endpoint: %s", r)
	}
	if r := e.run("test", "missing"); r.code != plugin.ExitNotFound {
		t.Errorf("a test delivery to a missing endpoint: %s", r)
	}
	if r := e.run("test", "good", "--data", "{not json"); r.code != plugin.ExitUsage {
		t.Errorf("invalid --data: %s", r)
	}
	e.runDispatcher()

	r := e.run("test", "good", "--type", "order.created", "--data", `{"order_id":"ord_test"}`, "--wait").must(t, 0)
	if !strings.Contains(r.out, "sent test delivery whdl_") || !strings.Contains(r.out, "succeeded: HTTP 200 in ") {
		t.Errorf("output:\n%s", r.out)
	}
	reqs := good.Requests()
	if len(reqs) != 1 || string(reqs[0].Body) != `{"order_id":"ord_test"}` {
		t.Fatalf("the endpoint got %d requests %+v, want the test delivery once", len(reqs), reqs)
	}
	h := reqs[0].Header
	if h.Get("webhook-event-type") != "order.created" || !strings.HasPrefix(h.Get("webhook-id"), "evt_") || h.Get("webhook-signature") == "" ||
		h.Get("webhook-attempt") != "1" || h.Get("webhook-sequence") != "" || h.Get("Whk-Test") != "" {
		t.Errorf("test delivery headers: %v", h)
	}

	var res plugin.TestResult
	r = e.run("test", "bad", "--wait", "-o", "json")
	if r.code != plugin.ExitError {
		t.Fatalf("a failed test delivery: want exit %d, got %s", plugin.ExitError, r)
	}
	r.decode(t, &res)
	if o := res.Outcome; o == nil || o.State != records.StateDeadLetter || o.DeadLetterReason != records.ReasonTestFailed ||
		o.Response.StatusCode != http.StatusServiceUnavailable || !o.Test || o.Attempt != 1 {
		t.Errorf("outcome of the failed test delivery: %+v", res.Outcome)
	}
	// Reported like any delivery: the dead letter, the delivery log, the health.
	var dls struct {
		Data []records.DeadLetter `json:"data"`
	}
	e.run("dlq", "list", "bad", "-o", "json").must(t, 0).decode(t, &dls)
	if len(dls.Data) != 1 || dls.Data[0].DeliveryID != res.DeliveryID || dls.Data[0].Reason != records.ReasonTestFailed || len(dls.Data[0].Attempts) != 1 {
		t.Errorf("dead letters of bad: %+v", dls.Data)
	}
	var page struct {
		Data []plugin.LogEntry `json:"data"`
	}
	e.run("log", "bad", "-o", "json").must(t, 0).decode(t, &page)
	if len(page.Data) != 1 || page.Data[0].ID != res.DeliveryID || page.Data[0].Status != records.StateDeadLetter || !page.Data[0].Test {
		t.Errorf("delivery log of bad: %+v", page.Data)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		var ep v1alpha1.WebhookEndpoint
		if err := cp.Client.Get(context.Background(), keyOf(e.ns, "bad"), &ep); err != nil {
			return testenv.Stop(err)
		}
		if hl := ep.Status.Health; hl == nil || hl.Attempts != 1 || hl.Failures != 1 || hl.DeadLettered != 1 {
			return fmt.Errorf("health %+v", hl)
		}
		return nil
	}, "bad's health to report the failed test delivery")
	if reqs := bad.Requests(); len(reqs) != 1 {
		t.Errorf("the failing endpoint got %d attempts, want 1 (never retried)", len(reqs))
	}
	if reqs := bystander.Requests(); len(reqs) != 0 {
		t.Errorf("another endpoint of the namespace got %d test deliveries", len(reqs))
	}
}
