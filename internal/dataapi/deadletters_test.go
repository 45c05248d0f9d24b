package dataapi

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

func dlqList(rc rest.Interface, ns string, kv ...string) (*datav1alpha1.WebhookDeadLetterList, error) {
	r := rc.Get().Namespace(ns).Resource(datav1alpha1.ResourceDeadLetters)
	for i := 0; i+1 < len(kv); i += 2 {
		r = r.Param(kv[i], kv[i+1])
	}
	var l datav1alpha1.WebhookDeadLetterList
	return &l, r.Do(context.Background()).Into(&l)
}

// purgeEvents are the operational events of purges stored in the namespace's events stream.
func (tn *tenant) purgeEvents() []map[string]any {
	tn.t.Helper()
	var out []map[string]any
	for _, m := range tn.stored().Msgs(world.cfg.For(tn.ns).EventsStream(), world.cfg.For(tn.ns).EventSubject(records.OpsDeadLettersPurged)) {
		var ev map[string]any
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			tn.t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}

func TestDeadLettersAreListedAndPurgedByWhomRBACAllows(t *testing.T) {
	tn := newTenant(t)
	st := tn.stored()
	at := time.Now().Add(-time.Hour)
	var ids []string
	for i, c := range []struct{ ep, reason string }{
		{"orders", records.ReasonExhausted}, {"orders", records.ReasonTestFailed}, {"orders", records.ReasonExhausted},
		{"crm", records.ReasonEndpointDisabled}, {"orders", records.ReasonExhausted}, {"orders", records.ReasonTestFailed},
	} {
		m := st.Delivery(c.ep, fmt.Sprintf("evt_dl_%d", i), uint64(i+1), at)
		st.DeadLetter(m, 3, c.reason, `{"order":1}`, at.Add(time.Duration(i)*time.Minute), nil)
		ids = append(ids, m.DeliveryID)
	}
	viewer := tn.user("viewer", []string{"get", "list"}, datav1alpha1.ResourceDeadLetters)
	editor := tn.user("editor", []string{"get", "list", "delete", "deletecollection"}, datav1alpha1.ResourceDeadLetters)
	outsider := newTenant(t).user("outsider", []string{"get", "list", "delete", "deletecollection"}, datav1alpha1.ResourceDeadLetters)

	l, err := dlqList(viewer, tn.ns)
	if err != nil || len(l.Items) != 6 || l.Items[0].Name != ids[5] || l.Items[5].Name != ids[0] {
		t.Fatalf("viewer's list: %v, %d items; want 6 newest first", err, len(l.Items))
	}
	if d := l.Items[0]; d.Status.Reason != records.ReasonTestFailed || len(d.Status.Attempts) != 3 || d.Status.LastResponse == nil ||
		d.Status.LastResponse.StatusCode != 503 || d.Status.PayloadBytes != int64(len(`{"order":1}`)) {
		t.Errorf("the newest dead letter: %+v", d.Status)
	}
	if l, err := dlqList(viewer, tn.ns, "fieldSelector", "spec.endpoint=orders,status.reason=test_failed"); err != nil || len(l.Items) != 2 {
		t.Errorf("orders' test_failed: %v, %d items; want 2", err, len(l.Items))
	}
	paged, err := dlqList(viewer, tn.ns, "limit", "4")
	if err != nil || len(paged.Items) != 4 || paged.Continue == "" {
		t.Fatalf("a page of 4: %v", err)
	}
	if rest, err := dlqList(viewer, tn.ns, "limit", "4", "continue", paged.Continue); err != nil || len(rest.Items) != 2 || rest.Items[1].Name != ids[0] {
		t.Errorf("the next page: %v", err)
	}
	var one datav1alpha1.WebhookDeadLetter
	if err := viewer.Get().Namespace(tn.ns).Resource(datav1alpha1.ResourceDeadLetters).Name(ids[3]).Do(context.Background()).Into(&one); err != nil ||
		one.Spec.Endpoint != "crm" || one.Status.Reason != records.ReasonEndpointDisabled {
		t.Errorf("get %s: %v %+v", ids[3], err, one)
	}

	// Deleting is purging: refused to the viewer and to another namespace's editor.
	del := func(rc rest.Interface, name string) error {
		return rc.Delete().Namespace(tn.ns).Resource(datav1alpha1.ResourceDeadLetters).Name(name).Do(context.Background()).Error()
	}
	if err := del(viewer, ids[3]); !apierrors.IsForbidden(err) {
		t.Errorf("the viewer's delete: %v; want 403", err)
	}
	if err := del(outsider, ids[3]); !apierrors.IsForbidden(err) {
		t.Errorf("the outsider's delete: %v; want 403", err)
	}
	var gone datav1alpha1.WebhookDeadLetter
	if err := editor.Delete().Namespace(tn.ns).Resource(datav1alpha1.ResourceDeadLetters).Name(ids[3]).Do(context.Background()).Into(&gone); err != nil ||
		gone.Name != ids[3] || gone.Annotations[AnnotationPurgeEvent] == "" {
		t.Fatalf("the editor's delete: %v %+v", err, gone.ObjectMeta)
	}
	if err := del(editor, ids[3]); !apierrors.IsNotFound(err) {
		t.Errorf("deleting it again: %v; want 404", err)
	}

	// A purge by selection: orders' exhausted ones, one operational event.
	var purged datav1alpha1.WebhookDeadLetterList
	err = editor.Delete().Namespace(tn.ns).Resource(datav1alpha1.ResourceDeadLetters).Param("fieldSelector", "spec.endpoint=orders,status.reason=exhausted").
		Do(context.Background()).Into(&purged)
	if err != nil || len(purged.Items) != 3 {
		t.Fatalf("the purge: %v, %d purged; want 3", err, len(purged.Items))
	}
	if left, err := dlqList(viewer, tn.ns); err != nil || len(left.Items) != 2 {
		t.Errorf("after the purges: %v, %d left; want orders' 2 test_failed", err, len(left.Items))
	}
	evs := tn.purgeEvents()
	if len(evs) != 2 {
		t.Fatalf("%d purge events; want 2 (one per purge)", len(evs))
	}
	data, _ := evs[1]["data"].(map[string]any)
	if data["count"] != float64(3) || evs[1]["id"] != purged.Items[0].Annotations[AnnotationPurgeEvent] {
		t.Errorf("the purge's event: %v; want count 3 and the id the purged items name", evs[1])
	}
}
