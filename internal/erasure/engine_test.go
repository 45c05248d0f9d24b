package erasure

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// secret is in every payload of the events to erase: after the erasure no stored message of
// the namespace may hold it.
const secret = "ana@example.com"

// world is a namespace's streams holding, for each of two events (one to erase, one to keep),
// the event, a held delivery, a scheduled retry, a dead letter and delivery-log records.
type world struct {
	t   testing.TB
	js  jetstream.JetStream
	set streams.Set
	st  testenv.Stored
}

func newWorld(t testing.TB) *world {
	js := testenv.NewJetStream(t)
	set := streams.DefaultConfig().For("shop")
	if err := set.Ensure(context.Background(), js); err != nil {
		t.Fatal(err)
	}
	return &world{t: t, js: js, set: set, st: testenv.Stored{T: t, JS: js, Set: set}}
}

// store writes everything of one event whose body and headers hold marker.
func (w *world) store(id, marker string) {
	t := w.t
	ctx := context.Background()
	h := nats.Header{}
	h.Set("X-Customer", marker)
	seq := w.st.Event("customer.updated", id, `{"email":"`+marker+`"}`, h)
	now := time.Now().UTC()
	m := w.st.Delivery("crm", id, seq, now)
	m.EventType = "customer.updated"
	for _, subject := range []string{w.set.DeliverySubject("crm"), w.set.RetrySubject("crm", m.DeliveryID)} {
		msg := records.NewDelivery(subject, h, []byte(`{"email":"`+marker+`"}`), m)
		if strings.Contains(subject, ".r.") {
			msg.Header.Set(records.HeaderMsgID, m.DeliveryID+":retry")
			msg.Header.Set("Nats-Schedule", "@at "+now.Add(time.Hour).Format(time.RFC3339Nano))
			msg.Header.Set("Nats-Schedule-Target", w.set.DeliverySubject("crm"))
		}
		if _, err := w.js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	dlh := nats.Header{}
	dlh.Set("X-Customer", marker)
	dm := m
	dm.DeliveryID = records.DeliveryID(id, "shop", "audit")
	dm.Endpoint = "audit"
	w.st.DeadLetter(dm, 2, records.ReasonExhausted, `{"email":"`+marker+`"}`, now, dlh)
	w.st.LogBatch(
		records.LogRecord{DeliveryID: m.DeliveryID, EventID: id, EventType: "customer.updated", Namespace: "shop", Endpoint: "crm", State: records.StateFailed, Attempt: 1, Time: now,
			RequestHeaders: map[string]string{"X-Customer": marker}, Response: records.Response{StatusCode: 500, Body: "unknown " + marker}},
		records.LogRecord{DeliveryID: "whdl_other" + id, EventID: "unrelated-" + id, EventType: "order.created", Namespace: "shop", Endpoint: "crm", State: records.StateSucceeded, Attempt: 1, Time: now,
			RequestHeaders: map[string]string{"X-Order": "o-1"}, Response: records.Response{StatusCode: 200, Body: "kept"}})
}

// holding lists the streams holding marker.
func (w *world) holding(marker string) []string { return w.st.Holding(marker) }

func (w *world) run(j *Job, e *Engine) Counts {
	w.t.Helper()
	var total Counts
	for range 1000 {
		step, err := e.Run(context.Background(), j, 100)
		if err != nil {
			w.t.Fatal(err)
		}
		total.Events += step.Counts.Events
		total.Deliveries += step.Counts.Deliveries
		total.LogRecords += step.Counts.LogRecords
		total.DeadLetters += step.Counts.DeadLetters
		if step.Done {
			return total
		}
	}
	w.t.Fatal("the erasure did not complete")
	return total
}

func selection(t testing.TB, set streams.Set, spec v1alpha1.WebhookErasureSpec) Selection {
	sel, err := SelectionOf(set, &spec)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

// An erasure of event ids leaves none of their payloads in any stream: the event and its
// deliveries are gone, the dead letter and the log records stay without the payload; the
// other event and the unrelated records are untouched; a second erasure erases nothing.
func TestEraseEventIDsFromEveryStream(t *testing.T) {
	w := newWorld(t)
	w.store("evt_ana", secret)
	w.store("evt_bob", "bob@example.com")
	e := &Engine{JS: w.js, Set: w.set, Folded: func(context.Context, string) (uint64, bool, error) { return 0, false, nil }}
	spec := v1alpha1.WebhookErasureSpec{EventIDs: []string{"evt_ana"}}
	before := map[string]bool{}
	for _, s := range w.holding(secret) {
		before[s] = true
	}
	if len(before) != 4 {
		t.Fatalf("before the erasure the payload is in %v, want all four streams", before)
	}

	got := w.run(NewJob(selection(t, w.set, spec), Progress{}), e)
	if want := (Counts{Events: 1, Deliveries: 2, LogRecords: 1, DeadLetters: 1}); got != want {
		t.Errorf("erased %+v, want %+v", got, want)
	}
	if left := w.holding(secret); len(left) > 0 {
		t.Errorf("the erased payload is still stored in %v", left)
	}
	for _, keep := range []string{"bob@example.com", "kept", "o-1"} {
		if len(w.holding(keep)) == 0 {
			t.Errorf("%q, which was not selected, is gone", keep)
		}
	}
	dls := w.st.Msgs(w.set.DeadLetterStream(), ">")
	erased := 0
	for _, m := range dls {
		dl, err := records.ParseDeadLetter(m.Header)
		if err != nil {
			t.Fatal(err)
		}
		if dl.EventID == "evt_ana" {
			erased++
			if dl.PayloadRemoved != records.PayloadErased || len(dl.Attempts) != 2 || dl.Reason != records.ReasonExhausted {
				t.Errorf("erased dead letter %+v", dl)
			}
		}
	}
	if erased != 1 || len(dls) != 2 {
		t.Errorf("%d dead letters of the erased event among %d, want 1 of 2", erased, len(dls))
	}

	again := w.run(NewJob(selection(t, w.set, spec), Progress{}), e)
	if again != (Counts{}) {
		t.Errorf("a second erasure erased %+v", again)
	}
}

// An expression selects by payload; a resumed job (its ids lost) collects them again; a log
// record waits until the fold has counted it.
func TestEraseByExpressionResumesAndWaitsForTheFold(t *testing.T) {
	w := newWorld(t)
	w.store("evt_1", secret)
	w.store("evt_2", "bob@example.com")
	folded := uint64(0)
	e := &Engine{JS: w.js, Set: w.set, Folded: func(context.Context, string) (uint64, bool, error) { return folded, true, nil }}
	sel := selection(t, w.set, v1alpha1.WebhookErasureSpec{Expression: `has(payload.email) && payload.email == "` + secret + `"`,
		Since: &metav1.Time{Time: time.Now().Add(-time.Hour)}})
	j := NewJob(sel, Progress{})
	var step Step
	var err error
	for range 100 {
		if step, err = e.Run(context.Background(), j, 100); err != nil {
			t.Fatal(err)
		}
		if !step.WaitUntil.IsZero() {
			break
		}
	}
	if step.WaitReason != v1alpha1.ReasonWaitingForFold || j.Progress.Phase != v1alpha1.ErasurePhaseDeliveryLog {
		t.Fatalf("step %+v in phase %s: want a wait for the fold in the log phase", step, j.Progress.Phase)
	}
	// The controller restarts: the job resumes from its status, without its ids; the fold
	// has caught up.
	folded = 1 << 40
	resumed := NewJob(sel, j.Progress)
	got := w.run(resumed, e)
	if got.Events != 1 || got.LogRecords != 1 || got.DeadLetters != 1 || got.Deliveries != 2 {
		t.Errorf("erased %+v", got)
	}
	if left := w.holding(secret); len(left) > 0 {
		t.Errorf("the erased payload is still stored in %v", left)
	}
	if len(w.holding("bob@example.com")) == 0 {
		t.Error("the other event's payload is gone")
	}
}

// A subject outside the namespace is refused; one inside selects by event type.
func TestSelectionOfRefusesOtherNamespaces(t *testing.T) {
	set := streams.DefaultConfig().For("shop")
	for _, s := range []string{"webhooks.other.customer.>", ">", "webhooks.>", "webhooks.*.customer", "whk.dlq.shop.>", "webhooks.shop."} {
		if _, err := SelectionOf(set, &v1alpha1.WebhookErasureSpec{Subjects: []string{s}}); err == nil {
			t.Errorf("subject %q was accepted", s)
		} else if _, ok := err.(*OutsideError); !ok {
			t.Errorf("subject %q: %v is not an OutsideError", s, err)
		}
	}
	sel, err := SelectionOf(set, &v1alpha1.WebhookErasureSpec{Subjects: []string{"webhooks.shop.customer.>"}})
	if err != nil || !sel.byIDAndType("x", "customer.updated") || sel.byIDAndType("x", "order.created") {
		t.Errorf("selection %+v, %v", sel, err)
	}
	if _, err := SelectionOf(set, &v1alpha1.WebhookErasureSpec{Expression: "payload.("}); err == nil || !strings.Contains(err.Error(), FieldExpression) {
		t.Errorf("a bad expression: %v", err)
	}
}

// What an attempt in flight writes after the deletions (a retry, a dead letter, a log record
// of the erased event) is erased by the Settle phase, which ends only after a reading that
// found nothing.
func TestSettleErasesWhatAttemptsInFlightWrote(t *testing.T) {
	w := newWorld(t)
	w.store("evt_ana", secret)
	now := time.Now()
	clock := func() time.Time { now = now.Add(time.Second); return now }
	e := &Engine{JS: w.js, Set: w.set, SettleWait: time.Minute, Now: clock,
		Folded: func(context.Context, string) (uint64, bool, error) { return 0, false, nil }}
	j := NewJob(selection(t, w.set, v1alpha1.WebhookErasureSpec{EventIDs: []string{"evt_ana"}}), Progress{})
	for j.Progress.Phase != v1alpha1.ErasurePhaseSettle {
		if _, err := e.Run(context.Background(), j, 100); err != nil {
			t.Fatal(err)
		}
	}
	if step, _ := e.Run(context.Background(), j, 100); step.Done || step.WaitUntil.IsZero() {
		t.Fatalf("the Settle phase did not wait: %+v", step)
	}
	// An attempt in flight failed meanwhile: its log record, its retry and another
	// endpoint's dead letter are written.
	ctx := context.Background()
	h := nats.Header{}
	h.Set("X-Customer", secret)
	m := w.st.Delivery("crm", "evt_ana", 1, now)
	m.Attempts = 1
	retry := records.NewDelivery(w.set.RetrySubject("crm", m.DeliveryID), h, []byte(secret), m)
	retry.Header.Set(records.HeaderMsgID, m.DeliveryID+":retry2")
	if _, err := w.js.PublishMsg(ctx, retry); err != nil {
		t.Fatal(err)
	}
	w.st.LogBatch(records.LogRecord{DeliveryID: m.DeliveryID, EventID: "evt_ana", EventType: "customer.updated", Namespace: "shop", Endpoint: "crm",
		State: records.StateFailed, Attempt: 2, Time: now, Response: records.Response{StatusCode: 500, Body: secret}})
	dm := m
	dm.Endpoint, dm.DeliveryID = "billing", records.DeliveryID("evt_ana", "shop", "billing")
	w.st.DeadLetter(dm, 1, records.ReasonExhausted, secret, now, h)
	now = now.Add(2 * time.Minute)
	got := w.run(j, e)
	if got.Deliveries != 1 || got.LogRecords != 1 || got.DeadLetters != 1 {
		t.Errorf("the Settle phase erased %+v", got)
	}
	if left := w.holding(secret); len(left) > 0 {
		t.Errorf("the erased payload is still stored in %v", left)
	}
}

// BenchmarkEraseAmong measures one erasure of 10 events by id in a namespace whose streams hold
// 5,000 events, each with a held delivery, a dead letter and a log record: every stream is read
// once (Collect), then the log, dead letters, deliveries and events once more.
func BenchmarkEraseAmong5000(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		w := newWorld(b)
		for i := range 5000 {
			w.store("evt_"+strconv.Itoa(i), "marker-"+strconv.Itoa(i))
		}
		var ids []string
		for i := range 10 {
			ids = append(ids, "evt_"+strconv.Itoa(i*500))
		}
		e := &Engine{JS: w.js, Set: w.set, Folded: func(context.Context, string) (uint64, bool, error) { return 0, false, nil }}
		j := NewJob(selection(b, w.set, v1alpha1.WebhookErasureSpec{EventIDs: ids}), Progress{})
		b.StartTimer()
		for {
			step, err := e.Run(context.Background(), j, 2000)
			if err != nil {
				b.Fatal(err)
			}
			if step.Done {
				break
			}
		}
	}
}

// storeCopy writes, in reader namespace rw's streams, what one of its endpoints holds of an
// event of namespace from: a delivery (a retry held in place), a dead letter and a
// delivery-log record, each carrying marker in its payload.
func (w *world) storeCopy(from, id, marker string) {
	t := w.t
	now := time.Now().UTC()
	h := nats.Header{}
	h.Set("X-Customer", marker)
	m := records.DeliveryMeta{EventID: id, EventType: "customer.updated", EventTime: now, EventSeq: 1, EventNamespace: from,
		Namespace: w.set.Namespace(), Endpoint: "reader", Created: now, DeliveryID: records.DeliveryID(from+"/"+id, w.set.Namespace(), "reader")}
	if _, err := w.js.PublishMsg(context.Background(), records.NewDelivery(w.set.DeliverySubject("reader"), h, []byte(`{"email":"`+marker+`"}`), m)); err != nil {
		t.Fatal(err)
	}
	w.st.DeadLetter(m, 2, records.ReasonExhausted, `{"email":"`+marker+`"}`, now, h)
	w.st.LogBatch(records.LogRecord{DeliveryID: m.DeliveryID, EventID: id, EventNamespace: from, EventType: "customer.updated",
		Namespace: w.set.Namespace(), Endpoint: "reader", State: records.StateFailed, Attempt: 1, Time: now,
		RequestHeaders: map[string]string{"X-Customer": marker}, Response: records.Response{StatusCode: 500, Body: "unknown " + marker}})
}

// on is a world of namespace ns on w's server.
func (w *world) on(ns string) *world {
	set := streams.DefaultConfig().For(ns)
	if err := set.Ensure(context.Background(), w.js); err != nil {
		w.t.Fatal(err)
	}
	return &world{t: w.t, js: w.js, set: set, st: testenv.Stored{T: w.t, JS: w.js, Set: set}}
}

// An erasure erases the copies that every reading namespace holds of its events (their
// deliveries, dead letters and delivery-log records whose event came from it), one reading
// namespace after the other: status.progress.ends holds the erased namespace's four streams
// and the three of the reader being erased, never more, however many namespaces read it (it
// grew by three per reader). A reader's own event of the same id, and its copy of another
// event, are untouched; a reader without streams holds nothing.
func TestReadersAreErasedOneAtATimeWithBoundedEnds(t *testing.T) {
	w := newWorld(t)
	w.store("evt_ana", secret)
	w.store("evt_bob", "bob@example.com")
	const readers = 6
	var rs []Reader
	var rws []*world
	noFold := func(context.Context, string) (uint64, bool, error) { return 0, false, nil }
	for i := range readers {
		r := w.on("reader-" + strconv.Itoa(i))
		r.storeCopy("shop", "evt_ana", secret)
		r.storeCopy("shop", "evt_bob", "bob@example.com")
		r.store("evt_ana", "own-"+strconv.Itoa(i)+"@example.com")
		rs = append(rs, Reader{Set: r.set, Folded: noFold})
		rws = append(rws, r)
	}
	// A namespace that reads the erased one but has no streams yet holds no copy.
	rs = append(rs, Reader{Set: streams.DefaultConfig().For("reader-without-streams"), Folded: noFold})
	e := &Engine{JS: w.js, Set: w.set, Folded: noFold, Readers: rs}
	j := NewJob(selection(t, w.set, v1alpha1.WebhookErasureSpec{EventIDs: []string{"evt_ana"}}), Progress{})
	most := 0
	var total Counts
	for run := range 5000 {
		step, err := e.Run(context.Background(), j, 3)
		if err != nil {
			t.Fatal(err)
		}
		most = max(most, len(j.Progress.Ends))
		total.Events += step.Counts.Events
		total.Deliveries += step.Counts.Deliveries
		total.LogRecords += step.Counts.LogRecords
		total.DeadLetters += step.Counts.DeadLetters
		if step.Done {
			break
		}
		// The controller restarts now and then: the job resumes from its status.
		if run%40 == 39 {
			j = NewJob(j.Sel, j.Progress)
		}
	}
	if most > 7 {
		t.Errorf("status.progress.ends held %d streams, want at most 7 (the erased namespace's 4, one reader's 3)", most)
	}
	if want := (Counts{Events: 1, Deliveries: 2 + readers, LogRecords: 1 + readers, DeadLetters: 1 + readers}); total != want {
		t.Errorf("erased %+v, want %+v", total, want)
	}
	if left := w.holding(secret); len(left) > 0 {
		t.Errorf("the erased payload is still stored in %v", left)
	}
	for i, r := range rws {
		if left := r.holding(secret); len(left) > 0 {
			t.Errorf("reader %d still holds the erased payload in %v", i, left)
		}
		if got := r.holding("own-" + strconv.Itoa(i) + "@example.com"); len(got) != 4 {
			t.Errorf("reader %d's own event of the same id is left in %v, want all 4 streams", i, got)
		}
		if got := r.holding("bob@example.com"); len(got) != 3 {
			t.Errorf("reader %d's copy of another event is left in %v, want 3 streams", i, got)
		}
	}
}
