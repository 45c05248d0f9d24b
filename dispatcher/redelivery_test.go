package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A delivery whose outcome a log batch holds but whose acknowledgement was lost (a nats-server
// restart, a leader change, a crash after the log write) comes back redelivered. It is settled
// from the log: the receiver gets no second request, and the health fold counts it once.
//
// The lost acknowledgement is made as a dispatcher makes it (loseAcknowledgements).
func TestLoggedOutcomeOfARedeliveredMessageIsNotSentAgain(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	secret := e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL()})
	rcv.Trust(secret)
	const decided = 3
	loseAcknowledgements(t, e, "orders", decided)

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

// The same lost acknowledgement, met by a dispatcher that starts before the endpoint is on its
// routes (the controller had not written status.sharedSince yet): the redelivered events are
// taken for nobody, and once the endpoint is routed the dispatcher catches up on them. The
// catch-up reads the delivery log first, as for any redelivered message: what was logged is not
// sent again.
func TestLoggedOutcomeIsNotSentAgainWhenTheEndpointIsRoutedLate(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	ctx := context.Background()
	secret := newSecret()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: names.SigningSecret("orders"),
		Annotations: map[string]string{consent.AllowedEndpoints: "orders"}}, StringData: map[string]string{names.SigningSecretKey: secret}}
	if err := e.k8s.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	rcv.Trust(secret)
	ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "orders"},
		Spec: v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), EventTypes: []v1alpha1.EventTypePattern{">"}}}
	if err := e.k8s.Create(ctx, ep); err != nil {
		t.Fatal(err)
	}
	// The lane's consumers exist (another endpoint's, say); the endpoint's status is not written.
	if err := e.set.EnsureSharedLane(ctx, e.js, ep.CreationTimestamp.Time); err != nil {
		t.Fatal(err)
	}
	const decided = 3
	loseAcknowledgements(t, e, "orders", decided)
	cons, err := e.js.Consumer(ctx, e.set.EventsStream(), streams.IntakeConsumer(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	e.dispatcher("d1")
	// The dispatcher takes the redelivered events for nobody: the intake consumer holds none.
	testenv.Eventually(t, 30*time.Second, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}, "the intake consumer still holds the events")

	e.consumers(e.get("orders")) // the controller's status write: on the routes now
	e.publish("order.created", "evt_new", []byte(`{}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return rcv.Count("evt_new") == 1 },
		"want evt_new delivered; receiver has %v%s", lazy(func() string { return fmt.Sprint(rcv.RequestsByID()) }), lazy(e.dump))
	wantOnlyNewSent(t, e, rcv, decided)
}

// The same lost acknowledgement, met while the endpoint is suspended: the redelivered events
// are parked (a copy marked as delivered before), and once it resumes they come back through
// the shared lane's queue as new messages. They are settled from the log too.
func TestLoggedOutcomeOfAParkedRedeliveryIsNotSentAgain(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	secret := e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Suspend: true})
	rcv.Trust(secret)
	const decided = 3
	loseAcknowledgements(t, e, "orders", decided)
	e.dispatcher("d1")
	testenv.Eventually(t, 30*time.Second, func() bool { return e.stored(e.set.ParkSubject("orders")) == decided },
		"the redelivered events are not parked: %v", lazy(e.dump))
	e.updateSpec("orders", func(s *v1alpha1.WebhookEndpointSpec) { s.Suspend = false })
	e.publish("order.created", "evt_new", []byte(`{}`))
	testenv.Eventually(t, 30*time.Second, func() bool {
		return rcv.Count("evt_new") == 1 && e.stored(e.set.ParkSubject("orders")) == 0 && e.stored(e.set.QueueSubject("orders")) == 0
	}, "want evt_new delivered and the park and queue empty; receiver has %v%s", lazy(func() string { return fmt.Sprint(rcv.RequestsByID()) }), lazy(e.dump))
	wantOnlyNewSent(t, e, rcv, decided)
}

// wantOnlyNewSent waits for orders' status to count the decided deliveries the log held and
// the one new event, and checks that the receiver got a request for the new event only.
func wantOnlyNewSent(t *testing.T, e *env, rcv *testenv.Receiver, decided int) {
	t.Helper()
	testenv.Eventually(t, 20*time.Second, func() bool {
		h := e.get("orders").Status.Health
		return h != nil && h.Delivered == int64(decided+1)
	}, "status health: %v", lazy(func() string { return fmt.Sprint(e.get("orders").Status.Health) }))
	if got := rcv.RequestsByID(); len(got) != 1 {
		t.Errorf("the receiver got requests for %v: a delivery the log held was sent again", got)
	}
}

// loseAcknowledgements makes n deliveries of endpoint ep whose acknowledgement was lost, as a
// dispatcher makes them: n events published and taken from the namespace's intake consumer,
// their successes written to the delivery log in one batch message (as the log writer batches
// first deliveries), and the messages handed back unacknowledged (a nak: redelivered at once,
// with NumDelivered 2, as after an ack that never arrived).
func loseAcknowledgements(t *testing.T, e *env, ep string, n int) {
	t.Helper()
	logDeliveries(t, e, ep, n, func(m jetstream.Msg) error { return m.Nak() })
}

// logDeliveries publishes n events, takes them from the namespace's intake consumer, writes
// their successes to the delivery log in one batch message (as the log writer batches first
// deliveries) and then settles each taken message with settle.
func logDeliveries(t *testing.T, e *env, ep string, n int, settle func(jetstream.Msg) error) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		e.publish("order.created", fmt.Sprintf("evt_logged_%d", i), []byte(`{}`))
	}
	cons, err := e.js.Consumer(ctx, e.set.EventsStream(), streams.IntakeConsumer(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(10*time.Second))
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
			m.Headers(), e.ns, ep)
		if !ok || invalid != "" {
			t.Fatalf("event %s: %s", m.Subject(), invalid)
		}
		rec := &records.LogRecord{DeliveryID: meta.DeliveryID, EventID: meta.EventID, EventType: meta.EventType, EventSeq: meta.EventSeq,
			Namespace: e.ns, Endpoint: ep, State: records.StateSucceeded, Attempt: 1, Time: time.Now().UTC(),
			Response: records.Response{StatusCode: 200}}
		entries = append(entries, records.EncodeLog(rec, nil))
		msgs = append(msgs, m)
	}
	if len(msgs) != n {
		t.Fatalf("fetched %d of %d events (%v)", len(msgs), n, batch.Error())
	}
	if _, err := e.js.PublishMsg(ctx, records.LogBatch(e.set.AttemptSubject(ep), entries)); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if err := settle(m); err != nil {
			t.Fatal(err)
		}
	}

}

// A consumer whose state went back (a nats-server killed before it wrote the consumer's
// state, a new leader whose copy lagged) delivers again, from 1, messages the dispatcher took
// already: only their place in the stream says so. When such a message is parked (here: the
// endpoint is suspended), the parked copy says it was delivered before, so the queue settles
// it from the log instead of sending it again.
func TestLoggedOutcomeOfAResentMessageIsNotSentAgainAfterParking(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	secret := e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Suspend: true})
	rcv.Trust(secret)
	const decided = 3
	ctx := context.Background()
	cons, err := e.js.Consumer(ctx, e.set.EventsStream(), streams.IntakeConsumer(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	// Delivered, logged and acknowledged: the consumer's state moved past them.
	logDeliveries(t, e, "orders", decided, func(m jetstream.Msg) error { return m.Ack() })
	e.dispatcher("d1")
	// The dispatcher takes (and parks) a later event: its intake has seen the stream that far.
	e.publish("order.created", "evt_probe", []byte(`{}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return e.stored(e.set.ParkSubject("orders")) == 1 },
		"the probe event is not parked: %v", lazy(e.dump))
	// The consumer's state goes back: it delivers every event again, each for the first time.
	cc := cons.CachedInfo().Config
	if err := e.js.DeleteConsumer(ctx, e.set.EventsStream(), cc.Durable); err != nil {
		t.Fatal(err)
	}
	cc.DeliverPolicy, cc.OptStartSeq, cc.OptStartTime = jetstream.DeliverByStartSequencePolicy, 1, nil
	if _, err := e.js.CreateConsumer(ctx, e.set.EventsStream(), cc); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return e.stored(e.set.ParkSubject("orders")) >= decided+1 },
		"the events delivered again are not parked: %v", lazy(e.dump))
	e.updateSpec("orders", func(s *v1alpha1.WebhookEndpointSpec) { s.Suspend = false })
	testenv.Eventually(t, 30*time.Second, func() bool {
		return rcv.Count("evt_probe") >= 1 && e.stored(e.set.ParkSubject("orders")) == 0 && e.stored(e.set.QueueSubject("orders")) == 0
	}, "want evt_probe delivered and the park and queue empty; receiver has %v%s", lazy(func() string { return fmt.Sprint(rcv.RequestsByID()) }), lazy(e.dump))
	for i := range decided {
		if n := rcv.Count(fmt.Sprintf("evt_logged_%d", i)); n != 0 {
			t.Errorf("evt_logged_%d was sent %d times: a delivery the log held was sent again (receiver has %v)", i, n, rcv.RequestsByID())
		}
	}
}
