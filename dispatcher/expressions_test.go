package dispatcher_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A filter delivers exactly the matching events of a mixed stream: rejected events reach
// neither the receiver nor the delivery log (they are counted, in the metric and in the
// endpoint's health), an event the filter cannot decide on is dead-lettered as filter_failed,
// and an endpoint without a filter gets every event.
func TestFilterDeliversExactlyTheMatchingEventsOfAMixedStream(t *testing.T) {
	e := newEnv(t)
	big, all := newReceiver(t, nil), newReceiver(t, nil)
	big.Trust(e.endpoint("big", v1alpha1.WebhookEndpointSpec{URL: big.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"},
		Filter: `has(payload.total) && payload.total > 100 && payload.currency == "EUR"`}))
	all.Trust(e.endpoint("all", v1alpha1.WebhookEndpointSpec{URL: all.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"}}))
	reg := prometheus.NewRegistry()
	e.dispatcher("d1", func(o *dispatcher.Options) { o.Registry = reg })

	want := map[string]bool{}
	var ids []string
	for i := range 40 {
		id := fmt.Sprintf("evt_%02d", i)
		total, currency := i*10, []string{"EUR", "USD"}[i%2]
		body := fmt.Sprintf(`{"total":%d,"currency":%q}`, total, currency)
		if i%5 == 4 {
			body = fmt.Sprintf(`{"total":%d.5,"currency":%q}`, total, currency) // a double compares with an int
		}
		e.publish("order.created", id, []byte(body))
		ids = append(ids, id)
		if total > 100 && currency == "EUR" {
			want[id] = true
		}
	}
	for _, id := range []string{"evt_text", "evt_no_total"} {
		ids = append(ids, id)
	}
	e.publish("order.created", "evt_text", []byte(`total 500 EUR`)) // not JSON: payload is null
	e.publish("order.created", "evt_no_total", []byte(`{"currency":"EUR"}`))
	// has(payload.total) is true, then payload.currency is missing: the filter cannot decide.
	e.publish("order.created", "evt_undecided", []byte(`{"total":500}`))
	ids = append(ids, "evt_undecided")

	testenv.Eventually(t, 20*time.Second, func() bool { return len(all.RequestsByID()) == len(ids) }, "the endpoint without a filter got %d of %d", lazyN(func() int { return len(all.RequestsByID()) }), len(ids))
	testenv.Eventually(t, 20*time.Second, func() bool { return len(big.RequestsByID()) >= len(want) }, "the filtered endpoint got %d of %d", lazyN(func() int { return len(big.RequestsByID()) }), len(want))
	var undecided records.DeadLetter
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, dl := range e.deadLetters() {
			if dl.Endpoint == "big" {
				undecided = dl
				return true
			}
		}
		return false
	}, "no dead letter of the undecided event")
	got := big.RequestsByID()
	if len(got) != len(want) {
		t.Errorf("the filtered endpoint got %v, want exactly %v", sortedKeys(got), sortedKeys(mapOf(want)))
	}
	for id := range got {
		if !want[id] {
			t.Errorf("%s reached the filtered endpoint", id)
		}
	}
	if big.Stats().BadSignatures+all.Stats().BadSignatures != 0 {
		t.Errorf("bad signatures")
	}
	if undecided.EventID != "evt_undecided" || undecided.Reason != records.ReasonFilterFailed || len(undecided.Attempts) != 0 ||
		!strings.Contains(undecided.Message, "spec.filter") || !strings.Contains(undecided.Message, "currency") {
		t.Errorf("dead letter %+v, want evt_undecided as filter_failed without an attempt, saying why", undecided)
	}
	filtered := len(ids) - len(want) - 1
	for _, r := range e.logRecords("big") {
		if !want[r.EventID] && r.EventID != "evt_undecided" {
			t.Errorf("a filtered event is in the delivery log: %+v", r)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return filteredTotal(t, reg, "big") == filtered },
		"webhook_events_filtered_total{endpoint=big} = %v, want %d", lazyN(func() int { return filteredTotal(t, reg, "big") }), filtered)
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("big").Status.Health
		return h != nil && h.Filtered == int64(filtered) && h.Delivered == int64(len(want)) && h.Failures == 0
	}, "health of big: %+v, want filtered %d", lazy(func() string { return fmt.Sprintf("%+v", e.get("big").Status.Health) }), filtered)
	if h := e.get("all").Status.Health; h != nil && h.Filtered != 0 {
		t.Errorf("the endpoint without a filter counts %d filtered", h.Filtered)
	}
}

// A transformation's body is what is sent and signed: the receiver verifies it with the
// official Standard Webhooks library. Its headers are sent, replacing the endpoint's own of the
// same name; an event it fails on is dead-lettered as transform_failed without reaching the
// receiver or counting against it.
func TestTransformationIsSentAndVerifiesWithTheStandardWebhooksLibrary(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	secret := e.endpoint("slack", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"},
		Headers: []v1alpha1.HTTPHeader{{Name: "X-Team", Value: "static"}, {Name: "X-Order-Id", Value: "replaced"}},
		Transform: &v1alpha1.TransformSpec{
			Body: `{"text": "Order " + payload.order_id + " paid: " + string(payload.total) + " " + payload.currency}`,
			Headers: []v1alpha1.TransformHeader{{Name: "X-Order-Id", Expression: "payload.order_id"},
				{Name: "X-Region", Expression: `headers[?"x-region"]`}},
		}})
	e.dispatcher("d1")
	e.publish("order.paid", "evt_1", []byte(`{"order_id":"ord_1","total":150,"currency":"EUR","secret":"not for slack"}`), "X-Region", "eu")
	e.publish("order.paid", "evt_2", []byte(`{"order_id":"ord_2","total":7,"currency":"USD"}`))
	e.publish("order.paid", "evt_broken", []byte(`{"total":1}`)) // no order_id: the transformation fails

	testenv.Eventually(t, 20*time.Second, func() bool { return len(rcv.RequestsByID()) == 2 }, "receiver got %v", lazy(func() string { return fmt.Sprint(rcv.RequestsByID()) }))
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	hits := rcv.Requests()
	sort.Slice(hits, func(i, j int) bool { return hits[i].ID < hits[j].ID })
	wantBody := map[string]string{"evt_1": `{"text":"Order ord_1 paid: 150 EUR"}`, "evt_2": `{"text":"Order ord_2 paid: 7 USD"}`}
	for _, h := range hits {
		if err := wh.Verify(h.Body, h.Header); err != nil {
			t.Errorf("%s: the transformed body does not verify: %v", h.ID, err)
		}
		if string(h.Body) != wantBody[h.ID] || h.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: body %s (%s), want %s", h.ID, h.Body, h.Header.Get("Content-Type"), wantBody[h.ID])
		}
		if !json.Valid(h.Body) || strings.Contains(string(h.Body), "not for slack") {
			t.Errorf("%s: body %s", h.ID, h.Body)
		}
		if h.Header.Get("X-Order-Id") != "ord_"+h.ID[4:] || h.Header.Get("X-Team") != "static" {
			t.Errorf("%s: headers %v", h.ID, h.Header)
		}
	}
	if hits[0].Header.Get("X-Region") != "eu" || hits[1].Header.Get("X-Region") != "" {
		t.Errorf("X-Region: %q, %q; want eu and none (null leaves the header out)", hits[0].Header.Get("X-Region"), hits[1].Header.Get("X-Region"))
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "dead letters: %d", lazyN(func() int { return len(e.deadLetters()) }))
	dl := e.deadLetters()[0]
	if dl.EventID != "evt_broken" || dl.Reason != records.ReasonTransformFailed || len(dl.Attempts) != 0 ||
		!strings.Contains(dl.Message, "spec.transform.body") || !strings.Contains(dl.Message, "order_id") {
		t.Errorf("dead letter %+v, want evt_broken as transform_failed without an attempt", dl)
	}
	if _, ok := rcv.RequestsByID()["evt_broken"]; ok {
		t.Error("the event the transformation failed on reached the receiver")
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("slack").Status.Health
		return h != nil && h.Delivered == 2 && h.DeadLettered == 1 && h.Failures == 0 && h.ConsecutiveFailures == 0
	}, "health: %+v", lazy(func() string { return fmt.Sprintf("%+v", e.get("slack").Status.Health) }))
}

// An expression the dispatcher cannot compile (the controller reports it as InvalidFilter or
// InvalidTransform) is a configuration error: nothing is sent, and every attempt says why.
func TestAnExpressionThatDoesNotCompileIsAConfigurationError(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	e.endpoint("broken", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"},
		Filter: `payload.total >`})
	e.dispatcher("d1")
	e.publish("order.created", "evt_1", []byte(`{"total":1}`))
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, r := range e.logRecords("broken") {
			if r.Reason == records.FailConfig && strings.Contains(r.Response.Error, "spec.filter") {
				return true
			}
		}
		return false
	}, "no attempt failed as a configuration error: %v", lazy(func() string { return fmt.Sprint(e.logRecords("broken")) }))
	if n := rcv.Stats().Requests; n != 0 {
		t.Errorf("the receiver got %d requests", n)
	}
}

// filteredTotal is webhook_events_filtered_total of endpoint in reg.
func filteredTotal(t *testing.T, reg *prometheus.Registry, endpoint string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "webhook_events_filtered_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "endpoint" && l.GetValue() == endpoint {
					return int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return 0
}

func mapOf(m map[string]bool) map[string]int {
	out := map[string]int{}
	for k := range m {
		out[k] = 1
	}
	return out
}

// An expression that builds too much on an event (issue 30: the cost estimate does not see
// it) is stopped by its bounds: as a filter the event is dead-lettered as filter_failed, as a
// transformation as transform_failed, each saying which bound it reached; nothing reaches the
// receivers, and the dispatcher goes on delivering the events of another endpoint.
func TestAnExpressionThatBuildsTooMuchIsStoppedAndDeadLettered(t *testing.T) {
	e := newEnv(t)
	rcv, ok := newReceiver(t, nil), newReceiver(t, nil)
	heavy := `size([` + strings.TrimSuffix(strings.Repeat("lists.range(10000), ", 180), ", ") + `]) > 0`
	e.endpoint("filter", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"}, Filter: heavy})
	e.endpoint("transform", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"},
		Transform: &v1alpha1.TransformSpec{Body: `{"big": ` + heavy + `}`}})
	ok.Trust(e.endpoint("plain", v1alpha1.WebhookEndpointSpec{URL: ok.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"}}))
	e.dispatcher("d1")
	for i := range 3 {
		e.publish("order.created", fmt.Sprintf("evt_%d", i), []byte(`{"total":1}`))
	}

	testenv.Eventually(t, 30*time.Second, func() bool { return len(e.deadLetters()) == 6 }, "dead letters: %d, want 6", lazyN(func() int { return len(e.deadLetters()) }))
	for _, dl := range e.deadLetters() {
		want := map[string]string{"filter": records.ReasonFilterFailed, "transform": records.ReasonTransformFailed}[dl.Endpoint]
		if dl.Reason != want || len(dl.Attempts) != 0 || !strings.Contains(dl.Message, "built more than 33554432 bytes") {
			t.Errorf("dead letter of %s/%s: %s %q, want %s saying the bound", dl.Endpoint, dl.EventID, dl.Reason, dl.Message, want)
		}
	}
	if n := rcv.Stats().Requests; n != 0 {
		t.Errorf("the receiver of the two endpoints got %d requests", n)
	}
	e.publish("order.created", "evt_after", []byte(`{"total":2}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return len(ok.RequestsByID()) == 4 }, "the other endpoint got %v, want every event",
		lazy(func() string { return fmt.Sprint(sortedKeys(ok.RequestsByID())) }))
}
