package records

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

func TestDeliveryIDsAreDeterministicAndDistinct(t *testing.T) {
	a := DeliveryID("evt_1", "ns", "orders")
	if a != DeliveryID("evt_1", "ns", "orders") {
		t.Error("the same event and endpoint gave two ids")
	}
	if a == DeliveryID("evt_1", "ns", "crm") || a == DeliveryID("evt_1", "ns2", "orders") {
		t.Error("different endpoints share an id")
	}
	if !IsDeliveryID(a) || IsDeliveryID("whdl_x") || IsDeliveryID("evt_1") {
		t.Errorf("IsDeliveryID wrong for %q", a)
	}
	r := ReplayDeliveryID(a, "key-1")
	if r == a || r != ReplayDeliveryID(a, "key-1") || r == ReplayDeliveryID(a, "key-2") {
		t.Error("replay ids must be stable per key and distinct from the original")
	}
}

func TestDeliveryMetaRoundTrip(t *testing.T) {
	now := time.Date(2026, 7, 19, 9, 15, 25, 123, time.UTC)
	m := DeliveryMeta{DeliveryID: "whdl_a", EventID: "evt", EventType: "order.created", EventTime: now, EventSeq: 42,
		Namespace: "ns", Endpoint: "orders.v1", Created: now, Attempts: 2, ReplayOf: "whdl_b",
		History: []Attempt{{N: 1, Time: now, StatusCode: 500, LatencyMS: 3, Reason: FailStatusCode}}}
	h := nats.Header{}
	h.Set(HeaderContentType, "application/cloudevents+json")
	h.Set("Nats-Msg-Id", "x")
	SetDeliveryMeta(h, m)
	got := ParseDeliveryMeta(h)
	if got.DeliveryID != m.DeliveryID || got.EventSeq != 42 || got.Attempts != 2 || !got.EventTime.Equal(now) || len(got.History) != 1 || got.History[0].StatusCode != 500 || got.ReplayOf != "whdl_b" {
		t.Errorf("round trip lost data: %+v", got)
	}
	dl := NewDeadLetter(h, ReasonExhausted, "7 attempts", &Response{StatusCode: 500, Body: "no"}, now)
	msg := DeadLetterMessage("whk.dlq.ns.orders_v1.whdl_a", dl, []byte(`{}`), 1<<20)
	back, err := ParseDeadLetter(msg.Header)
	if err != nil {
		t.Fatal(err)
	}
	if back.Reason != ReasonExhausted || back.Endpoint != "orders.v1" || len(back.Attempts) != 1 || back.LastResponse.StatusCode != 500 {
		t.Errorf("dead letter lost data: %+v", back)
	}
	if _, ok := back.Headers["Nats-Msg-Id"]; ok {
		t.Error("JetStream headers leaked into the event's headers")
	}
	if msg.Header.Get(HeaderContentType) != "application/cloudevents+json" {
		t.Error("content type not kept")
	}
}

func TestCutBodyKeeps2KBWithoutBreakingUTF8(t *testing.T) {
	s, cut := CutBody([]byte(strings.Repeat("é", 2000)))
	if !cut || len(s) > MaxResponseBody || !utf8.ValidString(s) {
		t.Errorf("cut=%v len=%d valid=%v", cut, len(s), utf8.ValidString(s))
	}
	if s, cut := CutBody([]byte("ok")); cut || s != "ok" {
		t.Error("short body changed")
	}
}

func FuzzDecodeDeliveryRecords(f *testing.F) {
	f.Add(`[{"n":1,"time":"2026-01-01T00:00:00Z","statusCode":500,"latencyMs":3}]`, "3", "2026-01-01T00:00:00Z", "12")
	f.Add(`not json`, "-1", "yesterday", "x")
	f.Fuzz(func(t *testing.T, history, attempts, when, seq string) {
		h := nats.Header{}
		h.Set(HHistory, history)
		h.Set(HAttempts, attempts)
		h.Set(HEventTime, when)
		h.Set(HEventSeq, seq)
		h.Set(HDeadLetter, history)
		m := ParseDeliveryMeta(h) // must never panic
		_ = EncodeHistory(m.History)
		_, _ = ParseDeadLetter(h)
		_, _ = CutBody([]byte(history))
	})
}

func TestLogRecordAppendJSONEqualsEncodingJSON(t *testing.T) {
	next := time.Date(2026, 7, 19, 9, 15, 25, 123456789, time.FixedZone("x", 3600))
	recs := []LogRecord{
		{},
		{DeliveryID: "whdl_a", EventID: "evt <1> & \"q\"", EventType: "order.created", EventSeq: 18446744073709551615, EventNamespace: "shop", Namespace: "ns", Endpoint: "a.b", State: StateFailed,
			Attempt: 3, Time: next, LatencyMS: 12, LatencyUS: 12345, Reason: FailStatusCode, RequestHeaders: map[string]string{"b": "2", "a": "1\n", "Z": "\u2028x"},
			Response: Response{StatusCode: 503, Body: "bad \xff utf8 \x01 é", Truncated: true, Error: "e\t"}, NextAttemptAt: &next, ReplayOf: "whdl_b", DeadLetterReason: "x", Test: true},
	}
	for _, r := range recs {
		want, _ := json.Marshal(&r)
		if got := r.AppendJSON(nil); string(got) != string(want) {
			t.Errorf("AppendJSON:\n got %s\nwant %s", got, want)
		}
	}
}

func FuzzLogRecordAppendJSON(f *testing.F) {
	f.Add("evt_1", "body <b>\x00", "hdr", "v\u2029", 200, int64(5))
	f.Fuzz(func(t *testing.T, id, body, k, v string, code int, lat int64) {
		r := LogRecord{EventID: id, EventSeq: uint64(lat), Response: Response{Body: body, StatusCode: code}, RequestHeaders: map[string]string{k: v}, LatencyMS: lat / 1000, LatencyUS: lat,
			Time: time.Unix(lat, 0).UTC(), Test: code%2 == 0}
		if code%3 == 0 {
			r.PayloadRemoved = k
		}
		want, _ := json.Marshal(&r)
		if got := r.AppendJSON(nil); string(got) != string(want) {
			t.Fatalf("AppendJSON:\n got %q\nwant %q", got, want)
		}
	})
}

// The outcome headers say what the records say, for every state and for several records in
// one message; an error is bounded and on one line; the message's id is the record's for one
// record, one naming them all for several.
func TestOutcomeHeadersMatchTheRecords(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC)
	recs := []LogRecord{
		{DeliveryID: "whdl_a", Endpoint: "orders.v1", State: StateSucceeded, Attempt: 1, Time: at, Response: Response{StatusCode: 200}},
		{DeliveryID: "whdl_b", Endpoint: "orders", State: StateFailed, Attempt: 2, Time: at, Reason: FailStatusCode,
			Response: Response{StatusCode: 503, Error: "line one\nline two"}},
		{DeliveryID: "whdl_c", EventID: "evt with a space", EventType: "order.created", Endpoint: "orders", State: StateDeadLetter, Attempt: 7, Time: at,
			Reason: FailTimeout, DeadLetterReason: ReasonExhausted, Response: Response{Error: strings.Repeat("x", 2000)}},
	}
	check := func(msg *nats.Msg, want []LogRecord) {
		t.Helper()
		got, stored := ReadOutcomes(msg.Header), LogRecords(msg.Data)
		if len(got) != len(want) || len(stored) != len(want) {
			t.Fatalf("%d outcomes, %d records, want %d", len(got), len(stored), len(want))
		}
		for i := range want {
			fromJSON := OutcomeOf(&stored[i])
			if strings.ContainsAny(got[i].Error, "\r\n") || len(got[i].Error) > MaxOutcomeError+8 {
				t.Errorf("%s: error in the header %q", want[i].State, got[i].Error)
			}
			g := got[i]
			g.Error, fromJSON.Error = "", ""
			if want[i].State != StateDeadLetter {
				// The ids are in the header of dead letters only.
				fromJSON.DeliveryID, fromJSON.EventID, fromJSON.EventType = "", "", ""
			}
			if g != fromJSON || !g.Time.Equal(at) || stored[i].DeliveryID != want[i].DeliveryID {
				t.Errorf("record %d: header %+v, record %+v", i, g, fromJSON)
			}
		}
	}
	for _, rec := range recs {
		msg := LogMessage("whk.log.ns.x", &rec, nil)
		check(msg, []LogRecord{rec})
		if msg.Header.Get(HeaderMsgID) != rec.MsgID() {
			t.Errorf("a record alone has message id %q, want %q", msg.Header.Get(HeaderMsgID), rec.MsgID())
		}
	}
	var entries []LogEntry
	for i := range recs {
		entries = append(entries, EncodeLog(&recs[i], nil))
	}
	batch := LogBatch("whk.log.ns.x", entries)
	check(batch, recs)
	if again := LogBatch("whk.log.ns.x", entries); again.Header.Get(HeaderMsgID) != batch.Header.Get(HeaderMsgID) || !strings.HasPrefix(batch.Header.Get(HeaderMsgID), "batch:") {
		t.Errorf("batch ids %q and %q", batch.Header.Get(HeaderMsgID), again.Header.Get(HeaderMsgID))
	}
	if ReadOutcomes(nats.Header{}) != nil {
		t.Error("a message without the header has outcomes")
	}
}

func TestEventDeliveryOfAnEvent(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	h := nats.Header{}
	h.Set(HeaderMsgID, "evt_1")
	m, invalid, ok := EventDelivery("webhooks.shop.order.created", "webhooks", "WEBHOOKS_shop", 42, at, h, "shop", "orders")
	if !ok || invalid != "" || m.EventID != "evt_1" || m.EventType != "order.created" || m.EventSeq != 42 ||
		m.DeliveryID != DeliveryID("evt_1", "shop", "orders") || m.Endpoint != "orders" || !m.Created.Equal(at) {
		t.Errorf("own event: %+v %q %v", m, invalid, ok)
	}
	// A source namespace's event of the same id is another delivery.
	src, _, _ := EventDelivery("webhooks.billing.order.created", "webhooks", "WEBHOOKS_billing", 42, at, h, "shop", "orders")
	if src.DeliveryID == m.DeliveryID {
		t.Error("a source namespace's event shares the delivery id of the reader's own event")
	}
	// Without an id, one from where it is stored.
	m2, _, _ := EventDelivery("webhooks.shop.a", "webhooks", "WEBHOOKS_shop", 7, at, nats.Header{}, "shop", "orders")
	if m2.EventID != "evt_webhooks_shop_7" {
		t.Errorf("derived id %q", m2.EventID)
	}
	h.Set(HeaderContentType, "application/json\x01")
	if _, invalid, _ := EventDelivery("webhooks.shop.a", "webhooks", "WEBHOOKS_shop", 8, at, h, "shop", "orders"); invalid == "" {
		t.Error("a control character in Content-Type is a valid event")
	}
	if _, _, ok := EventDelivery("elsewhere.shop.a", "webhooks", "X", 1, at, h, "shop", "orders"); ok {
		t.Error("a subject outside the events prefix is an event")
	}
}

// A webhook-id names one event among the endpoint's namespace and its source namespaces: an
// own event keeps its id (escaped only when it holds '%' or '/'), a source event's is
// "<namespace>/<id>", and no two events share one.
func TestWebhookIDsNeverCollide(t *testing.T) {
	cases := []struct {
		ns, id, want string
	}{
		{"", "order-1", "order-1"},
		{"shop", "order-1", "shop/order-1"},
		{"", "shop/order-1", "shop%2Forder-1"},
		{"", "shop%2Forder-1", "shop%252Forder-1"},
		{"shop", "a/b", "shop/a%2Fb"},
		{"shop", "a%2Fb", "shop/a%252Fb"},
		{"sh", "op/order-1", "sh/op%2Forder-1"},
		{"", "100%", "100%25"},
	}
	seen := map[string]string{}
	for _, c := range cases {
		m := DeliveryMeta{EventID: c.id, EventNamespace: c.ns, Namespace: "reader"}
		got := m.WebhookID()
		if got != c.want {
			t.Errorf("(%q, %q): %q, want %q", c.ns, c.id, got, c.want)
		}
		if other, dup := seen[got]; dup {
			t.Errorf("(%q, %q) and %s share webhook-id %q", c.ns, c.id, other, got)
		}
		seen[got] = fmt.Sprintf("(%q, %q)", c.ns, c.id)
	}
	if o := (DeliveryMeta{Namespace: "reader"}).Origin(); o != "reader" {
		t.Errorf("Origin of an own event: %q", o)
	}
	if o := (DeliveryMeta{Namespace: "reader", EventNamespace: "shop"}).Origin(); o != "shop" {
		t.Errorf("Origin of a source event: %q", o)
	}
}

// A record as the dispatcher writes one: request headers and a response body.
func benchLogMessage() []byte {
	next := time.Date(2026, 12, 7, 10, 0, 5, 0, time.UTC)
	rec := LogRecord{DeliveryID: "evt_0123456789abcdef.orders", EventID: "evt_0123456789abcdef", EventType: "order.created", EventSeq: 123456,
		Namespace: "team-a", Endpoint: "orders", State: StateFailed, Attempt: 2, Time: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC),
		LatencyMS: 12, LatencyUS: 12345, Reason: "http_5xx", NextAttemptAt: &next,
		RequestHeaders: map[string]string{"Content-Type": "application/json", "User-Agent": "webhook-operator/1.0", "Webhook-Id": "evt_0123456789abcdef.orders",
			"Webhook-Timestamp": "1796637600", "Webhook-Signature": "[redacted]", "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		Response: Response{StatusCode: 503, Body: strings.Repeat(`{"error":"unavailable, try again later"}`, 20)}}
	e := EncodeLog(&rec, nil)
	return LogBatch("whk.log.team-a.orders", []LogEntry{e, e, e, e}).Data
}

func TestLogStatesReadWhatLogRecordsRead(t *testing.T) {
	data := benchLogMessage()
	recs, states := LogRecords(data), LogStates(data)
	if len(recs) != 4 || len(states) != 4 {
		t.Fatalf("read %d records and %d states, want 4", len(recs), len(states))
	}
	for i, r := range recs {
		s := states[i]
		if s.DeliveryID != r.DeliveryID || s.State != r.State || s.Attempt != r.Attempt || !s.Time.Equal(r.Time) || s.LatencyMS != r.LatencyMS ||
			s.LatencyUS != r.LatencyUS || s.Reason != r.Reason || s.Response.StatusCode != r.Response.StatusCode || s.Response.Error != r.Response.Error ||
			s.NextAttemptAt == nil || !s.NextAttemptAt.Equal(*r.NextAttemptAt) {
			t.Fatalf("state %+v of record %+v", s, r)
		}
	}
}

func BenchmarkLogRecords(b *testing.B) {
	data := benchLogMessage()
	b.ReportAllocs()
	for b.Loop() {
		LogRecords(data)
	}
}

func BenchmarkLogStates(b *testing.B) {
	data := benchLogMessage()
	b.ReportAllocs()
	for b.Loop() {
		LogStates(data)
	}
}

// The scan of a record's state takes what the log's writers write, and where it takes a line
// it reads what encoding/json reads; what it does not expect is left to encoding/json.
func FuzzScanState(f *testing.F) {
	for _, l := range bytes.Split(benchLogMessage(), []byte("\n")) {
		f.Add(string(l))
	}
	for _, l := range []string{
		`{"deliveryId":"a\"b","state":"succeeded","attempt":1,"time":"2026-12-07T10:00:00Z","latencyMs":3}`,
		`{"deliveryId":"é","state":"failed","attempt":2,"time":"2026-12-07T10:00:00.123456789+01:00","response":{"statusCode":503,"body":"x\\y","error":"EOF \u00e9"}}`,
		`{"DeliveryID":"a","state":"succeeded"}`,
		`{"deliveryId":null,"attempt":1}`,
		`{"attempt":1.0}`,
		`{"attempt":1e2}`,
		`{"requestHeaders":{"A":"}","B":["{",[],{}]},"deliveryId":"x","nextAttemptAt":"2026-12-07T10:00:05Z"}`,
		`{"response":{"Body":"x","STATUSCODE":5},"deliveryId":"x"}`,
		`{"deliveryId":"x",`,
		`{"deliveryId":"x"} x`,
		` { "deliveryId" : "x" , "attempt" : -3 } `,
		`{}`,
		`[]`,
		`{"time":"not a time"}`,
		`{"reason":"bad \ud800 surrogate","deliveryId":"\u0041"}`,
		"{\"reason\":\"\xff\"}",
	} {
		f.Add(l)
	}
	f.Fuzz(func(t *testing.T, line string) {
		var got, want LogState
		if !scanState([]byte(line), &got) {
			return
		}
		if !json.Valid([]byte(line)) {
			return // a member passed over is not checked
		}
		if err := json.Unmarshal([]byte(line), &want); err != nil {
			t.Fatalf("the scan took %q, which encoding/json refuses: %v", line, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%q: the scan read %+v, encoding/json %+v", line, got, want)
		}
	})
}

func TestTheScanTakesWhatTheWritersWrite(t *testing.T) {
	for _, l := range bytes.Split(benchLogMessage(), []byte("\n")) {
		var st LogState
		if !scanState(l, &st) || st.DeliveryID == "" {
			t.Fatalf("the scan did not take %s", l)
		}
	}
	for _, l := range []string{`{"attempt":1.0}`, `{"DeliveryID":"a"}`, `{"deliveryId":null}`, `{"deliveryId":"x",`, `{"deliveryId":"x"} x`} {
		var st LogState
		if scanState([]byte(l), &st) {
			t.Errorf("the scan took %s", l)
		}
	}
}
