package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// An endpoint's recent deliveries are filtered by event id and time as well as state and
// event type (field selectors of the data API, each value bounded and unable to add a
// selector of its own), and a test event sent from the page links to its deliveries.
func TestDeliveriesFilteredByEventAndTime(t *testing.T) {
	s := consoleStack(t)
	const ns = "filters"
	s.tenant(t, ns)
	s.endpoint(t, ns, "orders")
	st := s.stored(t, ns)
	now := time.Now().UTC()
	ids := map[string]string{}
	for _, id := range []string{"evt_a", "evt_b"} {
		seq := st.Event("order.created", id, `{}`, nil)
		m := st.Delivery("orders", id, seq, now.Add(-time.Minute))
		st.Log(records.LogRecord{DeliveryID: m.DeliveryID, EventID: id, EventType: m.EventType, EventSeq: seq, Namespace: ns, Endpoint: "orders",
			State: records.StateSucceeded, Attempt: 1, Time: now, LatencyMS: 3, LatencyUS: 3000, Response: records.Response{StatusCode: 204}})
		ids[id] = m.DeliveryID
	}
	u := signIn(t, s.url, s.token(t, ns, "owner", with(readRules,
		rbacv1.PolicyRule{APIGroups: []string{datav1alpha1.GroupName}, Resources: []string{datav1alpha1.ResourceEvents}, Verbs: []string{"create"}})...))
	page := "/ns/" + ns + "/endpoints/orders"
	rows := func(query string) (string, string) {
		t.Helper()
		code, body := u.get(page + "?" + query)
		if code != http.StatusOK {
			t.Fatalf("%s: %d", query, code)
		}
		return element(body, "deliveries"), element(body, "chart") + " " + strings.Join(strings.Fields(body[strings.Index(body, "Recent deliveries"):]), " ")
	}
	if _, body := u.get(page); !strings.Contains(element(body, "spec-words"), "Delivers the events of type order.* published in this namespace to https://orders.example.com/hooks.") {
		t.Errorf("the spec in words: %q", element(body, "spec-words"))
	}
	if got, _ := rows("id=evt_a"); !strings.Contains(got, ids["evt_a"]) || strings.Contains(got, ids["evt_b"]) {
		t.Errorf("by event id: %q", got)
	}
	if got, _ := rows("since=1h"); !strings.Contains(got, ids["evt_a"]) || !strings.Contains(got, ids["evt_b"]) {
		t.Errorf("since 1h: %q", got)
	}
	if got, _ := rows(url.Values{"until": {now.Add(-time.Hour).Format(time.RFC3339)}}.Encode()); !strings.Contains(got, "No deliveries") {
		t.Errorf("until an hour ago: %q", got)
	}
	for _, bad := range []string{"since=yesterday", "id=" + url.QueryEscape("evt_a,spec.endpoint=crm")} {
		if got, rest := rows(bad); !strings.Contains(got, "No deliveries") || !strings.Contains(rest, "The filter is not valid") {
			t.Errorf("%s: %q", bad, got)
		}
	}
	// A test event: the page links to its deliveries.
	code, body := u.post(page+"/test", url.Values{"type": {"order.test"}, "data": {`{"n":1}`}})
	link := element(body, "test-outcome")
	if code != http.StatusOK || !strings.Contains(body, `href="/ns/filters/endpoints/orders?id=console-test-`) || link == "" {
		t.Errorf("after a test event (%d): %q %q", code, element(body, "flash"), link)
	}
}
