package console_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// A namespace's page and an endpoint's draw their deliveries, failures and latency over the
// last hours as SVG on the server, from the delivery log read through the data API as the
// user: the counts and latencies of what was logged, per namespace and per endpoint, with the
// numbers in a table beside it; nothing a CSP without inline script or style would block. A
// user who may not list deliveries is told why instead of a chart.
func TestDeliveryChart(t *testing.T) {
	s := consoleStack(t)
	const ns = "charts"
	s.tenant(t, ns)
	s.endpoint(t, ns, "orders")
	s.endpoint(t, ns, "crm")
	st := s.stored(t, ns)
	now := time.Now().UTC()
	logged := func(ep, id, state string, latency time.Duration) {
		seq := st.Event("order.created", id, `{}`, nil)
		m := st.Delivery(ep, id, seq, now.Add(-time.Minute))
		st.Log(records.LogRecord{DeliveryID: m.DeliveryID, EventID: id, EventType: m.EventType, EventSeq: seq, Namespace: ns, Endpoint: ep,
			State: state, Attempt: 1, Time: now, LatencyMS: latency.Milliseconds(), LatencyUS: latency.Microseconds(), Response: records.Response{StatusCode: 204}})
	}
	logged("orders", "evt_1", records.StateSucceeded, 10*time.Millisecond)
	logged("orders", "evt_2", records.StateSucceeded, 20*time.Millisecond)
	logged("orders", "evt_3", records.StateSucceeded, 30*time.Millisecond)
	logged("crm", "evt_4", records.StateDeadLetter, 2*time.Second)

	owner := signIn(t, s.url, s.token(t, ns, "owner", readRules...))
	resp, err := owner.hc.Get(s.url + "/ns/" + ns)
	must(t, err)
	csp := resp.Header.Get("Content-Security-Policy")
	code, page := owner.read(resp)
	summary := element(page, "chart-summary")
	if code != http.StatusOK || !strings.HasPrefix(summary, "3 delivered, 1 failed (75.0% delivered); latency p50") {
		t.Fatalf("the namespace's chart (%d) says %q (note %q)", code, summary, element(page, "chart-note"))
	}
	svg := page[strings.Index(page, `<svg id="chart-svg"`):]
	svg = svg[:strings.Index(svg, "</svg>")]
	if strings.Count(svg, `<g class="slot">`) != 24 || !strings.Contains(svg, "3 delivered, 1 failed") || !strings.Contains(svg, `<polyline class="p95" points="`) {
		t.Errorf("the SVG: %s", svg)
	}
	if strings.Contains(page, "style=") || strings.Contains(page, "<script") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("the page has inline style or script, or its CSP is %q", csp)
	}
	if table := element(page, "chart-table"); !strings.Contains(table, " 3 1 ") {
		t.Errorf("the numbers: %q", table)
	}
	// One endpoint's, over another window.
	_, page = owner.get("/ns/" + ns + "/endpoints/orders?window=1h")
	if summary := element(page, "chart-summary"); !strings.HasPrefix(summary, "3 delivered, 0 failed (100.0% delivered); latency p50") ||
		strings.Count(page, `<g class="slot">`) != 30 || !strings.Contains(element(page, "chart"), "Deliveries of orders over the last 1h") {
		t.Errorf("the endpoint's chart over 1h says %q", summary)
	}
	// Without list on deliveries: why, and no chart.
	blind := signIn(t, s.url, s.token(t, ns, "blind",
		rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookendpoints"}, Verbs: []string{"get", "list"}}))
	_, page = blind.get("/ns/" + ns)
	if note := element(page, "chart-note"); !strings.Contains(note, "The chart cannot be drawn") || !strings.Contains(note, "forbidden") || strings.Contains(page, `id="chart-svg"`) {
		t.Errorf("without list on deliveries, the chart says %q", note)
	}
}
