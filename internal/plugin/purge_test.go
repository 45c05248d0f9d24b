package plugin_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// dlq purge deletes exactly the dead letters its selection names (an endpoint, reasons, an
// age), a dry run deletes nothing, another namespace's are untouched, and each purge is
// recorded once as the operational event webhook_operator.dlq.purged with its counts.
func TestDLQPurgeDeletesWhatItSelects(t *testing.T) {
	e := newEnv(t)
	other := &env{t: t, ns: e.ns + "-other", nats: e.nats, nc: e.nc, js: e.js, cfg: e.cfg}
	other.createNamespace(other.ns)
	now := time.Now().UTC()
	old, recent := now.Add(-48*time.Hour), now.Add(-time.Hour)
	write := func(en *env, ep string, i int, reason string, at time.Time) string {
		m := en.delivery(ep, i, at)
		en.writeDeadLetter(m, 1, reason, `{}`, at)
		return m.DeliveryID
	}
	for i := range 4 {
		write(e, "orders", i, records.ReasonExhausted, old)
		write(e, "orders", 10+i, records.ReasonExhausted, recent)
		write(other, "orders", i, records.ReasonExhausted, old)
	}
	write(e, "orders", 20, records.ReasonTestFailed, recent)
	write(e, "orders", 21, records.ReasonTestFailed, old)
	write(e, "crm", 0, records.ReasonEndpointDisabled, old)
	write(e, "crm", 1, records.ReasonExhausted, old)
	left := func(en *env, endpoint string) map[string]int {
		var p plugin.Page[plugin.DeadLetterItem]
		args := []string{"dlq", "list", "--limit", "100", "-o", "json"}
		if endpoint != "" {
			args = append(args, endpoint)
		}
		en.run(args...).must(t, plugin.ExitOK).decode(t, &p)
		n := map[string]int{}
		for _, d := range p.Data {
			n[d.Endpoint+"/"+d.Reason]++
		}
		return n
	}
	purges := func() []records.OpsEvent {
		var evs []records.OpsEvent
		for _, m := range e.subjectMsgs(e.cfg.For(e.ns).EventsStream(), e.cfg.For(e.ns).EventSubject(records.OpsDeadLettersPurged)) {
			var ev records.OpsEvent
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		return evs
	}
	before := left(e, "")

	// A dry run lists what would go and deletes nothing.
	var dry plugin.PurgeResult
	e.run("dlq", "purge", "orders", "--older-than", "24h", "--dry-run", "-o", "json").must(t, plugin.ExitOK).decode(t, &dry)
	if !dry.DryRun || dry.Selected != 5 || dry.Purged != 0 || len(dry.DeadLetters) != 5 || dry.ByReason[records.ReasonExhausted] != 4 || dry.ByReason[records.ReasonTestFailed] != 1 || dry.Event != "" {
		t.Errorf("dry run: %+v", dry)
	}
	for _, d := range dry.DeadLetters {
		if d.Endpoint != "orders" || d.DeadLetteredAt.After(now.Add(-24*time.Hour)) {
			t.Errorf("the dry run lists %+v", d)
		}
	}
	r := e.run("dlq", "purge", "orders", "--older-than", "24h", "--dry-run").must(t, plugin.ExitOK)
	for _, s := range []string{"Would purge 5 dead letters of " + e.ns + "/orders", "REASON", "By reason: exhausted 4, test_failed 1.", "Nothing was deleted"} {
		if !strings.Contains(r.out, s) {
			t.Errorf("dry run table lacks %q:\n%s", s, r.out)
		}
	}
	if got := left(e, ""); len(got) != len(before) || got["orders/exhausted"] != 8 || len(purges()) != 0 {
		t.Fatalf("a dry run changed something: %v, %d events", got, len(purges()))
	}

	// By endpoint and reason.
	var res plugin.PurgeResult
	e.run("dlq", "purge", "orders", "--reason", records.ReasonTestFailed, "-o", "json").must(t, plugin.ExitOK).decode(t, &res)
	if res.Selected != 2 || res.Purged != 2 || res.ByEndpoint["orders"] != 2 || res.Event == "" {
		t.Errorf("purge orders --reason test_failed: %+v", res)
	}
	// By age, namespace-wide.
	r = e.run("dlq", "purge", "--older-than", "24h").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "Purged 6 dead letters of namespace "+e.ns) || !strings.Contains(r.out, "By endpoint: orders 4, crm 2.") || !strings.Contains(r.out, records.OpsDeadLettersPurged) {
		t.Errorf("purge --older-than 24h:\n%s", r)
	}
	if got := left(e, ""); len(got) != 1 || got["orders/exhausted"] != 4 {
		t.Errorf("left after two purges: %v, want orders' 4 recent exhausted", got)
	}
	// Nothing more to purge: no event.
	r = e.run("dlq", "purge", "crm", "--all").must(t, plugin.ExitOK)
	if !strings.Contains(r.errOut, "nothing to purge") {
		t.Errorf("purging nothing: %s", r)
	}
	// The rest.
	e.run("dlq", "purge", "orders", "--all", "-o", "json").must(t, plugin.ExitOK).decode(t, &res)
	if res.Purged != 4 || len(left(e, "")) != 0 {
		t.Errorf("purge orders --all: %+v", res)
	}

	evs := purges()
	if len(evs) != 3 {
		t.Fatalf("%d purge events, want 3: %+v", len(evs), evs)
	}
	for i, want := range []struct {
		endpoint string
		count    float64
		reasons  map[string]any
	}{
		{"orders", 2, map[string]any{records.ReasonTestFailed: 2.0}},
		{"", 6, map[string]any{records.ReasonExhausted: 5.0, records.ReasonEndpointDisabled: 1.0}},
		{"orders", 4, map[string]any{records.ReasonExhausted: 4.0}},
	} {
		ev := evs[i]
		if ev.Type != records.OpsDeadLettersPurged || ev.Namespace != e.ns || ev.Endpoint != want.endpoint || ev.Data["count"] != want.count ||
			!jsonEqual(ev.Data["reasons"], want.reasons) || ev.ID == "" {
			t.Errorf("purge event %d: %+v, want %+v", i, ev, want)
		}
	}
	// The other namespace's dead letters are untouched.
	if got := left(other, ""); got["orders/exhausted"] != 4 {
		t.Errorf("the other namespace's dead letters: %v", got)
	}

	// What is refused before anything is read.
	for _, args := range [][]string{
		{"dlq", "purge"}, {"dlq", "purge", "orders"}, {"dlq", "purge", "orders", "--all", "--reason", "exhausted"},
		{"dlq", "purge", "--reason", "exhaused"}, {"dlq", "purge", "--older-than", "yesterday"}, {"dlq", "purge", "Orders.>", "--all"},
	} {
		e.run(args...).must(t, plugin.ExitUsage)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
