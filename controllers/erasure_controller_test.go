package controllers_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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
	h := nats.Header{}
	h.Set("X-Customer", marker)
	seq := d.st.Event("order.created", id, `{"email":"`+marker+`"}`, h)
	m := d.st.Delivery("orders", id, seq, at)
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
	d.st.LogBatch(records.LogRecord{DeliveryID: m.DeliveryID, EventID: id, EventType: "order.created", Namespace: d.ns, Endpoint: "orders",
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
