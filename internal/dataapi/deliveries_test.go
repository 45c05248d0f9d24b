package dataapi

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// seeded is what seed wrote: deliveries by id, with their endpoint, event and final state.
type seeded struct {
	state    map[string]datav1alpha1.DeliveryState
	endpoint map[string]string
	eventID  map[string]string
	retry    string
}

// seed writes the history of two endpoints' deliveries as the dispatcher logs them: orders'
// 120 deliveries (every third fails once first; of those, every other one is then
// dead-lettered), crm's 40 of another event type, and one orders delivery failed and waiting
// for its scheduled retry.
func (tn *tenant) seed() seeded {
	tn.t.Helper()
	st := tn.stored()
	s := seeded{state: map[string]datav1alpha1.DeliveryState{}, endpoint: map[string]string{}, eventID: map[string]string{}}
	base := time.Now().Add(-time.Hour).UTC()
	for i := range 120 {
		m := st.Delivery("orders", fmt.Sprintf("evt_orders_%d", i), uint64(i+1), base.Add(time.Duration(i)*time.Second))
		rec := records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, Namespace: tn.ns, Endpoint: "orders",
			Attempt: 1, Time: m.Created, LatencyMS: 12, LatencyUS: 12345}
		final := datav1alpha1.StateSucceeded
		if i%3 == 0 {
			next := m.Created.Add(30 * time.Second)
			failed := rec
			failed.State, failed.Reason, failed.NextAttemptAt = records.StateFailed, records.FailStatusCode, &next
			failed.Response = records.Response{StatusCode: 500, Body: "oops"}
			st.Log(failed)
			rec.Attempt = 2
			if i%2 == 0 {
				rec.State, rec.DeadLetterReason, rec.Response = records.StateDeadLetter, records.ReasonExhausted, records.Response{StatusCode: 503}
				final = datav1alpha1.StateDeadLettered
			}
		}
		if rec.State == "" {
			rec.State, rec.Response = records.StateSucceeded, records.Response{StatusCode: 204}
		}
		st.Log(rec)
		s.state[m.DeliveryID], s.endpoint[m.DeliveryID], s.eventID[m.DeliveryID] = final, "orders", m.EventID
		if i%3 == 1 {
			c := st.Delivery("crm", fmt.Sprintf("evt_crm_%d", i), uint64(1000+i), m.Created)
			c.EventType = "customer.updated"
			st.Log(records.LogRecord{DeliveryID: c.DeliveryID, EventID: c.EventID, EventType: c.EventType, Namespace: tn.ns, Endpoint: "crm",
				State: records.StateSucceeded, Attempt: 1, Time: c.Created, Response: records.Response{StatusCode: 200}})
			s.state[c.DeliveryID], s.endpoint[c.DeliveryID], s.eventID[c.DeliveryID] = datav1alpha1.StateSucceeded, "crm", c.EventID
		}
	}
	m := st.Delivery("orders", "evt_orders_retry", 500, base.Add(time.Hour))
	m.Attempts = 1
	m.History = []records.Attempt{{N: 1, Time: base.Add(time.Hour), StatusCode: 502, LatencyMS: 40, Reason: records.FailStatusCode}}
	msg := records.NewDelivery(world.cfg.For(tn.ns).RetrySubject("orders", m.DeliveryID), nil, []byte(`{"id":1}`), m)
	msg.Header.Set("Nats-Schedule", "@at "+time.Now().Add(2*time.Hour).UTC().Format(time.RFC3339))
	msg.Header.Set("Nats-Schedule-Target", world.cfg.For(tn.ns).DeliverySubject("orders"))
	if _, err := world.js.PublishMsg(context.Background(), msg); err != nil {
		tn.t.Fatal(err)
	}
	s.state[m.DeliveryID], s.endpoint[m.DeliveryID], s.eventID[m.DeliveryID] = datav1alpha1.StateRetryScheduled, "orders", m.EventID
	s.retry = m.DeliveryID
	return s
}

// list reads one page of deliveries with the query parameters kv (name, value, ...).
func list(rc rest.Interface, ns string, kv ...string) (*datav1alpha1.WebhookDeliveryList, error) {
	r := rc.Get().Namespace(ns).Resource(datav1alpha1.ResourceDeliveries)
	for i := 0; i+1 < len(kv); i += 2 {
		r = r.Param(kv[i], kv[i+1])
	}
	var l datav1alpha1.WebhookDeliveryList
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return &l, r.Do(ctx).Into(&l)
}

// all follows a list's pages of limit items to its end.
func all(t *testing.T, rc rest.Interface, ns string, limit int, kv ...string) ([]datav1alpha1.WebhookDelivery, int) {
	t.Helper()
	var items []datav1alpha1.WebhookDelivery
	cont := ""
	for pages := 1; pages < 1000; pages++ {
		q := append([]string{"limit", fmt.Sprint(limit)}, kv...)
		if cont != "" {
			q = append(q, "continue", cont)
		}
		l, err := list(rc, ns, q...)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if len(l.Items) > limit {
			t.Fatalf("page %d holds %d items, more than its limit %d", pages, len(l.Items), limit)
		}
		items = append(items, l.Items...)
		if l.Continue == "" {
			return items, pages
		}
		cont = l.Continue
	}
	t.Fatal("the list does not end")
	return nil, 0
}

func names(items []datav1alpha1.WebhookDelivery) []string {
	out := make([]string, len(items))
	for i, d := range items {
		out[i] = d.Name
	}
	return out
}

// createEndpoint creates an endpoint object the server reads patterns and holds from.
func (tn *tenant) createEndpoint(name string, types ...v1alpha1.EventTypePattern) {
	tn.t.Helper()
	ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: tn.ns, Name: name},
		Spec: v1alpha1.WebhookEndpointSpec{URL: "https://receiver.example.com/" + name, EventTypes: types}}
	if err := world.cp.Client.Create(context.Background(), ep); err != nil {
		tn.t.Fatal(err)
	}
}

func TestViewerListsPagesAndSelectsDeliveriesThroughTheAggregator(t *testing.T) {
	tn := newTenant(t)
	tn.createEndpoint("orders", "order.*")
	tn.createEndpoint("crm", "customer.*")
	s := tn.seed()
	viewer := tn.user("viewer", []string{"get", "list"}, datav1alpha1.ResourceDeliveries)

	whole, pages := all(t, viewer, tn.ns, 1000)
	if pages != 1 || len(whole) != len(s.state) {
		t.Fatalf("one page of 1000 holds %d deliveries in %d pages; want %d in 1", len(whole), pages, len(s.state))
	}
	for i, d := range whole {
		if want := s.state[d.Name]; d.Status.State != want || d.Spec.Endpoint != s.endpoint[d.Name] || d.Spec.EventID != s.eventID[d.Name] {
			t.Errorf("%s: %s of %s (event %s); want %s of %s (event %s)", d.Name, d.Status.State, d.Spec.Endpoint, d.Spec.EventID, want, s.endpoint[d.Name], s.eventID[d.Name])
		}
		if i > 0 && d.Status.Time.Time.After(whole[i-1].Status.Time.Time) {
			t.Errorf("not newest first: %s at %s after %s at %s", d.Name, d.Status.Time, whole[i-1].Name, whole[i-1].Status.Time)
		}
	}
	if whole[0].Name != s.retry || whole[0].Status.NextAttemptTime == nil || whole[0].Status.Attempts != 1 {
		t.Errorf("the newest is %+v; want the scheduled retry %s with its next attempt", whole[0], s.retry)
	}

	// Pages of 7 walk the same list, each page within its limit.
	paged, pages := all(t, viewer, tn.ns, 7)
	if !slices.Equal(names(paged), names(whole)) || pages < len(whole)/7 {
		t.Fatalf("pages of 7 (%d pages) list %d deliveries differently from one page", pages, len(paged))
	}

	// Field selectors, each with what it must select.
	since := whole[len(whole)/2].Status.Time.Time
	until := whole[len(whole)/4].Status.Time.Time
	for _, c := range []struct {
		selector string
		keep     func(d datav1alpha1.WebhookDelivery) bool
	}{
		{"spec.endpoint=orders", func(d datav1alpha1.WebhookDelivery) bool { return d.Spec.Endpoint == "orders" }},
		{"spec.endpoint=orders,status.state=DeadLettered", func(d datav1alpha1.WebhookDelivery) bool { return d.Status.State == datav1alpha1.StateDeadLettered }},
		{"spec.endpoint=orders,status.state=RetryScheduled", func(d datav1alpha1.WebhookDelivery) bool { return d.Status.State == datav1alpha1.StateRetryScheduled }},
		{"spec.endpoint=orders,spec.eventType=order.created", func(d datav1alpha1.WebhookDelivery) bool {
			return d.Spec.EventType == "order.created" && d.Spec.Endpoint == "orders"
		}},
		{"spec.endpoint=orders,spec.eventID=evt_orders_42", func(d datav1alpha1.WebhookDelivery) bool { return d.Spec.EventID == "evt_orders_42" }},
		{"since=" + since.Format(time.RFC3339Nano), func(d datav1alpha1.WebhookDelivery) bool { return !d.Status.Time.Time.Before(since) }},
		{"since=" + since.Format(time.RFC3339Nano) + ",until=" + until.Format(time.RFC3339Nano) + ",spec.endpoint=crm", func(d datav1alpha1.WebhookDelivery) bool {
			return d.Spec.Endpoint == "crm" && !d.Status.Time.Time.Before(since) && d.Status.Time.Time.Before(until)
		}},
	} {
		var want []string
		for _, d := range whole {
			if c.keep(d) {
				want = append(want, d.Name)
			}
		}
		got, _ := all(t, viewer, tn.ns, 5, "fieldSelector", c.selector)
		if !slices.Equal(names(got), want) || len(want) == 0 {
			t.Errorf("%s: got %d deliveries, want %d (%v...)", c.selector, len(got), len(want), want[:min(3, len(want))])
		}
	}

	// One delivery by its id: the retry, and a finished one.
	for _, d := range []datav1alpha1.WebhookDelivery{whole[0], whole[10]} {
		var got datav1alpha1.WebhookDelivery
		if err := viewer.Get().Namespace(tn.ns).Resource(datav1alpha1.ResourceDeliveries).Name(d.Name).Do(context.Background()).Into(&got); err != nil {
			t.Fatalf("get %s: %v", d.Name, err)
		}
		if got.Status.State != d.Status.State || got.Spec != d.Spec {
			t.Errorf("get %s: %+v; the list says %+v", d.Name, got, d)
		}
	}
	if err := viewer.Get().Namespace(tn.ns).Resource(datav1alpha1.ResourceDeliveries).Name("whdl_nosuchdelivery").Do(context.Background()).Error(); !apierrors.IsNotFound(err) {
		t.Errorf("get of an unknown delivery: %v; want 404", err)
	}
	// A get reads a bounded part of the log: the oldest delivery is beyond it, and the 404 says
	// how to find it.
	oldest := whole[len(whole)-1].Name
	err := viewer.Get().Namespace(tn.ns).Resource(datav1alpha1.ResourceDeliveries).Name(oldest).Do(context.Background()).Error()
	if !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), "since/until") {
		t.Errorf("get of a delivery beyond the lookup's bound: %v; want a 404 that says how to list it", err)
	}

	// kubectl's table.
	var raw []byte
	raw, err = viewer.Get().Namespace(tn.ns).Resource(datav1alpha1.ResourceDeliveries).Param("limit", "3").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(context.Background())
	if err != nil || !strings.Contains(string(raw), `"name":"State"`) || !strings.Contains(string(raw), s.retry) || !strings.Contains(string(raw), "RetryScheduled") {
		t.Errorf("table: %v\n%s", err, raw)
	}
}

func TestOtherNamespacesUsersAreRefused(t *testing.T) {
	tn := newTenant(t)
	other := newTenant(t)
	tn.seed()
	// A user who reads deliveries in another namespace, and one with no grant at all.
	outsider := other.user("outsider", []string{"get", "list", "watch"}, datav1alpha1.ResourceDeliveries)
	nobody := dataClient(t, "nobody")
	for who, rc := range map[string]rest.Interface{"outsider": outsider, "nobody": nobody} {
		if _, err := list(rc, tn.ns); !apierrors.IsForbidden(err) {
			t.Errorf("%s lists %s's deliveries: %v; want 403", who, tn.ns, err)
		}
	}
	if l, err := list(outsider, other.ns); err != nil || len(l.Items) != 0 {
		t.Errorf("the outsider lists its own empty namespace: %v, %d items", err, len(l.Items))
	}
}

func TestBadListsAreClear400s(t *testing.T) {
	tn := newTenant(t)
	tn.seed()
	other := newTenant(t)
	viewer := tn.user("viewer", []string{"get", "list"}, datav1alpha1.ResourceDeliveries)
	otherViewer := other.user("viewer", []string{"get", "list"}, datav1alpha1.ResourceDeliveries)
	first, err := list(viewer, tn.ns, "limit", "5")
	if err != nil || first.Continue == "" {
		t.Fatalf("first page: %v, continue %q", err, first.Continue)
	}
	for _, c := range []struct {
		name string
		rc   rest.Interface
		ns   string
		q    []string
		says string
	}{
		{"malformed selector", viewer, tn.ns, []string{"fieldSelector", "spec.endpoint"}, "invalid selector"},
		{"unknown field", viewer, tn.ns, []string{"fieldSelector", "spec.colour=blue"}, `field selector "spec.colour" is not supported`},
		{"not equality", viewer, tn.ns, []string{"fieldSelector", "spec.endpoint!=orders"}, "only = is supported"},
		{"unknown state", viewer, tn.ns, []string{"fieldSelector", "status.state=Lost"}, "want one of"},
		{"bad time", viewer, tn.ns, []string{"fieldSelector", "since=yesterday"}, "RFC 3339"},
		{"label selector", viewer, tn.ns, []string{"labelSelector", "app=x"}, "no labels"},
		{"huge limit", viewer, tn.ns, []string{"limit", "100000"}, "a page holds 1 to 1000"},
		{"continue of another query", viewer, tn.ns, []string{"continue", first.Continue, "fieldSelector", "spec.endpoint=orders"}, "another list"},
		{"continue of another namespace", otherViewer, other.ns, []string{"continue", first.Continue}, "another list"},
		{"forged continue", viewer, tn.ns, []string{"continue", "bm90IGEgdG9rZW4"}, "not one this server made"},
		{"a body filter over too much", viewer, tn.ns, []string{"fieldSelector", "spec.eventType=order.created"}, "narrow it"},
		{"since after until", viewer, tn.ns, []string{"fieldSelector", "since=1h,until=2h"}, "must be before until"},
		{"unknown view", viewer, tn.ns, []string{"fieldSelector", "view=everything"}, "the one view is attempts"},
		{"attempts of queued deliveries", viewer, tn.ns, []string{"fieldSelector", "view=attempts,status.state=Queued"}, "have none yet"},
	} {
		_, err := list(c.rc, c.ns, c.q...)
		if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v; want 400 saying %q", c.name, err, c.says)
		}
	}
	// The attempts view lists every attempt of the log: more items than deliveries, each
	// delivery as that attempt left it.
	deliveries, err := list(viewer, tn.ns, "fieldSelector", "spec.endpoint=crm,status.state=Succeeded", "limit", "1000")
	if err != nil {
		t.Fatal(err)
	}
	attempts, err := list(viewer, tn.ns, "fieldSelector", "spec.endpoint=crm,view=attempts", "limit", "1000")
	if err != nil || len(attempts.Items) < len(deliveries.Items) || len(attempts.Items) == 0 {
		t.Errorf("the attempts view: %v, %d items for %d succeeded deliveries", err, len(attempts.Items), len(deliveries.Items))
	}
	for _, a := range attempts.Items {
		if len(a.Status.AttemptHistory) != 1 || a.Status.AttemptHistory[0].Number != a.Status.Attempts {
			t.Errorf("an attempt of the view: %+v", a.Status)
		}
	}
	// The body filter is answered once its range is narrow enough.
	if _, err := list(viewer, tn.ns, "fieldSelector", "spec.eventType=order.created,spec.endpoint=crm"); err != nil {
		t.Errorf("a narrow body filter: %v", err)
	}
}
