package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// tenantData is a namespace with an endpoint and what its dispatcher would have stored of one
// event: the event, a scheduled retry, a dead letter and delivery-log records.
type tenantData struct {
	t   *testing.T
	ns  string
	set streams.Set
	st  testenv.Stored
}

func newTenantData(t *testing.T, change ...func(*v1alpha1.WebhookEndpoint)) *tenantData {
	ns := newNamespace(t)
	create(t, endpoint(ns, "orders", change...))
	markAvailable(t, ns, names.SharedDispatcher)
	eventuallyReady(t, ns, "orders", "True/Ready")
	set := layout.For(ns)
	d := &tenantData{t: t, ns: ns, set: set, st: testenv.Stored{T: t, JS: testJS, Set: set}}
	// The endpoint's health counts include the whole log, as its dispatcher's fold would
	// once it has read it.
	kv, err := testJS.KeyValue(context.Background(), set.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), streams.HealthKey("orders"), []byte(`{"folded":1000000000}`)); err != nil {
		t.Fatal(err)
	}
	return d
}

// store writes one event whose payload holds marker, and what a failing delivery of it left.
func (d *tenantData) store(id, marker string, at time.Time) {
	d.storeTyped(id, "order.created", marker, at, time.Time{})
}

// storeTyped is store of an event of type typ whose time (Webhook-Event-Time) is eventTime
// when set.
func (d *tenantData) storeTyped(id, typ, marker string, at, eventTime time.Time) {
	h := nats.Header{}
	h.Set("X-Customer", marker)
	if !eventTime.IsZero() {
		h.Set(records.HeaderEventTime, eventTime.UTC().Format(time.RFC3339Nano))
	}
	seq := d.st.Event(typ, id, `{"email":"`+marker+`"}`, h)
	m := d.st.Delivery("orders", id, seq, at)
	m.EventType = typ
	if !eventTime.IsZero() {
		m.EventTime = eventTime
	}
	retry := records.NewDelivery(d.set.RetrySubject("orders", m.DeliveryID), h, []byte(`{"email":"`+marker+`"}`), m)
	retry.Header.Set("Nats-Schedule", "@at "+at.Add(time.Hour).UTC().Format(time.RFC3339Nano))
	retry.Header.Set("Nats-Schedule-Target", d.set.DeliverySubject("orders"))
	if _, err := testJS.PublishMsg(context.Background(), retry); err != nil {
		d.t.Fatal(err)
	}
	dm := m
	dm.DeliveryID = records.DeliveryID(id, d.ns, "orders-old")
	dlh := nats.Header{}
	dlh.Set("X-Customer", marker)
	d.st.DeadLetter(dm, 2, records.ReasonExhausted, `{"email":"`+marker+`"}`, at, dlh)
	d.st.LogBatch(records.LogRecord{DeliveryID: m.DeliveryID, EventID: id, EventType: typ, Namespace: d.ns, Endpoint: "orders",
		State: records.StateFailed, Attempt: 1, Time: at, RequestHeaders: map[string]string{"X-Customer": marker},
		Response: records.Response{StatusCode: 500, Body: "no such customer " + marker}})
}

// holding lists the streams of the namespace holding marker.
func (d *tenantData) holding(marker string) []string { return d.st.Holding(marker) }

func getErasure(g Gomega, ns, name string) *v1alpha1.WebhookErasure {
	wx := &v1alpha1.WebhookErasure{}
	g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, wx)).To(Succeed())
	return wx
}

// A WebhookErasure of event ids leaves none of their payloads in any stream of the namespace,
// keeps the other event's, reports its counts, announces itself with an operational event,
// and a second one of the same ids erases nothing.
func TestWebhookErasureErasesEveryStoredPayloadOfItsEvents(t *testing.T) {
	g := NewWithT(t)
	d := newTenantData(t)
	now := time.Now()
	d.store("evt_ana", "ana@example.com", now)
	d.store("evt_bob", "bob@example.com", now)
	g.Expect(d.holding("ana@example.com")).To(HaveLen(4))

	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "ana"},
		Spec: v1alpha1.WebhookErasureSpec{EventIDs: []string{"evt_ana"}}})
	var wx *v1alpha1.WebhookErasure
	g.Eventually(func(g Gomega) {
		wx = getErasure(g, d.ns, "ana")
		g.Expect(meta.IsStatusConditionTrue(wx.Status.Conditions, v1alpha1.ConditionComplete)).To(BeTrue(), "%+v", wx.Status)
	}).WithTimeout(2 * timeout).WithPolling(interval).Should(Succeed())
	g.Expect(wx.Status.Erased).To(Equal(v1alpha1.ErasureCounts{Events: 1, Deliveries: 1, DeliveryLogRecords: 1, DeadLetters: 1}))
	g.Expect(wx.Status.Matched).To(Equal(int64(1)))
	g.Expect(meta.IsStatusConditionTrue(wx.Status.Conditions, v1alpha1.ConditionReady)).To(BeTrue())
	g.Expect(d.holding("ana@example.com")).To(BeEmpty(), "the erased payload is still stored")
	g.Expect(d.holding("bob@example.com")).To(HaveLen(4), "another event's payload was touched")

	ops := d.st.Msgs(d.set.EventsStream(), d.set.EventSubject(records.OpsErasureCompleted))
	g.Expect(ops).To(HaveLen(1))
	g.Expect(string(ops[0].Data)).To(And(ContainSubstring(`"erasure":"ana"`), ContainSubstring(`"events":1`)))

	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "ana-again"},
		Spec: v1alpha1.WebhookErasureSpec{EventIDs: []string{"evt_ana"}}})
	g.Eventually(func(g Gomega) {
		again := getErasure(g, d.ns, "ana-again")
		g.Expect(meta.IsStatusConditionTrue(again.Status.Conditions, v1alpha1.ConditionComplete)).To(BeTrue())
		g.Expect(again.Status.Erased).To(Equal(v1alpha1.ErasureCounts{}))
	}).WithTimeout(2 * timeout).WithPolling(interval).Should(Succeed())
}

// An erasure naming another namespace's subjects is refused, and changes nothing.
func TestWebhookErasureIsRefusedOutsideItsNamespace(t *testing.T) {
	g := NewWithT(t)
	d := newTenantData(t)
	d.store("evt_1", "carol@example.com", time.Now())
	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "elsewhere"},
		Spec: v1alpha1.WebhookErasureSpec{Subjects: []string{"webhooks.other.>"}}})
	g.Eventually(func(g Gomega) {
		wx := getErasure(g, d.ns, "elsewhere")
		c := meta.FindStatusCondition(wx.Status.Conditions, v1alpha1.ConditionStalled)
		g.Expect(c).NotTo(BeNil(), "%+v", wx.Status)
		g.Expect(c.Reason).To(Equal(v1alpha1.ReasonOutsideNamespace))
		g.Expect(c.Message).To(ContainSubstring("webhooks." + d.ns + "."))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(d.holding("carol@example.com")).To(HaveLen(4))
}

// Payload retention: a dead letter and a log record older than their endpoint's retention
// keep their record without the payload; younger ones keep it.
func TestPayloadRetentionRemovesExpiredPayloads(t *testing.T) {
	g := NewWithT(t)
	d := newTenantData(t, func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.PayloadRetention = &v1alpha1.PayloadRetention{DeadLetters: &metav1.Duration{Duration: 2 * time.Second},
			DeliveryLog: &metav1.Duration{Duration: 2 * time.Second}}
	})
	d.store("evt_old", "old@example.com", time.Now())
	g.Eventually(func() []string { return d.holding("old@example.com") }).WithTimeout(timeout).WithPolling(interval).
		Should(ConsistOf(d.set.EventsStream(), d.set.DeliveriesStream()), "the log and dead letters still hold the payload")
	var dl records.DeadLetter
	for _, m := range d.st.Msgs(d.set.DeadLetterStream(), ">") {
		var err error
		dl, err = records.ParseDeadLetter(m.Header)
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(dl.PayloadRemoved).To(Equal(records.PayloadExpired))
	g.Expect(dl.Attempts).To(HaveLen(2))
	g.Expect(dl.Reason).To(Equal(records.ReasonExhausted))
	recs := records.LogRecords(d.st.Msgs(d.set.AttemptsStream(), ">")[0].Data)
	g.Expect(recs).To(HaveLen(1))
	g.Expect(recs[0].PayloadRemoved).To(Equal(records.PayloadExpired))
	g.Expect(recs[0].Response.StatusCode).To(Equal(500))
}

// waitErasure waits for erasure name of the namespace to complete and returns it.
func (d *tenantData) waitErasure(name string) *v1alpha1.WebhookErasure {
	d.t.Helper()
	var wx *v1alpha1.WebhookErasure
	testenv.Eventually(d.t, 2*timeout, func() bool {
		wx = &v1alpha1.WebhookErasure{}
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: d.ns, Name: name}, wx); err != nil {
			return false
		}
		return meta.IsStatusConditionTrue(wx.Status.Conditions, v1alpha1.ConditionComplete)
	}, "erasure %s did not complete: %+v", name, lazyStatus(func() any { return wx.Status }))
	return wx
}

// An erasure by subject erases the events published on it, and one by time range those whose
// time is in it (Webhook-Event-Time), from every stream; the others keep their payloads.
func TestWebhookErasureBySubjectAndTimeRange(t *testing.T) {
	d := newTenantData(t)
	now := time.Now()
	d.storeTyped("evt_user", "user.deleted", "dora@example.com", now, now.Add(-3*time.Hour))
	d.storeTyped("evt_old", "order.created", "ed@example.com", now, now.Add(-3*time.Hour))
	d.storeTyped("evt_new", "order.created", "fay@example.com", now, now)
	for _, m := range []string{"dora@example.com", "ed@example.com", "fay@example.com"} {
		if got := d.holding(m); len(got) != 4 {
			t.Fatalf("%s is stored in %v before any erasure", m, got)
		}
	}

	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "users"},
		Spec: v1alpha1.WebhookErasureSpec{Subjects: []string{"webhooks." + d.ns + ".user.>"}}})
	if wx := d.waitErasure("users"); wx.Status.Erased.Events != 1 || wx.Status.Matched != 1 {
		t.Errorf("by subject: matched %d, erased %+v; want the one user event", wx.Status.Matched, wx.Status.Erased)
	}
	if got := d.holding("dora@example.com"); len(got) != 0 {
		t.Errorf("the user event's payload is still in %v", got)
	}

	until := metav1.NewTime(now.Add(-time.Hour))
	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "before"},
		Spec: v1alpha1.WebhookErasureSpec{Until: &until}})
	if wx := d.waitErasure("before"); wx.Status.Erased.Events != 1 {
		t.Errorf("until an hour ago: matched %d, erased %+v; want evt_old's event (evt_user's is already gone)", wx.Status.Matched, wx.Status.Erased)
	}
	if got := d.holding("ed@example.com"); len(got) != 0 {
		t.Errorf("the old event's payload is still in %v", got)
	}
	if got := d.holding("fay@example.com"); len(got) != 4 {
		t.Errorf("the new event's payload is in %v only, want all four streams", got)
	}
}

// A namespace's retention (its WebhookQuota's spec.retention) applies to every endpoint's
// records, those of an endpoint without a retention of its own included.
func TestNamespaceRetentionRemovesExpiredPayloads(t *testing.T) {
	d := newTenantData(t)
	two := &metav1.Duration{Duration: 2 * time.Second}
	create(t, &v1alpha1.WebhookQuota{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: v1alpha1.QuotaName},
		Spec: v1alpha1.WebhookQuotaSpec{Retention: &v1alpha1.PayloadRetention{DeadLetters: two, DeliveryLog: two}}})
	d.store("evt_ns_old", "gil@example.com", time.Now())
	want := []string{d.set.EventsStream(), d.set.DeliveriesStream()}
	testenv.Eventually(t, timeout, func() bool { return slices.Equal(sorted(d.holding("gil@example.com")), sorted(want)) },
		"the payload is in %v, want only %v (the log and dead letters past the namespace's retention)", lazyStatus(func() any { return d.holding("gil@example.com") }), want)
	for _, m := range d.st.Msgs(d.set.DeadLetterStream(), ">") {
		dl, err := records.ParseDeadLetter(m.Header)
		if err != nil || dl.PayloadRemoved != records.PayloadExpired || len(dl.Attempts) != 2 {
			t.Errorf("dead letter after retention: %+v %v", dl, err)
		}
	}
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

type lazyValue func() any

func (f lazyValue) String() string { return fmt.Sprintf("%+v", f()) }

func lazyStatus(f func() any) fmt.Stringer { return lazyValue(f) }

// setFolded says how far the endpoint's health counts include the delivery log.
func (d *tenantData) setFolded(seq uint64) {
	d.t.Helper()
	kv, err := testJS.KeyValue(context.Background(), d.set.Bucket())
	if err != nil {
		d.t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), streams.HealthKey("orders"), fmt.Appendf(nil, `{"folded":%d}`, seq)); err != nil {
		d.t.Fatal(err)
	}
}

// erasureCondition is the reason and message of erasure name's Complete condition, or its
// Stalled one when it is stalled.
func (d *tenantData) erasureCondition(name string) (string, string) {
	wx := &v1alpha1.WebhookErasure{}
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: d.ns, Name: name}, wx); err != nil {
		return "", err.Error()
	}
	if c := meta.FindStatusCondition(wx.Status.Conditions, v1alpha1.ConditionStalled); c != nil && c.Status == metav1.ConditionTrue {
		return c.Reason, c.Message
	}
	if c := meta.FindStatusCondition(wx.Status.Conditions, v1alpha1.ConditionComplete); c != nil && c.ObservedGeneration == wx.Generation {
		return c.Reason, c.Message
	}
	return "", ""
}

// waitReason waits for erasure name's condition to have reason, and returns its message.
func (d *tenantData) waitReason(name, reason string) string {
	d.t.Helper()
	var got, msg string
	testenv.Eventually(d.t, 2*timeout, func() bool {
		got, msg = d.erasureCondition(name)
		return got == reason
	}, "erasure %s: reason %q (%s), want %s", name, lazyStatus(func() any { return got }), lazyStatus(func() any { return msg }), reason)
	return msg
}

// erasuresRunning is the controller's webhook_erasures_running of namespace ns.
func erasuresRunning(t *testing.T, ns string) float64 {
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "webhook_erasures_running" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "namespace" && l.GetValue() == ns {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// One erasure of a namespace is in progress at a time (the default): a second one waits,
// Queued, and says so. An erasure deleted mid-run gives its place (and the event ids its job
// held) back at once: the queued one starts, and completes.
func TestWebhookErasuresQueueAndADeletedOneIsForgotten(t *testing.T) {
	d := newTenantData(t)
	now := time.Now()
	d.store("evt_a", "hal@example.com", now)
	d.store("evt_b", "ida@example.com", now)
	// The endpoint's counts do not include the log yet: an erasure stays in progress, waiting
	// for the fold before it rewrites a log record.
	d.setFolded(0)

	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "first"},
		Spec: v1alpha1.WebhookErasureSpec{EventIDs: []string{"evt_a"}}})
	d.waitReason("first", v1alpha1.ReasonWaitingForFold)
	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "second"},
		Spec: v1alpha1.WebhookErasureSpec{EventIDs: []string{"evt_b"}}})
	msg := d.waitReason("second", v1alpha1.ReasonQueued)
	if !strings.Contains(msg, "1 erasures of namespace "+d.ns+" are in progress, and a namespace runs at most 1 at once") {
		t.Errorf("the queued erasure says %q", msg)
	}
	if n := erasuresRunning(t, d.ns); n != 1 {
		t.Errorf("webhook_erasures_running = %v, want 1", n)
	}

	first := &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "first"}}
	if err := k8s.Delete(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	d.waitReason("second", v1alpha1.ReasonWaitingForFold)
	d.setFolded(1_000_000_000)
	if wx := d.waitErasure("second"); wx.Status.Erased.Events != 1 {
		t.Errorf("the second erasure erased %+v, want evt_b's event", wx.Status.Erased)
	}
	testenv.Eventually(t, timeout, func() bool { return erasuresRunning(t, d.ns) == 0 },
		"webhook_erasures_running of %s is %v once every erasure ended", d.ns, lazyStatus(func() any { return erasuresRunning(t, d.ns) }))
	if got := d.holding("hal@example.com"); len(got) != 4 {
		t.Errorf("the deleted erasure's event is held in %v, want all four streams (it was stopped before it erased anything)", got)
	}
}

// The expression of issue 30 is refused when the erasure is read (InvalidExpression), and one
// within the cost estimate that builds too much on a stored event stops the erasure: Stalled
// ExpressionLimit, with the bound and the event, nothing erased; the controller that ran it
// goes on, and a later erasure of the namespace completes.
func TestWebhookErasureStopsAtAnExpressionBound(t *testing.T) {
	d := newTenantData(t)
	d.store("evt_x", "jo@example.com", time.Now())
	ranges := func(n, count int) string {
		return strings.TrimSuffix(strings.Repeat(fmt.Sprintf("lists.range(%d), ", n), count), ", ")
	}

	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "issue-30"},
		Spec: v1alpha1.WebhookErasureSpec{Expression: "size([" + ranges(1000000, 99) + "]) > 0"}})
	if msg := d.waitReason("issue-30", v1alpha1.ReasonInvalidExpression); !strings.Contains(msg, "lists.range(1000000): an expression makes ranges of at most 10000 elements") {
		t.Errorf("the issue's expression: %q", msg)
	}

	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "builds-too-much"},
		Spec: v1alpha1.WebhookErasureSpec{Expression: "size([" + ranges(10000, 180) + "]) > 0"}})
	msg := d.waitReason("builds-too-much", v1alpha1.ReasonExpressionLimit)
	for _, want := range []string{"spec.expression", "built more than 33554432 bytes", "event evt_x"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the stopped erasure says %q, without %q", msg, want)
		}
	}
	if got := d.holding("jo@example.com"); len(got) != 4 {
		t.Errorf("after the stopped erasure the event is held in %v, want all four streams", got)
	}

	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: "by-id"},
		Spec: v1alpha1.WebhookErasureSpec{EventIDs: []string{"evt_x"}}})
	if wx := d.waitErasure("by-id"); wx.Status.Erased.Events != 1 {
		t.Errorf("a later erasure erased %+v, want the event", wx.Status.Erased)
	}
	if reason, _ := d.erasureCondition("builds-too-much"); reason != v1alpha1.ReasonExpressionLimit {
		t.Errorf("the stopped erasure is now %q, want still %s", reason, v1alpha1.ReasonExpressionLimit)
	}
}

// A dead letter written of a replay keeps the original dead letter's retention deadline
// (Whk-Retain-From): stored now, its payload is removed once the original's retention has
// passed, while a dead letter stored beside it keeps its own.
func TestPayloadRetentionKeepsAReplayedDeadLettersDeadline(t *testing.T) {
	d := newTenantData(t, func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.PayloadRetention = &v1alpha1.PayloadRetention{DeadLetters: &metav1.Duration{Duration: time.Hour}}
	})
	now := time.Now()
	plain := d.st.Delivery("orders", "evt_plain", 1, now)
	d.st.DeadLetter(plain, 1, records.ReasonExhausted, `{"email":"kim@example.com"}`, now, nil)
	replayed := d.st.Delivery("orders", "evt_replayed", 2, now)
	replayed.ReplayOf = "whdl_original"
	replayed.RetainFrom = now.Add(-2 * time.Hour) // the original was dead-lettered two hours ago
	d.st.DeadLetter(replayed, 1, records.ReasonExhausted, `{"email":"lou@example.com"}`, now, nil)

	testenv.Eventually(t, timeout, func() bool { return len(d.holding("lou@example.com")) == 0 },
		"the replay's dead letter still holds its payload in %v: its original's retention passed an hour ago", lazyStatus(func() any { return d.holding("lou@example.com") }))
	if got := d.holding("kim@example.com"); !slices.Equal(got, []string{d.set.DeadLetterStream()}) {
		t.Errorf("the dead letter stored beside it holds its payload in %v, want the dead letters (its own retention has an hour to go)", got)
	}
	for _, m := range d.st.Msgs(d.set.DeadLetterStream(), ">") {
		dl, err := records.ParseDeadLetter(m.Header)
		if err != nil {
			t.Fatal(err)
		}
		if dl.EventID == "evt_replayed" && (dl.PayloadRemoved != records.PayloadExpired || dl.RetainFrom == nil) {
			t.Errorf("the replay's dead letter: %+v, want its payload expired and its retention time kept", dl)
		}
	}
}

// storeCopy writes what d's endpoint "orders", reading namespace from, holds of from's event
// id: a delivery (a retry held in place), a dead letter and a delivery-log record, each with
// marker in its payload.
func (d *tenantData) storeCopy(from, id, marker string, at time.Time) {
	h := nats.Header{}
	h.Set("X-Customer", marker)
	m := records.DeliveryMeta{EventID: id, EventType: "order.created", EventTime: at, EventSeq: 1, EventNamespace: from,
		Namespace: d.ns, Endpoint: "orders", Created: at, DeliveryID: records.DeliveryID(from+"/"+id, d.ns, "orders")}
	if _, err := testJS.PublishMsg(context.Background(), records.NewDelivery(d.set.DeliverySubject("orders"), h, []byte(`{"email":"`+marker+`"}`), m)); err != nil {
		d.t.Fatal(err)
	}
	d.st.DeadLetter(m, 2, records.ReasonExhausted, `{"email":"`+marker+`"}`, at, h)
	d.st.LogBatch(records.LogRecord{DeliveryID: m.DeliveryID, EventID: id, EventNamespace: from, EventType: "order.created",
		Namespace: d.ns, Endpoint: "orders", State: records.StateFailed, Attempt: 1, Time: at,
		Response: records.Response{StatusCode: 500, Body: "no such customer " + marker}})
}

// An erasure also erases the copies of its events that the namespaces reading its namespace
// (spec.sourceNamespaces) hold: their deliveries, dead letters and delivery-log records of its
// events, one reading namespace after the other; a reader's own event of the same id, and its
// copy of another event, are untouched. Its status.progress.ends holds the erased namespace's
// four streams and one reader's three, never more (it grew by three per reader).
func TestWebhookErasureErasesTheCopiesOfReadingNamespaces(t *testing.T) {
	g := NewWithT(t)
	b := newTenantData(t)
	readers := []*tenantData{newTenantData(t), newTenantData(t)}
	for _, r := range readers {
		create(t, endpoint(r.ns, "reader", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.SourceNamespaces = []string{b.ns} }))
	}
	now := time.Now()
	b.store("evt_ana", "ana@example.com", now)
	b.store("evt_bob", "bob@example.com", now)
	for i, r := range readers {
		r.store("evt_ana", fmt.Sprintf("own-%d@example.com", i), now)
		r.storeCopy(b.ns, "evt_ana", "ana@example.com", now)
		r.storeCopy(b.ns, "evt_bob", "bob@example.com", now)
		g.Expect(sorted(r.holding("ana@example.com"))).To(Equal(sorted([]string{r.set.DeliveriesStream(), r.set.DeadLetterStream(), r.set.AttemptsStream()})))
	}

	create(t, &v1alpha1.WebhookErasure{ObjectMeta: metav1.ObjectMeta{Namespace: b.ns, Name: "ana"},
		Spec: v1alpha1.WebhookErasureSpec{EventIDs: []string{"evt_ana"}}})
	var wx *v1alpha1.WebhookErasure
	most := 0
	g.Eventually(func(g Gomega) {
		wx = getErasure(g, b.ns, "ana")
		if p := wx.Status.Progress; p != nil {
			most = max(most, len(p.Ends))
		}
		g.Expect(meta.IsStatusConditionTrue(wx.Status.Conditions, v1alpha1.ConditionComplete)).To(BeTrue(), "%+v", wx.Status)
	}).WithTimeout(2 * timeout).WithPolling(interval).Should(Succeed())
	g.Expect(b.holding("ana@example.com")).To(BeEmpty(), "the erased payload is still stored in its namespace")
	for i, r := range readers {
		g.Expect(r.holding("ana@example.com")).To(BeEmpty(), "reading namespace %d still holds the erased payload", i)
		g.Expect(r.holding(fmt.Sprintf("own-%d@example.com", i))).To(HaveLen(4), "reading namespace %d's own event of the same id was touched", i)
		g.Expect(r.holding("bob@example.com")).To(HaveLen(3), "reading namespace %d's copy of another event was touched", i)
	}
	g.Expect(b.holding("bob@example.com")).To(HaveLen(4), "the other event was touched")
	g.Expect(wx.Status.Erased).To(Equal(v1alpha1.ErasureCounts{Events: 1, Deliveries: 3, DeliveryLogRecords: 3, DeadLetters: 3}))
	g.Expect(max(most, len(wx.Status.Progress.Ends))).To(BeNumerically("<=", 7), "status.progress.ends %v", wx.Status.Progress.Ends)
}
