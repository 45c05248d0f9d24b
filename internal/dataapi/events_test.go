package dataapi

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
)

func createEvent(rc rest.Interface, ns string, ev *datav1alpha1.WebhookEvent, kv ...string) (*datav1alpha1.WebhookEvent, error) {
	r := rc.Post().Namespace(ns).Resource(datav1alpha1.ResourceEvents).Body(ev)
	for i := 0; i+1 < len(kv); i += 2 {
		r = r.Param(kv[i], kv[i+1])
	}
	var out datav1alpha1.WebhookEvent
	return &out, r.Do(context.Background()).Into(&out)
}

// event is a WebhookEvent; data "" leaves its data out.
func event(id, typ, data string) *datav1alpha1.WebhookEvent {
	e := &datav1alpha1.WebhookEvent{ObjectMeta: metav1.ObjectMeta{Name: id},
		Spec: datav1alpha1.WebhookEventSpec{Type: typ, Headers: map[string]string{"X-Tenant": "acme"}}}
	if data != "" {
		e.Spec.Data = runtime.RawExtension{Raw: []byte(data)}
	}
	return e
}

func TestCreatingAWebhookEventPublishesItAsTheIngressDoes(t *testing.T) {
	tn := newTenant(t)
	producer := tn.user("producer", []string{"create"}, datav1alpha1.ResourceEvents)
	viewer := tn.user("viewer", []string{"get", "list"}, datav1alpha1.ResourceDeliveries)

	got, err := createEvent(producer, tn.ns, event("evt-1", "order.created", `{"order":1}`))
	if err != nil || got.Status.Sequence == 0 || got.Status.Stream != world.cfg.For(tn.ns).EventsStream() || got.Status.Duplicate {
		t.Fatalf("create: %v %+v", err, got.Status)
	}
	again, err := createEvent(producer, tn.ns, event("evt-1", "order.created", `{"order":1}`))
	if err != nil || !again.Status.Duplicate || again.Status.Sequence != got.Status.Sequence {
		t.Errorf("the same event again: %v %+v; want a duplicate of sequence %d", err, again.Status, got.Status.Sequence)
	}
	msgs := tn.stored().Msgs(world.cfg.For(tn.ns).EventsStream(), world.cfg.For(tn.ns).EventSubject("order.created"))
	if len(msgs) != 1 || string(msgs[0].Data) != `{"order":1}` || msgs[0].Header.Get("X-Tenant") != "acme" || msgs[0].Header.Get("Nats-Msg-Id") != "evt-1" {
		t.Fatalf("stored: %+v", msgs)
	}

	// The ingress's refusals, as API errors; nothing is stored.
	for _, c := range []struct {
		name string
		ev   *datav1alpha1.WebhookEvent
		kv   []string
		is   func(error) bool
		says string
	}{
		{"an operator header", func() *datav1alpha1.WebhookEvent {
			e := event("evt-2", "order.created", `{}`)
			e.Spec.Headers = map[string]string{"Whk-Attempts": "9"}
			return e
		}(), nil, apierrors.IsBadRequest, "Whk-"},
		{"a type that is no subject token", event("evt-3", "order created", `{}`), nil, apierrors.IsBadRequest, "subject token"},
		{"an operational event", event("evt-4", "webhook_operator.endpoint.disabled", `{}`), nil, apierrors.IsForbidden, "operational events"},
		{"no data", event("evt-5", "order.created", ``), nil, apierrors.IsBadRequest, "no data"},
		{"a bad time", func() *datav1alpha1.WebhookEvent {
			e := event("evt-6", "order.created", `{}`)
			e.Spec.Time = "yesterday"
			return e
		}(), nil, apierrors.IsBadRequest, "RFC 3339"},
	} {
		_, err := createEvent(producer, tn.ns, c.ev, c.kv...)
		if !c.is(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v; want the ingress's refusal saying %q", c.name, err, c.says)
		}
	}
	if n := len(tn.stored().Msgs(world.cfg.For(tn.ns).EventsStream(), ">")); n != 1 {
		t.Errorf("%d events stored; want the first alone", n)
	}
	// An unknown field is refused by strict decoding, and a viewer may not publish.
	raw := []byte(`{"apiVersion":"data.webhook-operator.io/v1alpha1","kind":"WebhookEvent","metadata":{"name":"evt-7"},"spec":{"type":"order.created","data":{},"colour":"blue"}}`)
	err = producer.Post().Namespace(tn.ns).Resource(datav1alpha1.ResourceEvents).Param("fieldValidation", "Strict").Body(raw).
		SetHeader("Content-Type", "application/json").Do(context.Background()).Error()
	if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), "colour") {
		t.Errorf("an unknown field: %v; want 400 naming it", err)
	}
	if _, err := createEvent(viewer, tn.ns, event("evt-8", "order.created", `{}`)); !apierrors.IsForbidden(err) {
		t.Errorf("the viewer's create: %v; want 403", err)
	}
}
