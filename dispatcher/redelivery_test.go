package dispatcher_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A delivery whose outcome a log batch holds but whose acknowledgement was lost (a nats-server
// restart, a leader change, a crash after the log write) comes back redelivered. It is settled
// from the log: the receiver gets no second request, and the health fold counts it once.
//
// The lost acknowledgement is made here as a dispatcher makes it: the endpoint's consumer
// delivers the events, their successes are written to the delivery log in one batch message,
// as the log writer batches first deliveries, and the messages are handed back unacknowledged
// (a nak: redelivered at once, with NumDelivered 2, as after an ack that never arrived).
func TestLoggedOutcomeOfARedeliveredMessageIsNotSentAgain(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	secret := e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL()})
	rcv.Trust(secret)
	ctx := context.Background()

	const decided = 3
	for i := range decided {
		e.publish("order.created", fmt.Sprintf("evt_logged_%d", i), []byte(`{}`))
	}
	cons, err := e.js.Consumer(ctx, e.set.EventsStream(), e.set.EndpointConsumer("orders"))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(decided, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	var entries []records.LogEntry
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		meta, invalid, ok := records.EventDelivery(m.Subject(), e.cfg.Streams.EventsSubjectPrefix, md.Stream, md.Sequence.Stream, md.Timestamp,
			m.Headers(), e.ns, "orders")
		if !ok || invalid != "" {
			t.Fatalf("event %s: %s", m.Subject(), invalid)
		}
		rec := &records.LogRecord{DeliveryID: meta.DeliveryID, EventID: meta.EventID, EventType: meta.EventType, EventSeq: meta.EventSeq,
			Namespace: e.ns, Endpoint: "orders", State: records.StateSucceeded, Attempt: 1, Time: time.Now().UTC(),
			Response: records.Response{StatusCode: 200}}
		entries = append(entries, records.EncodeLog(rec, nil))
		msgs = append(msgs, m)
	}
	if len(msgs) != decided {
		t.Fatalf("fetched %d of %d events (%v)", len(msgs), decided, batch.Error())
	}
	if _, err := e.js.PublishMsg(ctx, records.LogBatch(e.set.AttemptSubject("orders"), entries)); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
	}

	// One event nobody delivered yet goes out as usual.
	e.publish("order.created", "evt_new", []byte(`{}`))
	e.dispatcher("d1")

	testenv.Eventually(t, 30*time.Second, func() bool { return rcv.Count("evt_new") == 1 && eventsPending(e, "orders") == 0 },
		"want evt_new delivered and every event settled; receiver has %v, %d events pending%s", lazy(func() string { return fmt.Sprint(rcv.RequestsByID()) }),
		lazyN(func() int { return eventsPending(e, "orders") }), lazy(e.dump))
	if got := rcv.RequestsByID(); len(got) != 1 {
		t.Errorf("the receiver got requests for %v: a delivery the log held was sent again", got)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		h := e.get("orders").Status.Health
		return h != nil && h.Delivered == decided+1
	}, "status health: %v", lazy(func() string { return fmt.Sprint(e.get("orders").Status.Health) }))
	if n := len(e.logRecords("orders")); n != decided+1 {
		t.Errorf("the delivery log has %d records for %d deliveries", n, decided+1)
	}
	// The counts stay: nothing is counted later either.
	h := e.get("orders").Status.Health
	if h.Delivered != decided+1 || h.Failures != 0 {
		t.Errorf("status health %+v", h)
	}
}
