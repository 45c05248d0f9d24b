package replay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/replay"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// world is one test's namespace on its own nats-server, with its streams and bucket.
type world struct {
	t *testing.T
	testenv.Stored
	engine *replay.Engine
}

func newWorld(t *testing.T) *world {
	t.Helper()
	n := testenv.NewNATS(t)
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := streams.DefaultConfig()
	cfg.Storage = jetstream.MemoryStorage
	set := cfg.For("team-a")
	if err := set.Ensure(context.Background(), js); err != nil {
		t.Fatal(err)
	}
	return &world{t: t, Stored: testenv.Stored{T: t, JS: js, Set: set}, engine: &replay.Engine{JS: js, Set: set}}
}

// run replays sel to the end in batches of at most max, as the reconciler does, and returns
// every result and the number of batches.
func (w *world) run(sel replay.Selection, r replay.Run, max int) ([]replay.Result, int) {
	w.t.Helper()
	ctx := context.Background()
	cur, err := w.engine.Begin(ctx, sel)
	if err != nil {
		w.t.Fatal(err)
	}
	var all []replay.Result
	batches := 0
	for !cur.Done() {
		b, err := w.engine.Next(ctx, sel, r, cur, max)
		if err != nil {
			w.t.Fatal(err)
		}
		if len(b.Results) > max {
			w.t.Fatalf("a batch of %d results, at most %d asked", len(b.Results), max)
		}
		all = append(all, b.Results...)
		cur = b.Cursor
		batches++
		if batches > 1000 {
			w.t.Fatal("the replay does not end")
		}
	}
	return all, batches
}

// deliveries are the messages on the endpoint's delivery subject.
func (w *world) deliveries(ep string) []*jetstream.RawStreamMsg {
	return w.Msgs(w.Set.DeliveriesStream(), w.Set.WaitingFilter(ep))
}

func outcomes(rs []replay.Result) map[replay.Outcome]int {
	m := map[replay.Outcome]int{}
	for _, r := range rs {
		m[r.Outcome]++
	}
	return m
}

// Dead letters of one endpoint become new deliveries of that endpoint only, in batches of
// the size asked, each pointing at its original, with the event's own headers and body; the
// same name again replays nothing, and the same run read again after a restart counts its
// own work as replayed without publishing it twice.
func TestDeadLettersReplayOnceByName(t *testing.T) {
	w := newWorld(t)
	at := time.Now().Add(-time.Hour).UTC()
	var originals []records.DeadLetter
	for i := range 5 {
		m := w.Delivery("crm", fmt.Sprintf("evt_%d", i), uint64(i+1), at)
		originals = append(originals, w.DeadLetter(m, 3, records.ReasonExhausted, fmt.Sprintf(`{"n":%d}`, i), at, nil))
		w.DeadLetter(w.Delivery("orders", fmt.Sprintf("evt_%d", i), uint64(i+1), at), 3, records.ReasonExhausted, `{}`, at, nil)
	}
	sel := replay.Selection{Endpoint: "crm"}
	first := replay.Run{Name: "fix-1", Owner: "uid-1"}

	res, batches := w.run(sel, first, 2)
	if got := outcomes(res); got[replay.Replayed] != 5 || len(res) != 5 || batches != 3 {
		t.Fatalf("outcomes %v in %d batches, want 5 replayed in 3 batches of at most 2", got, batches)
	}
	got := w.deliveries("crm")
	if len(got) != 5 || len(w.deliveries("orders")) != 0 {
		t.Fatalf("%d deliveries for crm, %d for orders; want 5 and 0", len(got), len(w.deliveries("orders")))
	}
	for i, msg := range got {
		meta := records.ParseDeliveryMeta(msg.Header)
		dl := originals[i]
		if meta.DeliveryID != replay.ReplayedID(dl.DeliveryID, "fix-1") || meta.ReplayOf != dl.DeliveryID || meta.EventID != dl.EventID ||
			meta.Endpoint != "crm" || meta.Namespace != "team-a" || meta.Attempts != 0 || len(meta.History) != 0 || meta.EventSeq != dl.EventSeq {
			t.Errorf("delivery %d meta %+v (original %s)", i, meta, dl.DeliveryID)
		}
		if msg.Header.Get(records.HeaderMsgID) != meta.DeliveryID || string(msg.Data) != fmt.Sprintf(`{"n":%d}`, i) || msg.Header.Get("X-Tenant") != "acme" {
			t.Errorf("delivery %d headers %v body %s", i, msg.Header, msg.Data)
		}
	}

	// The same run read again from the start (a restart that lost its progress): its own work.
	res, _ = w.run(sel, first, 10)
	if got := outcomes(res); got[replay.Replayed] != 5 || len(w.deliveries("crm")) != 5 {
		t.Errorf("the same run again: %v and %d deliveries, want 5 replayed and still 5 deliveries", got, len(w.deliveries("crm")))
	}
	// Another replay of the same name (deleted and created again): nothing new.
	res, _ = w.run(sel, replay.Run{Name: "fix-1", Owner: "uid-2"}, 10)
	if got := outcomes(res); got[replay.AlreadyReplayed] != 5 || len(w.deliveries("crm")) != 5 {
		t.Errorf("the same name again: %v and %d deliveries, want 5 already replayed", got, len(w.deliveries("crm")))
	}
	// Another name: new deliveries.
	res, _ = w.run(sel, replay.Run{Name: "fix-2", Owner: "uid-3"}, 10)
	if got := outcomes(res); got[replay.Replayed] != 5 || len(w.deliveries("crm")) != 10 {
		t.Errorf("another name: %v and %d deliveries, want 5 more", got, len(w.deliveries("crm")))
	}
}

// A run stopped between its publish and the bucket's record of it (the key never written)
// publishes again on resume, and JetStream's de-duplication of the delivery id keeps one.
func TestAPublishWithoutItsKeyIsNotRepeated(t *testing.T) {
	w := newWorld(t)
	at := time.Now().Add(-time.Hour).UTC()
	m := w.Delivery("crm", "evt_1", 1, at)
	w.DeadLetter(m, 1, records.ReasonExhausted, `{}`, at, nil)
	r := replay.Run{Name: "fix-1", Owner: "uid-1"}
	if res, _ := w.run(replay.Selection{Endpoint: "crm"}, r, 10); outcomes(res)[replay.Replayed] != 1 {
		t.Fatalf("%+v", res)
	}
	kv, err := w.JS.KeyValue(context.Background(), w.Set.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(context.Background(), streams.ReplayKey("crm", "fix-1/"+m.DeliveryID)); err != nil {
		t.Fatal(err)
	}
	res, _ := w.run(replay.Selection{Endpoint: "crm"}, r, 10)
	if outcomes(res)[replay.Replayed] != 1 || len(w.deliveries("crm")) != 1 {
		t.Errorf("after losing the key: %+v and %d deliveries, want one", res, len(w.deliveries("crm")))
	}
}

// Reasons and times select among the dead letters; ids name them; a dead letter whose payload
// was cut is refused; ids of another endpoint's or unknown dead letters fail with why.
func TestDeadLetterSelection(t *testing.T) {
	w := newWorld(t)
	t0 := time.Now().Add(-3 * time.Hour).UTC()
	exhausted := w.DeadLetter(w.Delivery("crm", "evt_old", 1, t0), 3, records.ReasonExhausted, `{}`, t0, nil)
	disabled := w.DeadLetter(w.Delivery("crm", "evt_dis", 2, t0.Add(time.Hour)), 0, records.ReasonEndpointDisabled, `{}`, t0.Add(time.Hour), nil)
	recent := w.DeadLetter(w.Delivery("crm", "evt_new", 3, t0.Add(2*time.Hour)), 3, records.ReasonExhausted, `{}`, t0.Add(2*time.Hour), nil)
	other := w.DeadLetter(w.Delivery("orders", "evt_o", 4, t0), 3, records.ReasonExhausted, `{}`, t0, nil)
	cut := w.Delivery("crm", "evt_cut", 5, t0)
	big := strings.Repeat("x", 4096)
	h := nats.Header{}
	records.SetDeliveryMeta(h, cut)
	dl := records.NewDeadLetter(h, records.ReasonExhausted, "", nil, t0.Add(2*time.Hour))
	msg := records.DeadLetterMessage(w.Set.DeadLetterSubject("crm", cut.DeliveryID), dl, []byte(big), 2048)
	if _, err := w.JS.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}

	ids := func(rs []replay.Result) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Original+"="+string(r.Outcome))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		sel  replay.Selection
		want []string
	}{
		{"by reason", replay.Selection{Endpoint: "crm", Reasons: []string{records.ReasonEndpointDisabled}}, []string{disabled.DeliveryID + "=Replayed"}},
		{"since", replay.Selection{Endpoint: "crm", Since: t0.Add(90 * time.Minute)}, []string{recent.DeliveryID + "=Replayed", cut.DeliveryID + "=Refused"}},
		{"until", replay.Selection{Endpoint: "crm", Until: t0.Add(time.Hour)}, []string{exhausted.DeliveryID + "=Replayed"}},
		{"ids", replay.Selection{Endpoint: "crm", DeliveryIDs: []string{recent.DeliveryID, other.DeliveryID, records.DeliveryID("ghost", "team-a", "crm")}},
			[]string{recent.DeliveryID + "=Replayed", other.DeliveryID + "=Failed", records.DeliveryID("ghost", "team-a", "crm") + "=Failed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, _ := w.run(tc.sel, replay.Run{Name: tc.name, Owner: "u"}, 1)
			if got := ids(res); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for _, r := range res {
				if r.Outcome == replay.Failed && r.Original == other.DeliveryID && !strings.Contains(r.Message, `belongs to endpoint "orders"`) {
					t.Errorf("another endpoint's id: %q", r.Message)
				}
				if r.Outcome == replay.Refused && !strings.Contains(r.Message, "payload was cut") {
					t.Errorf("refused: %q", r.Message)
				}
			}
		})
	}
}

// A recover replays every delivery the log recorded as succeeded or dead-lettered between
// since and until, once each (not its failed attempts, not a test delivery, not another
// endpoint's), with its event's body from the events stream, or its dead letter's when the
// event is gone; one whose event is gone without a dead letter fails with why.
func TestRecoverReplaysTheLogBetweenTwoTimes(t *testing.T) {
	w := newWorld(t)
	// The log is written as the test runs: attempts a few minutes apart, recorded now.
	t0 := time.Now().Add(-15 * time.Minute).UTC()
	since, until := t0.Add(10*time.Minute), t0.Add(20*time.Minute)
	type ev struct {
		id    string
		state string
		at    time.Time
		test  bool
		ep    string
	}
	evs := []ev{
		{"before", records.StateSucceeded, t0, false, "crm"},
		{"ok_1", records.StateSucceeded, since, false, "crm"},
		{"ok_2", records.StateSucceeded, since.Add(time.Minute), false, "crm"},
		{"dead", records.StateDeadLetter, since.Add(2 * time.Minute), false, "crm"},
		{"test", records.StateSucceeded, since.Add(3 * time.Minute), true, "crm"},
		{"orders", records.StateSucceeded, since.Add(4 * time.Minute), false, "orders"},
		{"after", records.StateSucceeded, until, false, "crm"},
	}
	want := map[string]bool{"ok_1": true, "ok_2": true, "dead": true}
	// ok_2's outcome and dead's are written together, in one message, as under load.
	var together []records.LogRecord
	for _, e := range evs {
		seq := w.Event("order.created", e.id, `{"id":"`+e.id+`"}`, nats.Header{"X-Region": {"eu"}})
		m := w.Delivery(e.ep, e.id, seq, e.at)
		if e.state == records.StateSucceeded {
			// A failed attempt first: its record is not an outcome.
			w.Log(records.LogRecord{DeliveryID: m.DeliveryID, EventID: e.id, EventType: "order.created", EventSeq: seq, Namespace: "team-a",
				Endpoint: e.ep, State: records.StateFailed, Attempt: 1, Time: e.at})
		}
		rec := records.LogRecord{DeliveryID: m.DeliveryID, EventID: e.id, EventType: "order.created", EventSeq: seq, Namespace: "team-a",
			Endpoint: e.ep, State: e.state, Attempt: 2, Time: e.at, Test: e.test}
		if e.id == "ok_2" || e.id == "dead" {
			together = append(together, rec)
			continue
		}
		w.Log(rec)
	}
	w.LogBatch(together...)
	// A delivery recorded without its event's sequence, and one whose event is another's.
	lost := w.Delivery("crm", "lost", 0, since)
	w.Log(records.LogRecord{DeliveryID: lost.DeliveryID, EventID: "lost", EventType: "order.created", Namespace: "team-a", Endpoint: "crm",
		State: records.StateSucceeded, Attempt: 1, Time: since.Add(5 * time.Minute)})

	res, _ := w.run(replay.Selection{Endpoint: "crm", FromLog: true, Since: since, Until: until}, replay.Run{Name: "recover-1", Owner: "u"}, 2)
	got := map[string]replay.Outcome{}
	for _, r := range res {
		got[r.EventID] = r.Outcome
	}
	if len(res) != 4 || got["ok_1"] != replay.Replayed || got["ok_2"] != replay.Replayed || got["dead"] != replay.Replayed || got["lost"] != replay.Failed {
		t.Fatalf("results %+v", res)
	}
	for _, r := range res {
		if r.EventID == "lost" && !strings.Contains(r.Message, "does not say which event") {
			t.Errorf("lost: %q", r.Message)
		}
	}
	for _, msg := range w.deliveries("crm") {
		meta := records.ParseDeliveryMeta(msg.Header)
		if !want[meta.EventID] || string(msg.Data) != `{"id":"`+meta.EventID+`"}` || msg.Header.Get("X-Region") != "eu" || meta.ReplayOf == "" {
			t.Errorf("replayed %s: %v %s", meta.EventID, msg.Header, msg.Data)
		}
	}
	if n := len(w.deliveries("crm")); n != 3 {
		t.Errorf("%d deliveries, want 3", n)
	}
}

// A recover of a dead-lettered delivery whose event left the events stream uses its dead
// letter; without one, it fails and says the event is gone.
func TestRecoverFallsBackToTheDeadLetter(t *testing.T) {
	w := newWorld(t)
	at := time.Now().Add(-time.Hour).UTC()
	seq := w.Event("order.created", "evt_a", `{"a":1}`, nil)
	seqB := w.Event("order.created", "evt_b", `{"b":1}`, nil)
	a, b := w.Delivery("crm", "evt_a", seq, at), w.Delivery("crm", "evt_b", seqB, at)
	w.DeadLetter(a, 1, records.ReasonExhausted, `{"a":1}`, at, nil)
	for _, m := range []records.DeliveryMeta{a, b} {
		w.Log(records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, EventSeq: m.EventSeq, Namespace: "team-a",
			Endpoint: "crm", State: records.StateDeadLetter, Attempt: 1, Time: at})
	}
	st, err := w.JS.Stream(context.Background(), w.Set.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}
	res, _ := w.run(replay.Selection{Endpoint: "crm", FromLog: true, Since: at.Add(-time.Minute)}, replay.Run{Name: "r", Owner: "u"}, 10)
	if len(res) != 2 || res[0].Outcome != replay.Replayed || res[1].Outcome != replay.Failed ||
		!strings.Contains(res[1].Message, "no longer in the events stream") || !strings.Contains(res[1].Message, "dead letter is gone") {
		t.Fatalf("results %+v", res)
	}
	if got := w.deliveries("crm"); len(got) != 1 || string(got[0].Data) != `{"a":1}` {
		t.Errorf("deliveries %v", got)
	}
}

// Nothing selected or an empty stream: the replay is done at once.
func TestNothingToReplay(t *testing.T) {
	w := newWorld(t)
	for _, sel := range []replay.Selection{{Endpoint: "crm"}, {Endpoint: "crm", FromLog: true, Since: time.Now().Add(-time.Hour)}} {
		res, batches := w.run(sel, replay.Run{Name: "r", Owner: "u"}, 10)
		if len(res) != 0 || batches != 0 {
			t.Errorf("%+v: %d results in %d batches", sel, len(res), batches)
		}
	}
}

// A replay carries the event's own headers only: whatever operator (Whk-*) or JetStream
// (Nats-*) header a dead letter's record holds is left out, as the record contract says for
// every delivery, and the replay points at its original.
func TestReplayCarriesOnlyTheEventsHeaders(t *testing.T) {
	w := newWorld(t)
	at := time.Now().Add(-time.Hour).UTC()
	m := w.Delivery("orders", "evt_1", 1, at)
	dl := records.DeadLetter{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, Namespace: "team-a", Endpoint: "orders",
		Reason: records.ReasonExhausted, DeadLetteredAt: at, Headers: map[string][]string{
			"X-Tenant":                    {"acme"},
			"Nats-Expected-Last-Sequence": {"999999"},
			"Whk-Replay-Of":               {"whd_forged"},
			"Whk-Forged":                  {"1"},
		}}
	if _, err := w.JS.PublishMsg(context.Background(), records.DeadLetterMessage(w.Set.DeadLetterSubject("orders", m.DeliveryID), dl, []byte(`{}`), 0)); err != nil {
		t.Fatal(err)
	}
	if res, _ := w.run(replay.Selection{Endpoint: "orders", DeliveryIDs: []string{m.DeliveryID}}, replay.Run{Name: "r", Owner: "u"}, 1); len(res) != 1 || res[0].Outcome != replay.Replayed {
		t.Fatalf("results %+v", res)
	}
	got := w.deliveries("orders")
	if len(got) != 1 {
		t.Fatalf("%d deliveries", len(got))
	}
	h := got[0].Header
	if h.Get("X-Tenant") != "acme" || h.Get("Nats-Expected-Last-Sequence") != "" || h.Get("Whk-Forged") != "" ||
		h.Get(records.HReplayOf) != m.DeliveryID {
		t.Errorf("delivery headers %v", h)
	}
}

// A replay keeps the dead letter's retention clock: the delivery it makes carries when the
// dead letter's payload was stored (Whk-Retain-From), and a dead letter written of it keeps
// that time, so the payload is not kept longer for having been replayed; a replay of that
// dead letter keeps the first one's time.
func TestReplayKeepsTheDeadLettersRetentionClock(t *testing.T) {
	w := newWorld(t)
	at := time.Now().Add(-time.Hour).UTC()
	w.DeadLetter(w.Delivery("crm", "evt_1", 1, at), 3, records.ReasonExhausted, `{"n":1}`, at, nil)
	stored := w.Msgs(w.Set.DeadLetterStream(), ">")[0].Time

	if res, _ := w.run(replay.Selection{Endpoint: "crm"}, replay.Run{Name: "fix-1", Owner: "uid-1"}, 10); outcomes(res)[replay.Replayed] != 1 {
		t.Fatalf("outcomes %v, want the dead letter replayed", outcomes(res))
	}
	got := w.deliveries("crm")
	if len(got) != 1 {
		t.Fatalf("%d deliveries, want 1", len(got))
	}
	meta := records.ParseDeliveryMeta(got[0].Header)
	if !meta.RetainFrom.Equal(stored) {
		t.Fatalf("the replayed delivery's retention counts from %v, want the dead letter's %v", meta.RetainFrom, stored)
	}
	// The replay fails: its dead letter (as the dispatcher writes it) counts from there too.
	meta.Attempts = 1
	again := w.DeadLetter(meta, 1, records.ReasonExhausted, `{"n":1}`, time.Now(), nil)
	if again.RetainFrom == nil || !again.RetainFrom.Equal(stored) {
		t.Fatalf("the replay's dead letter counts its retention from %v, want %v", again.RetainFrom, stored)
	}
	var last *jetstream.RawStreamMsg
	for _, m := range w.Msgs(w.Set.DeadLetterStream(), ">") {
		last = m
	}
	if rf := records.RetainFrom(last.Header, last.Time); !rf.Equal(stored) {
		t.Fatalf("the stored dead letter's retention counts from %v, want %v", rf, stored)
	}
	// Replayed again, under another name: still the first dead letter's time.
	if res, _ := w.run(replay.Selection{Endpoint: "crm", DeliveryIDs: []string{again.DeliveryID}}, replay.Run{Name: "fix-2", Owner: "uid-2"}, 10); outcomes(res)[replay.Replayed] != 1 {
		t.Fatalf("outcomes %v, want the second dead letter replayed", outcomes(res))
	}
	for _, m := range w.deliveries("crm") {
		if meta := records.ParseDeliveryMeta(m.Header); meta.ReplayOf == again.DeliveryID && !meta.RetainFrom.Equal(stored) {
			t.Errorf("the second replay counts from %v, want %v", meta.RetainFrom, stored)
		}
	}
}
