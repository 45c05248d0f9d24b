package plugin_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

func TestDLQListAndShow(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	e.createEndpoint("crm")
	at := time.Now().Add(-time.Hour).UTC().Truncate(time.Millisecond)
	var orders, all []string
	for i := range 30 {
		m := e.delivery("orders", i, at)
		e.writeDeadLetter(m, 7, records.ReasonExhausted, `{"order":`+string(rune('0'+i%10))+`}`, at.Add(time.Duration(i)*time.Second))
		orders = append([]string{m.DeliveryID}, orders...)
		all = append([]string{m.DeliveryID}, all...)
		if i%3 == 0 {
			c := e.delivery("crm", i, at)
			e.writeDeadLetter(c, 0, records.ReasonEndpointDisabled, `{}`, at.Add(time.Duration(i)*time.Second))
			all = append([]string{c.DeliveryID}, all...)
		}
	}
	got, n := pages[plugin.DeadLetterItem](t, e, nil, "dlq", "list", "orders", "--limit", "7")
	var gotIDs []string
	for _, d := range got {
		gotIDs = append(gotIDs, d.DeliveryID)
		if d.Endpoint != "orders" || d.Reason != records.ReasonExhausted || len(d.Attempts) != 7 || d.Payload != nil || d.PayloadBytes == 0 {
			t.Fatalf("listed dead letter: %+v", d)
		}
	}
	if n != 5 || strings.Join(gotIDs, ",") != strings.Join(orders, ",") {
		t.Fatalf("%d pages:\n got %v\nwant %v", n, gotIDs, orders)
	}
	got, _ = pages[plugin.DeadLetterItem](t, e, nil, "dlq", "list", "--limit", "100")
	gotIDs = nil
	for _, d := range got {
		gotIDs = append(gotIDs, d.DeliveryID)
	}
	if strings.Join(gotIDs, ",") != strings.Join(all, ",") {
		t.Fatalf("namespace-wide list:\n got %v\nwant %v", gotIDs, all)
	}
	r := e.run("dlq", "list", "orders", "--limit", "3").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "REASON") || !strings.Contains(r.out, "exhausted") || !strings.Contains(r.out, "kubectl webhooks dlq list orders --after ") {
		t.Errorf("table:\n%s", r)
	}
	// The table's cursor continues the list.
	i := strings.Index(r.out, "--after ")
	var next plugin.Page[plugin.DeadLetterItem]
	e.run("dlq", "list", "orders", "--limit", "3", "--after", strings.Fields(r.out[i+len("--after "):])[0], "-o", "json").must(t, plugin.ExitOK).decode(t, &next)
	if len(next.Data) != 3 || next.Data[0].DeliveryID != orders[3] {
		t.Errorf("continuing from the table's cursor: %+v, want %s first", next.Data, orders[3])
	}
	yamlValid(t, e.run("dlq", "list", "-o", "yaml").must(t, plugin.ExitOK))

	// show: everything about one dead letter.
	var d plugin.DeadLetterItem
	e.run("dlq", "show", orders[0], "-o", "json").must(t, plugin.ExitOK).decode(t, &d)
	if d.DeliveryID != orders[0] || d.Endpoint != "orders" || len(d.Attempts) != 7 || d.Attempts[6].StatusCode != 503 ||
		d.LastResponse == nil || d.LastResponse.Body != `{"error":"down for maintenance"}` ||
		d.Headers["X-Tenant"][0] != "acme" || compact(d.Payload) != `{"order":9}` {
		t.Errorf("show: %+v payload %s", d, d.Payload)
	}
	r = e.run("dlq", "show", orders[0]).must(t, plugin.ExitOK)
	for _, s := range []string{"Reason:", "exhausted", "Attempts (7):", "503", "down for maintenance", "X-Tenant: acme", "traceparent", `"order"`, "replay orders --id " + orders[0]} {
		if !strings.Contains(r.out, s) {
			t.Errorf("show table lacks %q:\n%s", s, r.out)
		}
	}
	yamlValid(t, e.run("dlq", "show", orders[0], "-o", "yaml").must(t, plugin.ExitOK))

	// Not found and bad input.
	e.run("dlq", "show", records.DeliveryID("nope", e.ns, "orders")).must(t, plugin.ExitNotFound)
	e.run("dlq", "show", "whdl_x.>").must(t, plugin.ExitUsage)
	e.run("dlq", "show", "invalid-42").must(t, plugin.ExitNotFound)
	// A cursor is the one the previous page printed: a delivery id is not one, nor another
	// list's cursor.
	r = e.run("dlq", "list", "orders", "--after", records.DeliveryID("nope", e.ns, "orders")).must(t, plugin.ExitUsage)
	if !strings.Contains(r.errOut, "--after") || !strings.Contains(r.errOut, "continue token") {
		t.Errorf("a delivery id as a cursor: %s", r)
	}
	e.run("dlq", "list", "crm", "--after", next.NextCursor).must(t, plugin.ExitUsage)
	e.run("dlq", "list", "orders", "--limit", "500").must(t, plugin.ExitUsage)
	e.run("dlq", "list", "ghost").must(t, plugin.ExitNotFound)
	// Another namespace does not see them.
	other := &env{t: t, ns: e.ns + "-x", nats: e.nats, nc: e.nc, js: e.js, cfg: e.cfg}
	other.createNamespace(other.ns)
	other.run("dlq", "show", orders[0]).must(t, plugin.ExitNotFound)
	r = other.run("dlq", "list").must(t, plugin.ExitOK)
	if !strings.Contains(r.errOut, "No dead letters") {
		t.Errorf("empty namespace: %s", r)
	}
}

func compact(b []byte) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return "invalid JSON: " + string(b)
	}
	c, _ := json.Marshal(v)
	return string(c)
}
