package dataapi

import (
	"context"
	"strconv"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

func watchDeliveries(t *testing.T, rc rest.Interface, ns, rv, selector string) (watch.Interface, error) {
	t.Helper()
	r := rc.Get().Namespace(ns).Resource(datav1alpha1.ResourceDeliveries).Param("watch", "true").Param("resourceVersion", rv)
	if selector != "" {
		r = r.Param("fieldSelector", selector)
	}
	return r.Watch(context.Background())
}

// next waits for the watch's next event.
func next(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatal("the watch ended")
		}
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30s")
	}
	return watch.Event{}
}

func TestWatchSeesOutcomesAsTheyAreLogged(t *testing.T) {
	tn := newTenant(t)
	tn.seed()
	viewer := tn.user("viewer", []string{"get", "list", "watch"}, datav1alpha1.ResourceDeliveries)
	l, err := list(viewer, tn.ns, "limit", "1")
	if err != nil {
		t.Fatal(err)
	}
	w, err := watchDeliveries(t, viewer, tn.ns, l.ResourceVersion, "spec.endpoint=orders")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	st := tn.stored()
	m := st.Delivery("orders", "evt_watched", 900, time.Now())
	next30 := time.Now().Add(30 * time.Second).UTC()
	rec := records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, Namespace: tn.ns, Endpoint: "orders",
		State: records.StateFailed, Attempt: 1, Time: time.Now(), Reason: records.FailTimeout, NextAttemptAt: &next30, Response: records.Response{Error: "timeout"}}
	st.Log(records.LogRecord{DeliveryID: "whdl_othersendpoint", Namespace: tn.ns, Endpoint: "crm", State: records.StateSucceeded, Attempt: 1, Time: time.Now()})
	st.Log(rec)
	rec.State, rec.Attempt, rec.Reason, rec.NextAttemptAt, rec.Response = records.StateSucceeded, 2, "", nil, records.Response{StatusCode: 200}
	seq := st.Log(rec)

	first := next(t, w)
	d, ok := first.Object.(*datav1alpha1.WebhookDelivery)
	if first.Type != watch.Added || !ok || d.Name != m.DeliveryID || d.Status.State != datav1alpha1.StateRetryScheduled || d.Status.NextAttemptTime == nil {
		t.Fatalf("first event: %s %+v; want ADDED %s RetryScheduled", first.Type, first.Object, m.DeliveryID)
	}
	second := next(t, w)
	d, ok = second.Object.(*datav1alpha1.WebhookDelivery)
	if second.Type != watch.Modified || !ok || d.Name != m.DeliveryID || d.Status.State != datav1alpha1.StateSucceeded || d.ResourceVersion != itoa(seq) {
		t.Fatalf("second event: %s %+v; want MODIFIED %s Succeeded at %d", second.Type, second.Object, m.DeliveryID, seq)
	}

	// A watch from an older resource version sees what was logged after it.
	again, err := watchDeliveries(t, viewer, tn.ns, itoa(seq-1), "")
	if err != nil {
		t.Fatal(err)
	}
	defer again.Stop()
	if ev := next(t, again); ev.Object.(*datav1alpha1.WebhookDelivery).ResourceVersion != itoa(seq) {
		t.Errorf("resumed watch: %+v; want the outcome at %d", ev.Object, seq)
	}

	// Another namespace's user may not watch here.
	outsider := newTenant(t).user("outsider", []string{"get", "list", "watch"}, datav1alpha1.ResourceDeliveries)
	if _, err := watchDeliveries(t, outsider, tn.ns, "", ""); !apierrors.IsForbidden(err) {
		t.Errorf("the outsider's watch: %v; want 403", err)
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
