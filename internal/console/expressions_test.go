package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// An endpoint's owner edits its filter and transformation: the expressions are evaluated, by
// internal/expr with the dispatcher's limits, on a recent delivery's event (read through its
// payload, as the user) or a typed one, and saved into the endpoint as the user at the version
// the form was made from, only once they compile. A reader without payload or patch rights
// evaluates on a typed event only and is refused the save, with RBAC's reason.
func TestEditFilterAndTransform(t *testing.T) {
	s := consoleStack(t)
	const ns = "expressions"
	s.tenant(t, ns)
	s.endpoint(t, ns, "orders")
	st := s.stored(t, ns)
	now := time.Now().UTC()
	seq := st.Event("order.created", "evt_paid", `{"total":150,"currency":"EUR","order_id":"o-1"}`, nil)
	m := st.Delivery("orders", "evt_paid", seq, now.Add(-time.Minute))
	st.Log(records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, EventSeq: seq, Namespace: ns, Endpoint: "orders",
		State: records.StateSucceeded, Attempt: 1, Time: m.Created, LatencyMS: 5, LatencyUS: 5000, Response: records.Response{StatusCode: 204}})

	owner := signIn(t, s.url, s.token(t, ns, "owner", with(readRules, patchEndpoints)...))
	reader := signIn(t, s.url, s.token(t, ns, "reader",
		rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookendpoints"}, Verbs: []string{"get", "list"}},
		rbacv1.PolicyRule{APIGroups: []string{datav1alpha1.GroupName}, Resources: []string{datav1alpha1.ResourceDeliveries}, Verbs: []string{"get", "list"}}))
	page := "/ns/" + ns + "/endpoints/orders/expressions"
	endpoint := func() *v1alpha1.WebhookEndpoint {
		var e v1alpha1.WebhookEndpoint
		must(t, s.cp.Client.Get(s.ctx, types.NamespacedName{Namespace: ns, Name: "orders"}, &e))
		return &e
	}

	code, body := owner.get(page)
	rv := inputValue(body, "resourceVersion")
	if code != http.StatusOK || !strings.Contains(body, `<option value="`+m.DeliveryID+`" selected>`) || rv == "" {
		t.Fatalf("the editor (%d) does not offer the latest delivery as the sample: %s", code, element(body, "expressions"))
	}
	form := func(filter, bodyExpr, headers, sample string) url.Values {
		return url.Values{"resourceVersion": {rv}, "filter": {filter}, "body": {bodyExpr}, "headers": {headers}, "sample": {sample},
			"sample_type": {"order.created"}, "sample_data": {`{"total":5,"order_id":"<script>alert(1)</script>"}`}}
	}
	const (
		filter    = `payload.total > 100 && payload.currency == "EUR"`
		transform = `{"text": "Order " + payload.order_id}`
	)

	// Evaluated on the delivery's event: nothing saved.
	code, body = owner.post(page+"/evaluate", form(filter, transform, "X-Order-Id: payload.order_id", m.DeliveryID))
	if code != http.StatusOK || !strings.Contains(element(body, "filter-result"), "true: the endpoint gets the event") ||
		element(body, "transform-body") != `{"text":"Order o-1"}` || element(body, "transform-headers") != "X-Order-Id o-1" ||
		!strings.Contains(element(body, "result"), "delivery "+m.DeliveryID) {
		t.Fatalf("evaluating on the delivery (%d): %q %q", code, element(body, "flash"), element(body, "result"))
	}
	if ep := endpoint(); ep.Spec.Filter != "" || ep.Spec.Transform != nil {
		t.Fatalf("evaluating saved %+v", ep.Spec)
	}
	// On the typed event, whose hostile data is text.
	code, body = owner.post(page+"/evaluate", form(filter, `payload.order_id`, "", "custom"))
	if code != http.StatusOK || !strings.Contains(element(body, "filter-result"), "false") || element(body, "transform-body") != "<script>alert(1)</script>" ||
		strings.Contains(body, "<script>alert") {
		t.Errorf("evaluating on the typed event (%d): %q %q", code, element(body, "filter-result"), element(body, "transform-body"))
	}
	// What the dispatcher would dead-letter, what does not compile and what may cost too much.
	for _, c := range []struct {
		name, filter, body string
		code               int
		id, want           string
	}{
		{"a filter that cannot decide", `payload.missing > 1`, "", http.StatusOK, "filter-result", "filter_failed"},
		{"a failing transformation", "", `payload.missing`, http.StatusOK, "transform-error", "transform_failed"},
		{"a filter that does not compile", `payload.total >`, "", http.StatusBadRequest, "flash", "Does not compile"},
		{"a filter that is not a bool", `"yes"`, "", http.StatusBadRequest, "flash", "Does not compile"},
		{"a body that may cost too much", "", `payload.items.map(x, payload.items.map(y, [x, y]))`, http.StatusBadRequest, "flash", "may cost too much"},
	} {
		code, body := owner.post(page+"/evaluate", form(c.filter, c.body, "", m.DeliveryID))
		if code != c.code || !strings.Contains(element(body, c.id), c.want) {
			t.Errorf("%s: %d %q, want %d and %q", c.name, code, element(body, c.id), c.code, c.want)
		}
	}

	// Saved, compiled first; a form made before the save is then a conflict.
	if code, body := owner.post(page+"/save", form(`payload.total >`, "", "", m.DeliveryID)); code != http.StatusBadRequest ||
		!strings.Contains(element(body, "flash"), "Not saved: does not compile") || endpoint().Spec.Filter != "" {
		t.Errorf("saving what does not compile: %d %q", code, element(body, "flash"))
	}
	code, body = owner.post(page+"/save", form(filter, transform, "X-Order-Id: payload.order_id", m.DeliveryID))
	ep := endpoint()
	if code != http.StatusOK || !strings.Contains(element(body, "flash"), "Saved") || ep.Spec.Filter != filter || ep.Spec.Transform == nil ||
		ep.Spec.Transform.Body != transform || len(ep.Spec.Transform.Headers) != 1 || ep.Spec.Transform.Headers[0] != (v1alpha1.TransformHeader{Name: "X-Order-Id", Expression: "payload.order_id"}) {
		t.Fatalf("saving (%d %q): %+v", code, element(body, "flash"), ep.Spec)
	}
	if !strings.Contains(element(body, "filter-result"), "true") || inputValue(body, "resourceVersion") != ep.ResourceVersion {
		t.Errorf("after saving, the page shows %q at version %s (the endpoint's is %s)", element(body, "filter-result"), inputValue(body, "resourceVersion"), ep.ResourceVersion)
	}
	code, body = owner.post(page+"/save", form("", "", "", m.DeliveryID)) // rv is the old version
	if code != http.StatusConflict || !strings.Contains(element(body, "flash"), "changed since this form was made") || endpoint().Spec.Filter != filter {
		t.Errorf("saving a stale form: %d %q", code, element(body, "flash"))
	}
	// Emptied: the filter and the transformation go.
	rv = ep.ResourceVersion
	code, body = owner.post(page+"/save", form("", "", "", "custom"))
	if ep := endpoint(); code != http.StatusOK || ep.Spec.Filter != "" || ep.Spec.Transform != nil {
		t.Errorf("saving empty expressions (%d %q): %+v", code, element(body, "flash"), ep.Spec)
	}

	// The reader: Save disabled with why, a delivery's event refused, a typed one evaluated,
	// a save refused by the API server.
	_, body = reader.get(page)
	if !strings.Contains(element(body, "save-why"), "RBAC does not allow you to patch webhookendpoints") ||
		!strings.Contains(element(body, "payload-why"), "get webhookdeliveries/payload") || !strings.Contains(body, `id="save" formaction=`) {
		t.Errorf("the reader's editor: %q %q", element(body, "save-why"), element(body, "payload-why"))
	}
	rv = inputValue(body, "resourceVersion")
	if code, body := reader.post(page+"/evaluate", form(filter, "", "", m.DeliveryID)); code != http.StatusForbidden || !strings.Contains(element(body, "flash"), "refused") {
		t.Errorf("the reader evaluating on a delivery: %d %q", code, element(body, "flash"))
	}
	if code, body := reader.post(page+"/evaluate", form(filter, "", "", "custom")); code != http.StatusOK || !strings.Contains(element(body, "filter-result"), "false") {
		t.Errorf("the reader evaluating on a typed event: %d %q", code, element(body, "filter-result"))
	}
	if code, body := reader.post(page+"/save", form(filter, "", "", "custom")); code != http.StatusForbidden || !strings.Contains(element(body, "flash"), "Save refused") ||
		endpoint().Spec.Filter != "" {
		t.Errorf("the reader saving: %d %q", code, element(body, "flash"))
	}
}
