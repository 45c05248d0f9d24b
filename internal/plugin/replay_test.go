package plugin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

func TestReplayByIDCreatesADeliveryOnThatEndpointPointingAtTheOriginal(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	e.createEndpoint("crm")
	at := time.Now().Add(-time.Hour).UTC()
	m := e.delivery("orders", 1, at)
	dl := e.writeDeadLetter(m, 7, records.ReasonExhausted, `{"order":1}`, at)
	crm := e.delivery("crm", 1, at)
	e.writeDeadLetter(crm, 7, records.ReasonExhausted, `{"crm":1}`, at)
	dlqBefore := e.subjectMsgs(e.cfg.For(e.ns).DeadLetterStream(), e.cfg.For(e.ns).DeadLetterFilter(""))

	var rep plugin.ReplayReport
	e.run("replay", "orders", "--id", m.DeliveryID, "-o", "json").must(t, plugin.ExitOK).decode(t, &rep)
	if len(rep.Results) != 1 || rep.Created != 1 || rep.Results[0].Status != plugin.ReplayCreated || rep.Results[0].IdempotentReplay {
		t.Fatalf("report %+v", rep)
	}
	newID := rep.Results[0].DeliveryID
	if !records.IsDeliveryID(newID) || newID == m.DeliveryID {
		t.Fatalf("new delivery id %q", newID)
	}
	got := e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("orders"))
	if len(got) != 1 {
		t.Fatalf("%d deliveries on orders' subject, want 1", len(got))
	}
	msg := got[0]
	meta := records.ParseDeliveryMeta(msg.Header)
	if meta.DeliveryID != newID || meta.ReplayOf != m.DeliveryID || meta.EventID != m.EventID || meta.EventType != m.EventType ||
		!meta.EventTime.Equal(m.EventTime) || meta.EventSeq != m.EventSeq || meta.Namespace != e.ns || meta.Endpoint != "orders" ||
		meta.Attempts != 0 || len(meta.History) != 0 || time.Since(meta.Created) > time.Minute {
		t.Errorf("delivery meta %+v", meta)
	}
	if msg.Header.Get(records.HeaderMsgID) != newID || string(msg.Data) != `{"order":1}` ||
		msg.Header.Get("X-Tenant") != "acme" || msg.Header.Get(records.HeaderTraceParent) != dl.Headers[records.HeaderTraceParent][0] ||
		msg.Header.Get(records.HeaderContentType) != "application/json" {
		t.Errorf("delivery headers %v body %q", msg.Header, msg.Data)
	}
	// Nothing for crm; the original dead letter stays as it was.
	if n := len(e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("crm"))); n != 0 {
		t.Errorf("%d deliveries for crm", n)
	}
	dlqAfter := e.subjectMsgs(e.cfg.For(e.ns).DeadLetterStream(), e.cfg.For(e.ns).DeadLetterFilter(""))
	if len(dlqAfter) != len(dlqBefore) || string(dlqAfter[0].Data) != string(dlqBefore[0].Data) {
		t.Errorf("the dead-letter stream changed")
	}
	// The new delivery shows in the log as pending, pointing at the original.
	var page plugin.Page[plugin.LogEntry]
	e.run("log", "orders", "--status", "pending", "-o", "json").must(t, plugin.ExitOK).decode(t, &page)
	if len(page.Data) != 1 || page.Data[0].ID != newID || page.Data[0].ReplayOfID != m.DeliveryID {
		t.Errorf("log after replay: %+v", page.Data)
	}

	// Without a key, another replay is another delivery.
	r := e.run("replay", "orders", "--id", m.DeliveryID).must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "replayed dead letter "+m.DeliveryID+" as delivery ") {
		t.Errorf("table: %s", r)
	}
	if n := len(e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("orders"))); n != 2 {
		t.Errorf("%d deliveries after a second keyless replay, want 2", n)
	}

	// Another endpoint's dead letter, or none at all: not found.
	r = e.run("replay", "orders", "--id", crm.DeliveryID).must(t, plugin.ExitNotFound)
	if !strings.Contains(r.errOut, `belongs to endpoint "crm"`) {
		t.Errorf("other endpoint's id: %s", r)
	}
	e.run("replay", "orders", "--id", records.DeliveryID("ghost", e.ns, "orders")).must(t, plugin.ExitNotFound)
	e.run("replay", "ghost", "--id", m.DeliveryID).must(t, plugin.ExitNotFound)
	if n := len(e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("orders"))); n != 2 {
		t.Errorf("refused replays created deliveries: %d", n)
	}
	// Flags.
	for _, args := range [][]string{
		{"replay", "orders"},
		{"replay", "orders", "--id", m.DeliveryID, "--all"},
		{"replay", "orders", "--all", "--since", "1h"},
		{"replay", "orders", "--id", "whdl_x.y"},
		{"replay", "orders", "--id", "whdl_*"},
		{"replay", "orders", "--since", "yesterday"},
	} {
		e.run(args...).must(t, plugin.ExitUsage)
	}
}

// A replay carries the event's own headers only: whatever operator (Whk-*) or JetStream
// (Nats-*) header a dead letter's record holds is left out, as the record contract says for
// every delivery.
func TestReplayCarriesOnlyTheEventsHeaders(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	at := time.Now().Add(-time.Hour).UTC()
	m := e.delivery("orders", 1, at)
	dl := records.DeadLetter{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, Namespace: e.ns, Endpoint: "orders",
		Reason: records.ReasonExhausted, DeadLetteredAt: at, Headers: map[string][]string{
			"X-Tenant":                    {"acme"},
			"Nats-Expected-Last-Sequence": {"999999"},
			"Whk-Replay-Of":               {"whd_forged"},
			"Whk-Forged":                  {"1"},
		}}
	if _, err := e.js.PublishMsg(context.Background(), records.DeadLetterMsg(e.cfg.For(e.ns).DeadLetterSubject("orders", m.DeliveryID), dl, []byte(`{}`))); err != nil {
		t.Fatal(err)
	}
	var rep plugin.ReplayReport
	e.run("replay", "orders", "--id", m.DeliveryID, "-o", "json").must(t, plugin.ExitOK).decode(t, &rep)
	got := e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("orders"))
	if rep.Created != 1 || len(got) != 1 {
		t.Fatalf("report %+v, %d deliveries", rep, len(got))
	}
	h := got[0].Header
	if h.Get("X-Tenant") != "acme" || h.Get("Nats-Expected-Last-Sequence") != "" || h.Get("Whk-Forged") != "" ||
		h.Get(records.HReplayOf) != m.DeliveryID {
		t.Errorf("delivery headers %v", h)
	}
}

func TestReplayWithTheSameKeyCreatesOneDelivery(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	at := time.Now().Add(-time.Hour).UTC()
	m := e.delivery("orders", 1, at)
	e.writeDeadLetter(m, 7, records.ReasonExhausted, `{"order":1}`, at)

	var first, second plugin.ReplayReport
	e.run("replay", "orders", "--id", m.DeliveryID, "--idempotency-key", "fix-1", "-o", "json").must(t, plugin.ExitOK).decode(t, &first)
	e.run("replay", "orders", "--id", m.DeliveryID, "--idempotency-key", "fix-1", "-o", "json").must(t, plugin.ExitOK).decode(t, &second)
	if first.Results[0].Status != plugin.ReplayCreated || second.Results[0].Status != plugin.ReplayAlreadyReplayed ||
		!second.Results[0].IdempotentReplay || second.Results[0].DeliveryID != first.Results[0].DeliveryID {
		t.Fatalf("first %+v second %+v", first.Results, second.Results)
	}
	if first.Results[0].DeliveryID != records.ReplayDeliveryID(m.DeliveryID, "fix-1") {
		t.Errorf("keyed replay id is not ReplayDeliveryID(original, key)")
	}
	r := e.run("replay", "orders", "--id", m.DeliveryID, "--idempotency-key", "fix-1").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "already replayed as "+first.Results[0].DeliveryID) || !strings.Contains(r.out, "Idempotent-Replay: true") {
		t.Errorf("table: %s", r)
	}
	if n := len(e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("orders"))); n != 1 {
		t.Fatalf("%d deliveries for one key, want 1", n)
	}
	// The key is recorded where the contract says.
	kv, err := e.js.KeyValue(context.Background(), e.cfg.For(e.ns).Bucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(context.Background(), streams.ReplayKey("orders", "fix-1/"+m.DeliveryID)); err != nil {
		t.Errorf("replay key not recorded: %v", err)
	}
	// Another key is another replay.
	e.run("replay", "orders", "--id", m.DeliveryID, "--idempotency-key", "fix-2").must(t, plugin.ExitOK)
	if n := len(e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("orders"))); n != 2 {
		t.Errorf("%d deliveries for two keys, want 2", n)
	}
}

func TestReplayAllAndSince(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	e.createEndpoint("crm")
	old := time.Now().Add(-48 * time.Hour).UTC()
	recent := time.Now().Add(-30 * time.Minute).UTC()
	var recentIDs []string
	for i := range 60 {
		at := old
		if i >= 40 {
			at = recent
		}
		m := e.delivery("orders", i, at)
		e.writeDeadLetter(m, 7, records.ReasonExhausted, `{"i":1}`, at)
		if at == recent {
			recentIDs = append(recentIDs, m.DeliveryID)
		}
		e.writeDeadLetter(e.delivery("crm", i, at), 7, records.ReasonExhausted, `{}`, at)
	}
	var since plugin.ReplayReport
	e.run("replay", "orders", "--since", "2h", "--idempotency-key", "k", "-o", "json").must(t, plugin.ExitOK).decode(t, &since)
	if since.Created != 20 || len(since.Results) != 20 {
		t.Fatalf("--since 2h: %+v", since)
	}
	for i, res := range since.Results {
		if res.Original != recentIDs[i] {
			t.Fatalf("--since replayed %s, want %s", res.Original, recentIDs[i])
		}
	}
	var all plugin.ReplayReport
	r := e.run("replay", "orders", "--all", "--idempotency-key", "k", "-o", "json").must(t, plugin.ExitOK)
	r.decode(t, &all)
	if all.Created != 40 || all.Already != 20 || len(all.Results) != 60 {
		t.Fatalf("--all after --since with the same key: created %d, already %d, of %d", all.Created, all.Already, len(all.Results))
	}
	if !strings.Contains(r.errOut, "replayed 60/60 dead letters") {
		t.Errorf("no progress on stderr: %q", r.errOut)
	}
	if n := len(e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("orders"))); n != 60 {
		t.Errorf("%d deliveries, want 60", n)
	}
	if n := len(e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("crm"))); n != 0 {
		t.Errorf("%d deliveries for crm", n)
	}
	r = e.run("replay", "orders", "--all", "--idempotency-key", "k").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "0 replayed as new deliveries, 60 already replayed") {
		t.Errorf("table: %s", r)
	}
	r = e.run("replay", "orders", "--since", "2026-01-01T00:00:00Z", "--idempotency-key", "k").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "60 already replayed") {
		t.Errorf("--since RFC 3339: %s", r)
	}
	if n := len(e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("orders"))); n != 60 {
		t.Errorf("%d deliveries after repeating with the same key, want 60", n)
	}
}

func TestReplayIsRefusedForADisabledEndpoint(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	at := time.Now().Add(-time.Hour).UTC()
	m := e.delivery("orders", 1, at)
	e.writeDeadLetter(m, 0, records.ReasonEndpointDisabled, `{"order":1}`, at)
	since := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Second)
	e.disable("orders", since)

	for _, args := range [][]string{{"--id", m.DeliveryID}, {"--all"}} {
		r := e.run(append([]string{"replay", "orders"}, args...)...).must(t, plugin.ExitRefused)
		for _, s := range []string{"endpoint " + e.ns + "/orders is disabled since " + since.Format(time.RFC3339), "FailureRate", "kubectl webhooks enable orders"} {
			if !strings.Contains(r.errOut, s) {
				t.Errorf("refusal lacks %q: %s", s, r)
			}
		}
	}
	if n := len(e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).DeliverySubject("orders"))); n != 0 {
		t.Fatalf("a refused replay created %d deliveries", n)
	}
	// After enable, until the dispatcher confirms, the refusal says a re-enable is pending.
	e.run("enable", "orders").must(t, plugin.ExitOK)
	r := e.run("replay", "orders", "--id", m.DeliveryID).must(t, plugin.ExitRefused)
	if !strings.Contains(r.errOut, "re-enabling was requested") {
		t.Errorf("refusal after enable: %s", r)
	}
	// The dispatcher re-enables it: the replay goes through.
	e.setStatus("orders", func(ep *v1alpha1.WebhookEndpoint) {
		for i := range ep.Status.Conditions {
			if ep.Status.Conditions[i].Type == v1alpha1.ConditionDisabled {
				ep.Status.Conditions[i].Status, ep.Status.Conditions[i].Reason = "False", v1alpha1.ReasonEnabled
			}
		}
		ep.Status.Health.DisabledSince = nil
	})
	e.run("replay", "orders", "--id", m.DeliveryID).must(t, plugin.ExitOK)
}
