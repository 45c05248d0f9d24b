package settle_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/dispatcher/settle"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// endpoint is the settle.Endpoint of the tests: it writes down what it was told.
type endpoint struct {
	names streams.NamespaceNames

	mu      sync.Mutex
	told    []string
	logging int
}

func (e *endpoint) tell(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.told = append(e.told, s)
}

func (e *endpoint) said() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.told, ",")
}

func (e *endpoint) Name() string               { return "orders" }
func (e *endpoint) LogSubject() string         { return e.names.AttemptSubject("orders") }
func (e *endpoint) Lane() (streams.Lane, bool) { return streams.LaneOwn, false }
func (e *endpoint) Logging(string)             { e.mu.Lock(); e.logging++; e.mu.Unlock() }
func (e *endpoint) Logged(string)              { e.mu.Lock(); e.logging--; e.mu.Unlock() }
func (e *endpoint) Go(f func())                { go f() }
func (e *endpoint) Changed()                   {}
func (e *endpoint) Retried()                   { e.tell("retried") }
func (e *endpoint) DeadLettered(reason string) { e.tell("dead-lettered " + reason) }
func (e *endpoint) Held()                      { e.tell("held") }
func (e *endpoint) RetryScheduled()            { e.tell("retry of a deleted endpoint") }
func (e *endpoint) inFlight() int              { e.mu.Lock(); defer e.mu.Unlock(); return e.logging }

// A delivery is acknowledged only once what it leaves is stored: a dead letter and its
// record, or a scheduled retry and the attempt's record; when the dead letter cannot be
// stored, the event is handed back, not acknowledged, and no record is logged for it.
func TestADeliveryIsAcknowledgedOnlyOnceWhatItLeavesIsStored(t *testing.T) {
	ctx := context.Background()
	js := testenv.NewJetStream(t)
	set := streams.DefaultConfig().For("team-a")
	if err := set.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	ep := &endpoint{names: set.NamespaceNames}
	maxPayload := js.Conn().MaxPayload()
	logs := settle.NewLogWriter(js, maxPayload, logr.Discard())
	runCtx, stopLogs := context.WithCancel(ctx)
	logsDone := make(chan struct{})
	go func() { defer close(logsDone); logs.Run(runCtx, ctx) }()
	t.Cleanup(func() { stopLogs(); <-logsDone })
	s := settle.New(js, set.NamespaceNames, logs, settle.NewRoom(js, set.DeliveriesStream()), maxPayload, ctx, logr.Discard())

	cons, err := js.CreateConsumer(ctx, set.EventsStream(), jetstream.ConsumerConfig{Durable: "test", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	next := func(i int) jetstream.Msg {
		t.Helper()
		if _, err := js.Publish(ctx, set.EventSubject("order.created"), fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
			t.Fatal(err)
		}
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			return m
		}
		t.Fatalf("event %d not fetched: %v", i, b.Error())
		return nil
	}
	// acked waits until the consumer's acknowledgement floor reaches the event's sequence.
	acked := func(m jetstream.Msg) {
		t.Helper()
		md, _ := m.Metadata()
		testenv.Eventually(t, 10*time.Second, func() error {
			ci, err := cons.Info(ctx)
			if err != nil {
				return err
			}
			if ci.AckFloor.Stream < md.Sequence.Stream {
				return fmt.Errorf("acknowledged up to %d, not %d", ci.AckFloor.Stream, md.Sequence.Stream)
			}
			return nil
		}, "the event acknowledged")
	}
	count := func(stream, subject string) uint64 {
		t.Helper()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[subject]
	}
	deliveries, attempts := set.DeliveriesStream(), set.AttemptsStream()
	logSubject := ep.LogSubject()
	meta := func(i int) records.DeliveryMeta {
		return records.DeliveryMeta{DeliveryID: fmt.Sprintf("whd_%d", i), EventType: "order.created", Namespace: "team-a", Endpoint: "orders", Attempts: 3}
	}

	// A dead letter: stored, its record logged, then the event acknowledged.
	m1 := next(1)
	if w := s.Finish(ctx, ep, m1, decide.DeadLetter(records.ReasonExhausted, "3 attempts without a successful response").With(meta(1))); w != nil {
		t.Fatalf("a dead letter is waited out in place: %+v", w)
	}
	acked(m1)
	dlSubject := set.DeadLetterSubject("orders", "whd_1")
	if n := count(set.DeadLetterStream(), dlSubject); n != 1 {
		t.Errorf("%d dead letters on %s, want 1", n, dlSubject)
	}
	if n := count(attempts, logSubject); n != 1 {
		t.Errorf("%d records in the delivery log, want 1", n)
	}
	if got := ep.said(); got != "dead-lettered exhausted" {
		t.Errorf("the endpoint was told %q", got)
	}

	// A scheduled retry: a message schedule in the deliveries stream, due when asked, the
	// attempt's record logged, then the event acknowledged.
	m2 := next(2)
	due := time.Now().Add(time.Hour).UTC()
	rec := &records.LogRecord{DeliveryID: "whd_2", Endpoint: "orders", State: records.StateFailed, Attempt: 3, Time: time.Now().UTC()}
	if w := s.Finish(ctx, ep, m2, decide.Verdict{Act: decide.ActSchedule, At: due, Meta: meta(2), Rec: rec}); w != nil {
		t.Fatalf("a scheduled retry is waited out in place: %+v", w)
	}
	acked(m2)
	wait, target := set.RetryTarget("orders", "whd_2", streams.LaneOwn)
	st, err := js.Stream(ctx, deliveries)
	if err != nil {
		t.Fatal(err)
	}
	sched, err := st.GetLastMsgForSubject(ctx, wait)
	if err != nil {
		t.Fatalf("no scheduled retry on %s: %v", wait, err)
	}
	if got, want := sched.Header.Get("Nats-Schedule"), "@at "+due.Format(time.RFC3339Nano); got != want {
		t.Errorf("Nats-Schedule %q, want %q", got, want)
	}
	if got := sched.Header.Get("Nats-Schedule-Target"); got != target {
		t.Errorf("Nats-Schedule-Target %q, want %q", got, target)
	}
	if n := count(attempts, logSubject); n != 2 {
		t.Errorf("%d records in the delivery log, want 2", n)
	}
	if got := ep.said(); got != "dead-lettered exhausted,retried" {
		t.Errorf("the endpoint was told %q", got)
	}

	// A stream that does not answer for a moment (no responders, as while a new leader is
	// elected after its node died) is waited out: the dead letter is stored once it answers
	// again and the event acknowledged, not handed back to a consumer whose own leader may be
	// moving too.
	if err := js.DeleteStream(ctx, set.DeadLetterStream()); err != nil {
		t.Fatal(err)
	}
	back := make(chan error, 1)
	time.AfterFunc(1500*time.Millisecond, func() { back <- set.Ensure(ctx, js) })
	m4 := next(4)
	s.Finish(ctx, ep, m4, decide.DeadLetter(records.ReasonExhausted, "3 attempts without a successful response").With(meta(4)))
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	acked(m4)
	if n := count(set.DeadLetterStream(), set.DeadLetterSubject("orders", "whd_4")); n != 1 {
		t.Errorf("%d dead letters stored once the stream answered again, want 1", n)
	}
	if got := ep.said(); got != "dead-lettered exhausted,retried,dead-lettered exhausted" {
		t.Errorf("the endpoint was told %q", got)
	}

	// A dead letter that cannot be stored: the event is handed back (it comes again), and
	// nothing is logged or counted for it.
	if err := js.DeleteStream(ctx, set.DeadLetterStream()); err != nil {
		t.Fatal(err)
	}
	m3 := next(3)
	s.Finish(ctx, ep, m3, decide.DeadLetter(records.ReasonExhausted, "3 attempts without a successful response").With(meta(3)))
	b, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var again jetstream.Msg
	for m := range b.Messages() {
		again = m
	}
	if again == nil {
		t.Fatalf("the event whose dead letter could not be stored did not come back: %v", b.Error())
	}
	md, _ := again.Metadata()
	if md3, _ := m3.Metadata(); md.Sequence.Stream != md3.Sequence.Stream || md.NumDelivered != 2 {
		t.Errorf("came back: sequence %d delivered %d times, want the event (%d) a second time", md.Sequence.Stream, md.NumDelivered, md3.Sequence.Stream)
	}
	if n := count(attempts, logSubject); n != 3 {
		t.Errorf("%d records in the delivery log, want 3 (none for a dead letter not stored)", n)
	}
	if got := ep.said(); got != "dead-lettered exhausted,retried,dead-lettered exhausted" {
		t.Errorf("the endpoint was told %q", got)
	}
	if n := ep.inFlight(); n != 0 {
		t.Errorf("%d log writes still counted in flight", n)
	}
}
