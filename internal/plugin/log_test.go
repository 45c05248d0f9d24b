package plugin_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// pages follows a cursor-paginated command to its end and returns every entry and the number
// of pages; cursorOf, when not nil, is the entry's cursor the page's next cursor must be.
func pages[T any](t *testing.T, e *env, cursorOf func(T) string, args ...string) ([]T, int) {
	t.Helper()
	var all []T
	after := ""
	for n := 1; n < 1000; n++ {
		a := append([]string{}, args...)
		a = append(a, "-o", "json")
		if after != "" {
			a = append(a, "--after", after)
		}
		var p plugin.Page[T]
		e.run(a...).must(t, plugin.ExitOK).decode(t, &p)
		all = append(all, p.Data...)
		if !p.HasMore {
			if p.NextCursor != "" {
				t.Errorf("last page has a next cursor %q", p.NextCursor)
			}
			return all, n
		}
		if len(p.Data) == 0 || p.NextCursor == "" || cursorOf != nil && p.NextCursor != cursorOf(p.Data[len(p.Data)-1]) {
			t.Fatalf("page %d: hasMore with next cursor %q after %d entries", n, p.NextCursor, len(p.Data))
		}
		after = p.NextCursor
	}
	t.Fatal("pagination does not end")
	return nil, 0
}

func ids(entries []plugin.LogEntry) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.ID
	}
	return out
}

func TestLogPaginatesNewestFirstAcrossInterleavedEndpointsAndFiltersByStatus(t *testing.T) {
	e := newEnv(t)
	other := e.ns + "-other"
	e.createNamespace(other)
	e.createEndpoint("orders")
	e.createEndpoint("crm")
	ctx := context.Background()
	base := time.Now().Add(-time.Hour).UTC()

	// 150 deliveries of orders, interleaved with crm's and another namespace's orders, as the
	// dispatcher logs them: one record per attempt; intermediate failures precede the outcome.
	var terminal []string // delivery ids in the order their outcome was logged
	states := map[string]string{}
	intermediate := 0
	var pendingFailure *records.LogRecord
	for i := range 150 {
		m := e.delivery("orders", i, base.Add(time.Duration(i)*time.Second))
		e.writeAttempt(e.ns, records.LogRecord{DeliveryID: records.DeliveryID(fmt.Sprint("c", i), e.ns, "crm"), Namespace: e.ns, Endpoint: "crm",
			State: records.StateSucceeded, Attempt: 1, Time: base, Response: records.Response{StatusCode: 200}})
		e.writeAttempt(other, records.LogRecord{DeliveryID: records.DeliveryID(fmt.Sprint("o", i), other, "orders"), Namespace: other, Endpoint: "orders",
			State: records.StateSucceeded, Attempt: 1, Time: base, Response: records.Response{StatusCode: 200}})
		if pendingFailure != nil {
			// The outcome of the previous delivery's retry comes after this one's first record.
			e.writeAttempt(e.ns, *pendingFailure)
			terminal = append(terminal, pendingFailure.DeliveryID)
			states[pendingFailure.DeliveryID] = pendingFailure.State
			pendingFailure = nil
		}
		rec := records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, Namespace: e.ns, Endpoint: "orders",
			Attempt: 1, Time: m.Created, LatencyMS: 12}
		if i%3 == 0 {
			next := m.Created.Add(30 * time.Second)
			failed := rec
			failed.State, failed.Reason, failed.NextAttemptAt = records.StateFailed, records.FailStatusCode, &next
			failed.Response = records.Response{StatusCode: 500, Body: "oops"}
			e.writeAttempt(e.ns, failed)
			intermediate++
			outcome := rec
			outcome.Attempt = 2
			outcome.State, outcome.Response = records.StateSucceeded, records.Response{StatusCode: 200}
			if i%2 == 0 {
				outcome.State, outcome.DeadLetterReason = records.StateDeadLetter, records.ReasonExhausted
				outcome.Response = records.Response{StatusCode: 503}
			}
			pendingFailure = &outcome
			continue
		}
		rec.State, rec.Response = records.StateSucceeded, records.Response{StatusCode: 204}
		e.writeAttempt(e.ns, rec)
		terminal = append(terminal, rec.DeliveryID)
		states[rec.DeliveryID] = rec.State
	}
	if pendingFailure != nil {
		e.writeAttempt(e.ns, *pendingFailure)
		terminal = append(terminal, pendingFailure.DeliveryID)
		states[pendingFailure.DeliveryID] = pendingFailure.State
	}

	// Live deliveries: four waiting, of which the dispatcher has taken the two oldest: one is
	// being attempted, the other failed and is retried in place (its failed attempt is logged
	// while it stays in flight); and one failed delivery waits for its scheduled retry.
	cons, err := e.js.CreateOrUpdateConsumer(ctx, e.cfg.For(e.ns).DeliveriesStream(),
		e.cfg.For(e.ns).EndpointConsumerConfig("orders", streams.EndpointConsumerOptions{MaxInFlight: 10, Timeout: time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	var live []records.DeliveryMeta
	for i := 1000; i < 1004; i++ {
		m := e.delivery("orders", i, time.Now().UTC())
		e.writeDelivery(m, `{"n":1}`)
		live = append(live, m)
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	taken := 0
	for m := range batch.Messages() {
		if id := records.ParseDeliveryMeta(m.Headers()).DeliveryID; id != live[taken].DeliveryID {
			t.Fatalf("the consumer took %s, want %s", id, live[taken].DeliveryID)
		}
		taken++
	}
	if taken != 2 {
		t.Fatalf("took %d deliveries", taken)
	}
	heldNext := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	e.writeAttempt(e.ns, records.LogRecord{DeliveryID: live[1].DeliveryID, EventID: live[1].EventID, EventType: live[1].EventType,
		Namespace: e.ns, Endpoint: "orders", State: records.StateFailed, Attempt: 1, Time: time.Now().UTC(), LatencyMS: 7,
		Reason: records.FailTimeout, Response: records.Response{Error: "timeout after 10s"}, NextAttemptAt: &heldNext})
	intermediate++
	retry := e.delivery("orders", 2000, time.Now().UTC())
	retry.Attempts = 3
	retry.History = []records.Attempt{{N: 3, Time: time.Now().UTC(), StatusCode: 429, LatencyMS: 40, Reason: records.FailStatusCode}}
	due := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Second)
	e.writeRetry(retry, due, `{"n":2}`)

	want := []string{retry.DeliveryID, live[3].DeliveryID, live[2].DeliveryID, live[1].DeliveryID, live[0].DeliveryID}
	for i := len(terminal) - 1; i >= 0; i-- {
		want = append(want, terminal[i])
	}
	cursorOf := func(l plugin.LogEntry) string { return l.Cursor }

	got, n := pages(t, e, cursorOf, "log", "orders", "--limit", "50")
	if n != 4 || strings.Join(ids(got), ",") != strings.Join(want, ",") {
		t.Fatalf("%d pages; log order\n got %v\nwant %v", n, ids(got), want)
	}
	if got[0].Status != records.StateFailed || got[0].NextAttemptAt == nil || !got[0].NextAttemptAt.Equal(due) || got[0].Attempts != 3 ||
		got[0].LastResponse == nil || got[0].LastResponse.StatusCode != 429 {
		t.Errorf("scheduled retry entry: %+v", got[0])
	}
	if got[1].Status != records.StatePending || got[2].Status != records.StatePending || got[4].Status != records.StateAttempting || got[4].Attempts != 0 {
		t.Errorf("live states: %+v %+v %+v", got[1], got[2], got[4])
	}
	if h := got[3]; h.Status != records.StateFailed || h.Attempts != 1 || h.NextAttemptAt == nil || !h.NextAttemptAt.Equal(heldNext) ||
		h.LastResponse == nil || h.LastResponse.Error != "timeout after 10s" {
		t.Errorf("delivery retried in place: %+v", h)
	}
	for _, l := range got[5:] {
		if l.Status != states[l.ID] {
			t.Fatalf("%s: status %s, want %s", l.ID, l.Status, states[l.ID])
		}
	}

	// The default page is 25; filters keep only their status, still newest first.
	var first plugin.Page[plugin.LogEntry]
	e.run("log", "orders", "-o", "json").must(t, plugin.ExitOK).decode(t, &first)
	if len(first.Data) != 25 || !first.HasMore {
		t.Errorf("default page: %d entries, hasMore %v", len(first.Data), first.HasMore)
	}
	for status, wantIDs := range map[string][]string{
		records.StatePending:    {live[3].DeliveryID, live[2].DeliveryID},
		records.StateAttempting: {live[0].DeliveryID},
		records.StateFailed:     {retry.DeliveryID, live[1].DeliveryID},
	} {
		got, _ := pages(t, e, cursorOf, "log", "orders", "--status", status)
		if strings.Join(ids(got), ",") != strings.Join(wantIDs, ",") {
			t.Errorf("--status %s: got %v, want %v", status, ids(got), wantIDs)
		}
	}
	for _, status := range []string{records.StateSucceeded, records.StateDeadLetter} {
		var wantIDs []string
		for _, id := range want[5:] {
			if states[id] == status {
				wantIDs = append(wantIDs, id)
			}
		}
		got, n := pages(t, e, cursorOf, "log", "orders", "--status", status, "--limit", "10")
		if strings.Join(ids(got), ",") != strings.Join(wantIDs, ",") || n != (len(wantIDs)+9)/10 {
			t.Errorf("--status %s: %d pages, got %v, want %v", status, n, ids(got), wantIDs)
		}
	}

	// Every attempt, including the failed ones that were retried.
	attempts, _ := pages(t, e, cursorOf, "log", "orders", "--attempts", "--limit", "100")
	if len(attempts) != 150+intermediate {
		t.Errorf("--attempts: %d records, want %d", len(attempts), 150+intermediate)
	}
	failed, _ := pages(t, e, cursorOf, "log", "orders", "--attempts", "--status", "failed", "--limit", "100")
	if len(failed) != intermediate || failed[0].ID != live[1].DeliveryID || failed[1].Attempt != 1 || failed[1].NextAttemptAt == nil || failed[1].LastResponse.StatusCode != 500 {
		t.Errorf("--attempts --status failed: %d records (want %d), first %+v", len(failed), intermediate, failed[0])
	}

	// Table mode shows a cursor that continues the log.
	r := e.run("log", "orders", "--limit", "5").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "STATUS") || !strings.Contains(r.out, retry.DeliveryID) {
		t.Errorf("table:\n%s", r)
	}
	i := strings.Index(r.out, "--after ")
	if i < 0 {
		t.Fatalf("no cursor in table mode:\n%s", r)
	}
	cursor := strings.Fields(r.out[i+len("--after "):])[0]
	var next plugin.Page[plugin.LogEntry]
	e.run("log", "orders", "--limit", "5", "--after", cursor, "-o", "json").must(t, plugin.ExitOK).decode(t, &next)
	if strings.Join(ids(next.Data), ",") != strings.Join(want[5:10], ",") {
		t.Errorf("continuing from the table's cursor: got %v, want %v", ids(next.Data), want[5:10])
	}
	yamlValid(t, e.run("log", "orders", "--limit", "3", "-o", "yaml").must(t, plugin.ExitOK))

	// Other endpoints see only their own.
	crm, _ := pages(t, e, cursorOf, "log", "crm", "--limit", "100")
	if len(crm) != 150 {
		t.Errorf("crm: %d entries, want 150", len(crm))
	}
}

func TestLogErrors(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	for _, args := range [][]string{
		{"log", "orders", "--limit", "101"},
		{"log", "orders", "--limit", "0"},
		{"log", "orders", "--status", "done"},
		{"log", "orders", "--after", "whdl_nope"},
		{"log", "orders", "--attempts", "--status", "pending"},
		{"log"},
	} {
		e.run(args...).must(t, plugin.ExitUsage)
	}
	r := e.run("log", "nope").must(t, plugin.ExitNotFound)
	if !strings.Contains(r.errOut, `webhookendpoint "nope"`) {
		t.Errorf("not found message: %s", r)
	}
	r = e.run("log", "orders").must(t, plugin.ExitOK)
	if !strings.Contains(r.errOut, "No deliveries") {
		t.Errorf("empty log: %s", r)
	}
	var p plugin.Page[plugin.LogEntry]
	e.run("log", "orders", "-o", "json").must(t, plugin.ExitOK).decode(t, &p)
	if p.Data == nil || len(p.Data) != 0 || p.HasMore {
		t.Errorf("empty log JSON: %+v", p)
	}
}

// Sub-millisecond latencies print with a useful precision (they used to print as 0ms); records
// written before latencyUs existed still print their whole milliseconds.
func TestLogPrintsSubMillisecondLatencies(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	base := time.Now().Add(-time.Minute).UTC()
	for i, lat := range []struct{ ms, us int64 }{{12, 0}, {3, 3260}, {0, 437}} {
		m := e.delivery("orders", i, base.Add(time.Duration(i)*time.Second))
		e.writeAttempt(e.ns, records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, Namespace: e.ns, Endpoint: "orders",
			State: records.StateSucceeded, Attempt: 1, Time: m.Created, LatencyMS: lat.ms, LatencyUS: lat.us, Response: records.Response{StatusCode: 200}})
	}
	out := e.run("log", "orders").must(t, 0).out
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a header and 3 entries:\n%s", out)
	}
	for i, want := range []string{"0.4ms", "3.3ms", "12ms"} { // newest first
		if f := strings.Fields(lines[i+1]); !slices.Contains(f, want) {
			t.Errorf("entry %d lacks latency %s: %q", i, want, lines[i+1])
		}
	}
	var page struct {
		Data []plugin.LogEntry `json:"data"`
	}
	e.run("log", "orders", "-o", "json").must(t, 0).decode(t, &page)
	if len(page.Data) != 3 || page.Data[0].LatencyUS == nil || *page.Data[0].LatencyUS != 437 || page.Data[2].LatencyUS != nil || *page.Data[2].LatencyMS != 12 {
		t.Errorf("JSON latencies: %+v", page.Data)
	}
}

// Records written together in one message are entries of their own, newest first, and a page
// may end between them: the next page goes on with the rest of the message, none shown twice.
func TestLogPagesThroughRecordsWrittenTogether(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	base := time.Now().Add(-time.Minute).UTC()
	var recs []records.LogRecord
	for i := range 5 {
		m := e.delivery("orders", i, base.Add(time.Duration(i)*time.Second))
		recs = append(recs, records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, Namespace: e.ns, Endpoint: "orders",
			State: records.StateSucceeded, Attempt: 1, Time: m.Created, Response: records.Response{StatusCode: 200}})
	}
	e.writeAttempt(e.ns, recs[0])
	e.stored(e.ns).LogBatch(recs[1:4]...)
	e.writeAttempt(e.ns, recs[4])
	got, n := pages(t, e, func(le plugin.LogEntry) string { return le.Cursor }, "log", "orders", "--limit", "2")
	want := []string{recs[4].DeliveryID, recs[3].DeliveryID, recs[2].DeliveryID, recs[1].DeliveryID, recs[0].DeliveryID}
	if !slices.Equal(ids(got), want) || n != 3 {
		t.Errorf("%d pages of %v, want 3 of %v", n, ids(got), want)
	}
}

// The events an endpoint has not settled are on its namespace's events stream: those its
// namespace's intake consumer (the shared lane) has not handed out are pending, those handed
// out are attempting; other endpoints' events are not listed, and an event parked in the
// deliveries stream is listed once.
func TestLogListsEventsWaitingOnTheEventsStream(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	ctx := context.Background()
	set := e.cfg.For(e.ns)
	if err := set.EnsureIntakeConsumer(ctx, e.js, e.ns, time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	st := e.stored(e.ns)
	st.Event("order.created", "evt_1", `{}`, nil)
	st.Event("invoice.paid", "evt_2", `{}`, nil)
	st.Event("order.created", "evt_3", `{}`, nil)
	st.Event("order.created", "evt_4", `{}`, nil)
	cons, err := e.js.Consumer(ctx, set.EventsStream(), streams.IntakeConsumer(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second)) // evt_1, evt_2, evt_3: handed out
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for msg := range batch.Messages() {
		n++
		switch n {
		case 2: // evt_2 is no endpoint's
			if err := msg.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		case 3: // evt_3 is held: parked on the deliveries stream, then acknowledged (above the
			// ack floor: evt_1 is still out)
			m := e.delivery("orders", 0, time.Now())
			m.EventID, m.DeliveryID = "evt_3", records.DeliveryID("evt_3", e.ns, "orders")
			e.writeTo(set.ParkSubject("orders"), m, `{}`)
			if err := msg.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n != 3 {
		t.Fatalf("fetched %d events, want 3", n)
	}
	var page struct {
		Data []plugin.LogEntry `json:"data"`
	}
	e.run("log", "orders", "-o", "json").must(t, 0).decode(t, &page)
	got := map[string]string{}
	for _, le := range page.Data {
		if _, dup := got[le.EventID]; dup {
			t.Errorf("%s listed twice", le.EventID)
		}
		got[le.EventID] = le.Status
	}
	want := map[string]string{"evt_1": records.StateAttempting, "evt_3": records.StatePending, "evt_4": records.StatePending}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("entries %v, want %v", got, want)
	}
	e.run("log", "orders", "--status", "pending", "-o", "json").must(t, 0).decode(t, &page)
	if ids := len(page.Data); ids != 2 {
		t.Errorf("%d pending entries, want 2 (evt_4, and evt_3 held): %+v", ids, page.Data)
	}
}
