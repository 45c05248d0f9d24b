package dispatcher_test

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/cloudevent"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// An endpoint of format CloudEvents gets each event as a CloudEvent the official SDK reads, in
// binary and in structured mode, with the attributes taken from the event (id, source, type,
// time, subject, extensions), still signed per Standard Webhooks over the body sent; a raw
// endpoint gets the body as published and no ce-* header.
func TestCloudEventsFormat(t *testing.T) {
	e := newEnv(t)
	modes := map[string]*v1alpha1.FormatSpec{
		"binary":     {Type: v1alpha1.FormatCloudEvents},
		"structured": {Type: v1alpha1.FormatCloudEvents, CloudEventsMode: v1alpha1.CloudEventsStructured},
		"raw":        nil,
	}
	rcv := map[string]*testenv.Receiver{}
	for name, f := range modes {
		rcv[name] = testenv.StartReceiver(t, testenv.ReceiverOptions{})
		rcv[name].Trust(e.endpoint(name, v1alpha1.WebhookEndpointSpec{URL: rcv[name].URL(), EventTypes: []v1alpha1.EventTypePattern{"order.*"}, Format: f}))
	}
	e.dispatcher("d1")
	at := "2026-12-01T10:00:00Z"
	e.publish("order.created", "evt_ce", []byte(`{"total":42}`), "Content-Type", "application/json", "Webhook-Event-Time", at,
		cloudevent.HeaderSource, "//shop/orders", cloudevent.HeaderSubject, "orders/o-1", cloudevent.HeaderPartitionKey, "o-1", "X-Region", "eu")
	e.publish("order.paid", "evt_plain", []byte(`{"n":1}`))
	for name := range modes {
		testenv.Eventually(t, 20*time.Second, func() bool { return rcv[name].Stats().Unique == 2 }, "%s: %d events received%s", name,
			lazyN(func() int { return rcv[name].Stats().Unique }), lazy(e.dump))
	}
	for name := range modes {
		for _, r := range rcv[name].Requests() {
			if !r.Signed {
				t.Errorf("%s: %s is not signed", name, r.ID)
			}
			if name == "raw" {
				if r.Header.Get("Ce-Source") != "" || r.Header.Get("Ce-Partitionkey") != "" {
					t.Errorf("raw: ce-* headers forwarded: %v", r.Header)
				}
				continue
			}
			req, _ := http.NewRequest(http.MethodPost, "http://x/", bytes.NewReader(r.Body))
			req.Header = r.Header.Clone()
			ev, err := cehttp.NewEventFromHTTPRequest(req)
			if err != nil {
				t.Fatalf("%s: the SDK reads no CloudEvent (%v): %v %s", name, err, r.Header, r.Body)
			}
			if ev.ID() != r.ID {
				t.Errorf("%s: id %q, webhook-id %q", name, ev.ID(), r.ID)
			}
			switch r.ID {
			case "evt_ce":
				if ev.Type() != "order.created" || ev.Source() != "//shop/orders" || ev.Subject() != "orders/o-1" ||
					ev.Time().UTC().Format(time.RFC3339) != at || ev.Extensions()[cloudevent.PartitionKey] != "o-1" ||
					string(ev.Data()) != `{"total":42}` || r.Header.Get("X-Region") != "eu" {
					t.Errorf("%s: %s (X-Region %q)", name, ev, r.Header.Get("X-Region"))
				}
			case "evt_plain":
				if ev.Type() != "order.paid" || ev.Source() != cloudevent.DefaultSource(e.ns) || ev.Time().IsZero() || string(ev.Data()) != `{"n":1}` {
					t.Errorf("%s: %s", name, ev)
				}
			default:
				t.Errorf("unexpected %s", r.ID)
			}
			if wantCT := map[string]string{"binary": "application/json", "structured": "application/cloudevents+json; charset=utf-8"}[name]; r.Header.Get("Content-Type") != wantCT {
				t.Errorf("%s: Content-Type %q", name, r.Header.Get("Content-Type"))
			}
		}
	}
}
