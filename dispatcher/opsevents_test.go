package dispatcher_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// opsEvents reads the operational events published in the namespace's events stream.
func (e *env) opsEvents() []records.OpsEvent {
	e.t.Helper()
	return readAll(e.t, e.js, e.set.EventsStream(), e.set.EventSubject(records.OpsTypePrefix+".>"), func(m jetstream.Msg) (records.OpsEvent, bool) {
		var ev records.OpsEvent
		return ev, json.Unmarshal(m.Data(), &ev) == nil && m.Headers().Get(records.HeaderMsgID) == ev.ID
	})
}

// received are the operational events a receiver got, checked against their request headers.
func received(t *testing.T, r *testenv.Receiver) []records.OpsEvent {
	t.Helper()
	var out []records.OpsEvent
	for _, h := range r.Requests() {
		var ev records.OpsEvent
		if err := json.Unmarshal(h.Body, &ev); err != nil || !records.IsOpsType(ev.Type) {
			continue
		}
		if h.ID != ev.ID || h.Header.Get("webhook-event-type") != ev.Type {
			t.Errorf("event %s (%s) came with webhook-id %q and webhook-event-type %q", ev.ID, ev.Type, h.ID, h.Header.Get("webhook-event-type"))
		}
		out = append(out, ev)
	}
	return out
}

func find(evs []records.OpsEvent, typ, ep string) []records.OpsEvent {
	var out []records.OpsEvent
	for _, ev := range evs {
		if ev.Type == typ && ev.Endpoint == ep {
			out = append(out, ev)
		}
	}
	return out
}

func describeEvents(evs func() []records.OpsEvent) lazy {
	return func() string {
		s := ""
		for _, ev := range evs() {
			s += fmt.Sprintf("\n  %s %s %v", ev.Type, ev.Endpoint, ev.Data)
		}
		return s
	}
}

// An endpoint disabled by its failure rate is announced with seed 002's fields, as an ordinary
// event, to a second endpoint that subscribes to webhook_operator.>; its dead letters are
// announced too, aggregated: every one counted, a few events, not one per dead letter. A
// catch-all endpoint (>) receives none of them.
func TestOperationalEventsReachASubscribedEndpoint(t *testing.T) {
	e := newEnv(t)
	down := newReceiver(t, func(testenv.Request) testenv.Response {
		return testenv.Response{Status: http.StatusServiceUnavailable, Body: "down"}
	})
	alerts := newReceiver(t, nil)
	everything := newReceiver(t, nil)
	rate := e.policy("rate", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit(),
		AutoDisable: &v1alpha1.AutoDisableSpec{FailureRatePercent: ptr(int32(95)), Window: dur(72 * time.Hour), MinAttempts: ptr(int32(20))}})
	e.endpoint("crm", v1alpha1.WebhookEndpointSpec{URL: down.URL(), EventTypes: []v1alpha1.EventTypePattern{"contact.*"}, RetryPolicyRef: rate})
	alerts.Trust(e.endpoint("alerts", v1alpha1.WebhookEndpointSpec{URL: alerts.URL(), EventTypes: []v1alpha1.EventTypePattern{"webhook_operator.>"}}))
	e.endpoint("everything", v1alpha1.WebhookEndpointSpec{URL: everything.URL(), EventTypes: []v1alpha1.EventTypePattern{">"}})
	e.dispatcher("d1", func(o *dispatcher.Options) {
		o.DeadLetterNewsWindow, o.OpsSweepInterval = 2*time.Second, 200*time.Millisecond
	})

	for i := range 20 {
		e.publish("contact.updated", fmt.Sprintf("evt_%02d", i), []byte(`{}`))
	}
	got := func() []records.OpsEvent { return received(t, alerts) }
	testenv.Eventually(t, 30*time.Second, func() bool { return len(find(got(), records.OpsEndpointDisabled, "crm")) > 0 }, "no endpoint.disabled event at alerts; got%s", describeEvents(got))
	dis := find(got(), records.OpsEndpointDisabled, "crm")
	if len(dis) != 1 {
		t.Fatalf("%d endpoint.disabled events, want 1", len(dis))
	}
	ev := dis[0]
	if ev.Namespace != e.ns || ev.Source != "webhook-operator/"+e.ns+"/crm" || ev.SpecVersion != "1.0" || ev.Time.IsZero() {
		t.Errorf("event envelope %+v", ev)
	}
	for k, want := range map[string]any{"reason": "failure_rate", "windowHours": 72.0, "total": 20.0, "failures": 20.0} {
		if ev.Data[k] != want {
			t.Errorf("data.%s = %v, want %v (data %v)", k, ev.Data[k], want, ev.Data)
		}
	}
	// Every dead letter is counted in a dead_lettered event, in fewer events than dead letters.
	count := func() (n int, events int) {
		for _, ev := range find(got(), records.OpsDeliveryDeadLettered, "crm") {
			n += int(ev.Data["count"].(float64))
			events++
		}
		return n, events
	}
	testenv.Eventually(t, 30*time.Second, func() bool { n, _ := count(); return n == 20 }, "dead letters announced: %v%s", lazyN(func() int { n, _ := count(); return n }), describeEvents(got))
	if _, events := count(); events >= 10 {
		t.Errorf("%d delivery.dead_lettered events for 20 dead letters: they are not aggregated", events)
	}
	first := find(got(), records.OpsDeliveryDeadLettered, "crm")[0]
	if first.Data["reason"] != records.ReasonExhausted || first.Data["deliveryId"] == "" || first.Data["eventId"] == nil {
		t.Errorf("the first dead_lettered event %v lacks its first dead letter", first.Data)
	}
	// The catch-all endpoint delivered the 20 events and no operational event.
	testenv.Eventually(t, 20*time.Second, func() bool { return len(everything.RequestsByID()) == 20 }, "everything got %v", lazyN(func() int { return len(everything.RequestsByID()) }))
	if n := len(received(t, everything)); n != 0 {
		t.Errorf("a catch-all endpoint (>) received %d operational events", n)
	}
	for _, r := range e.logRecords("everything") {
		if records.IsOpsType(r.EventType) {
			t.Errorf("an operational event was routed to the catch-all endpoint: %+v", r)
		}
	}
	// Each event is stored once in the events stream.
	ids := map[string]int{}
	for _, ev := range e.opsEvents() {
		ids[ev.ID]++
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("operational event %s stored %d times", id, n)
		}
	}
}

// A circuit that opens, probes and closes is announced at each step, in order.
func TestCircuitOperationalEvents(t *testing.T) {
	e := newEnv(t)
	var failing atomic.Bool
	failing.Store(true)
	flaky := newReceiver(t, func(testenv.Request) testenv.Response {
		if failing.Load() {
			return testenv.Response{Status: http.StatusServiceUnavailable, Body: "down"}
		}
		return testenv.Response{Status: http.StatusOK, Body: "ok"}
	})
	alerts := newReceiver(t, nil)
	schedule := []metav1.Duration{{}}
	for range 30 {
		schedule = append(schedule, metav1.Duration{Duration: 200 * time.Millisecond})
	}
	circuit := e.policy("circuit", v1alpha1.RetryPolicySpec{Schedule: schedule,
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 2, OpenDuration: dur(time.Second), SuccessesToClose: 1, RampUp: dur(0)}})
	e.endpoint("flaky", v1alpha1.WebhookEndpointSpec{URL: flaky.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"}, RetryPolicyRef: circuit})
	alerts.Trust(e.endpoint("alerts", v1alpha1.WebhookEndpointSpec{URL: alerts.URL(), EventTypes: []v1alpha1.EventTypePattern{"webhook_operator.circuit.*"}}))
	e.dispatcher("d1")

	e.publish("order.created", "evt_1", []byte(`{}`))
	got := func() []records.OpsEvent { return received(t, alerts) }
	testenv.Eventually(t, 20*time.Second, func() bool { return len(find(got(), records.OpsCircuitOpened, "flaky")) > 0 }, "no circuit.opened; got%s", describeEvents(got))
	opened := find(got(), records.OpsCircuitOpened, "flaky")[0]
	if opened.Data["consecutiveFailures"] != 2.0 || opened.Data["probeFailed"] != false || opened.Data["openFor"] != "1s" {
		t.Errorf("circuit.opened data %v", opened.Data)
	}
	failing.Store(false)
	// Deliveries of one endpoint may arrive out of order (BestEffort): wait for both.
	testenv.Eventually(t, 20*time.Second, func() bool {
		evs := got()
		return len(find(evs, records.OpsCircuitClosed, "flaky")) > 0 && len(find(evs, records.OpsCircuitHalfOpen, "flaky")) > 0
	}, "no circuit.half_open and circuit.closed; got%s", describeEvents(got))
	evs := got()
	var order []string
	for _, ev := range evs {
		if ev.Endpoint == "flaky" {
			order = append(order, ev.Type)
		}
	}
	last := func(typ string) time.Time {
		l := find(evs, typ, "flaky")
		if len(l) == 0 {
			t.Fatalf("no %s event; got %v", typ, order)
		}
		return l[len(l)-1].Time
	}
	if o, h, c := last(records.OpsCircuitOpened), last(records.OpsCircuitHalfOpen), last(records.OpsCircuitClosed); !o.Before(h) || !h.Before(c) {
		t.Errorf("opened %s, half-open %s, closed %s: not in order (%v)", o, h, c, order)
	}
	if n := len(find(evs, records.OpsEndpointDisabled, "flaky")); n != 0 {
		t.Errorf("alerts subscribed to circuit events only and got %d endpoint events", n)
	}
}

// The loop guard: an endpoint that subscribes to operational events and fails to deliver them
// never receives events about itself, and its dead letters of operational events are not
// announced, so its failures do not feed more events to itself or to its peers. Its circuit
// and disable transitions still reach the other subscriber.
func TestOperationalEventsDoNotLoop(t *testing.T) {
	e := newEnv(t)
	failing := func(testenv.Request) testenv.Response {
		return testenv.Response{Status: http.StatusInternalServerError, Body: "broken"}
	}
	crmRcv, pagerRcv, alertsRcv := newReceiver(t, failing), newReceiver(t, failing), newReceiver(t, nil)
	fragile := e.policy("fragile", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}},
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 2, OpenDuration: dur(300 * time.Millisecond), RampUp: dur(0)},
		AutoDisable:    &v1alpha1.AutoDisableSpec{ConsecutiveFailures: ptr(int32(6))}})
	e.endpoint("crm", v1alpha1.WebhookEndpointSpec{URL: crmRcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"contact.*"}, RetryPolicyRef: fragile})
	// pager receives three events about crm (circuit opened, disabled, dead letters) and
	// fails each: disabled at 3.
	pagerPolicy := e.policy("pager", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}},
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 2, OpenDuration: dur(300 * time.Millisecond), RampUp: dur(0)},
		AutoDisable:    &v1alpha1.AutoDisableSpec{ConsecutiveFailures: ptr(int32(3))}})
	e.endpoint("pager", v1alpha1.WebhookEndpointSpec{URL: pagerRcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"webhook_operator.>"}, RetryPolicyRef: pagerPolicy})
	alertsRcv.Trust(e.endpoint("alerts", v1alpha1.WebhookEndpointSpec{URL: alertsRcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"webhook_operator.>"}}))
	e.dispatcher("d1", func(o *dispatcher.Options) {
		o.DeadLetterNewsWindow, o.OpsSweepInterval = 500*time.Millisecond, 200*time.Millisecond
	})

	for i := range 10 {
		e.publish("contact.updated", fmt.Sprintf("evt_%02d", i), []byte(`{}`))
	}
	got := func() []records.OpsEvent { return received(t, alertsRcv) }
	testenv.Eventually(t, 60*time.Second, func() bool {
		return len(find(got(), records.OpsEndpointDisabled, "crm")) == 1 && len(find(got(), records.OpsEndpointDisabled, "pager")) == 1
	}, "crm and pager not both announced disabled; alerts got%s", describeEvents(got))
	if n := len(find(got(), records.OpsCircuitOpened, "pager")); n == 0 {
		t.Error("pager's circuit opening did not reach alerts")
	}
	// pager failed on events about crm (and about alerts, none here): never on its own.
	for _, ev := range received(t, pagerRcv) {
		if ev.Endpoint == "pager" {
			t.Errorf("pager received an event about itself: %s %v", ev.Type, ev.Data)
		}
	}
	if len(received(t, pagerRcv)) == 0 {
		t.Fatal("pager received no operational event at all")
	}
	// pager dead-lettered operational events; none of them was announced.
	var pagerDLs int
	for _, dl := range e.deadLetters() {
		if dl.Endpoint == "pager" {
			pagerDLs++
			if !records.IsOpsType(dl.EventType) {
				t.Errorf("pager dead-lettered a %s event", dl.EventType)
			}
		}
	}
	if pagerDLs == 0 {
		t.Fatal("pager has no dead letters")
	}
	if n := len(find(e.opsEvents(), records.OpsDeliveryDeadLettered, "pager")); n != 0 {
		t.Errorf("%d delivery.dead_lettered events about pager's dead letters of operational events: the loop is not cut", n)
	}
	if n := len(find(e.opsEvents(), records.OpsDeliveryDeadLettered, "crm")); n == 0 {
		t.Error("crm's dead letters (of ordinary events) were not announced")
	}
}
