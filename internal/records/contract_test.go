package records

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

func TestBoundCutsWithoutBreakingUTF8(t *testing.T) {
	for _, n := range []int{0, 1, 3, 4, 5, 100} {
		s := Bound(strings.Repeat("é", 50), n)
		if len(s) > max(n, len(truncatedMark)) || !utf8.ValidString(s) {
			t.Errorf("Bound(…, %d) = %q (%d bytes)", n, s, len(s))
		}
	}
	if Bound("short", 10) != "short" {
		t.Error("a short string changed")
	}
}

func TestRedactURLsRemovesCredentials(t *testing.T) {
	cases := map[string][]string{
		`Post "https://user:pw@hooks.example.com/in?token=s3cr3t&x=1#frag": dial tcp 10.0.0.1:443: i/o timeout`: {"s3cr3t", "pw@", "frag"},
		`redirects are not followed: HTTP://login.example.com/cb?code=abc123`:                                   {"abc123"},
		`Post "http://[::1]:%zz/?key=k3y": invalid URL escape`:                                                  {"k3y"},
	}
	for in, leaks := range cases {
		out := RedactURLs(in)
		for _, leak := range leaks {
			if strings.Contains(out, leak) {
				t.Errorf("RedactURLs(%q) = %q still holds %q", in, out, leak)
			}
		}
		if !strings.Contains(out, "example.com") && !strings.Contains(out, "[::1]") {
			t.Errorf("RedactURLs(%q) = %q lost the host", in, out)
		}
	}
	for _, same := range []string{"no url here", "connection refused", `Post "https://h.example.com/p": EOF`} {
		if got := RedactURLs(same); got != same {
			t.Errorf("RedactURLs(%q) = %q, want it unchanged", same, got)
		}
	}
}

// A receiver's 1.5 MB Location header ends up bounded wherever it is stored.
func TestReceiverStringsAreBounded(t *testing.T) {
	huge := "redirects are not followed: https://r.example.com/" + strings.Repeat("a", 1500<<10) + "?sig=x"
	if got := StoredError(huge); len(got) > MaxErrorText || strings.Contains(got, "sig=x") {
		t.Errorf("StoredError kept %d bytes", len(got))
	}
	rec := LogRecord{DeliveryID: "whdl_a", State: StateFailed, Attempt: 1, Response: Response{StatusCode: 302, Error: huge, Body: strings.Repeat("b", 5000)},
		RequestHeaders: map[string]string{"X-Big": strings.Repeat("h", 5000)}}
	msg := LogMessage("whk.log.ns.ep", &rec, nil)
	if len(msg.Data) > 8<<10 {
		t.Errorf("log record is %d bytes", len(msg.Data))
	}
	h := nats.Header{}
	SetDeliveryMeta(h, DeliveryMeta{DeliveryID: "whdl_a", EventID: "e", History: []Attempt{{N: 1, Error: huge}}})
	last := &Response{StatusCode: 302, Error: huge}
	dl := NewDeadLetter(h, ReasonExhausted, "1 attempt; last: "+huge, last, time.Now())
	b, _ := json.Marshal(dl)
	if len(b) > 8<<10 {
		t.Errorf("dead letter record is %d bytes", len(b))
	}
}

// An event taken from an events stream keeps none of the operator's headers its producer set
// (whatever their case), but keeps its own, JetStream's (its id), and, on an operational event
// alone, the endpoint it is about.
func TestStripOperatorHeaders(t *testing.T) {
	forged := func() nats.Header {
		return nats.Header{
			"Whk-Delivery-Id": {"whdl_f"}, "Whk-Event-Id": {"forged"}, "Whk-Attempts": {"3"}, "Whk-Test": {"true"},
			"Whk-Replay-Of": {"whdl_x"}, "whk-history": {"[]"}, "WHK-REDELIVERED": {"true"}, "Whk-Ops-Endpoint": {"orders"},
			"Nats-Msg-Id": {"evt_1"}, "X-Tenant": {"acme"}, "Content-Type": {"application/json"}, "X-Whk-Note": {"kept"},
		}
	}
	for _, tc := range []struct {
		eventType string
		keep      []string
	}{
		{"order.created", []string{"Nats-Msg-Id", "X-Tenant", "Content-Type", "X-Whk-Note"}},
		{"order.webhook_operator.x", []string{"Nats-Msg-Id", "X-Tenant", "Content-Type", "X-Whk-Note"}},
		{OpsCircuitOpened, []string{"Nats-Msg-Id", "X-Tenant", "Content-Type", "X-Whk-Note", HOpsEndpoint}},
	} {
		h := forged()
		n := StripOperatorHeaders(h, tc.eventType)
		var got []string
		for k := range h {
			got = append(got, k)
		}
		slices.Sort(got)
		want := slices.Sorted(slices.Values(tc.keep))
		if !slices.Equal(got, want) || n != len(forged())-len(want) {
			t.Errorf("%s: kept %v (%d deleted), want %v", tc.eventType, got, n, want)
		}
		if m := ParseDeliveryMeta(h); m.DeliveryID != "" || m.EventID != "" || m.Attempts != 0 || m.Test || m.ReplayOf != "" || m.Redelivered {
			t.Errorf("%s: delivery meta read after stripping: %+v", tc.eventType, m)
		}
	}
	if StripOperatorHeaders(nil, "order.created") != 0 {
		t.Error("a message without headers had some deleted")
	}
}

// Producer-supplied Whk-* and Nats-* headers never reach a delivery; the event's own do.
func TestNewDeliveryStripsForgedHeaders(t *testing.T) {
	ev := nats.Header{}
	ev.Set("Content-Type", "application/cloudevents+json")
	ev.Set("X-Tenant", "acme")
	ev["Whk-Replay-Of"] = []string{"whdl_forged"}
	ev["whk-attempts"] = []string{"99"}
	ev["WHK-HISTORY"] = []string{"[]"}
	ev["Nats-Msg-Id"] = []string{"evt_1"}
	ev["nats-expected-stream"] = []string{"X"}
	m := DeliveryMeta{DeliveryID: "whdl_1", EventID: "evt_1", EventType: "order.created", Namespace: "ns", Endpoint: "orders"}
	msg := NewDelivery("whk.d.ns.orders", ev, []byte(`{}`), m)
	for k := range msg.Header {
		switch {
		case k == HeaderMsgID || strings.HasPrefix(k, "Whk-"):
		case IsOperatorHeader(k):
			t.Errorf("forged header %s reached the delivery", k)
		}
	}
	got := ParseDeliveryMeta(msg.Header)
	if got.ReplayOf != "" || got.Attempts != 0 || got.DeliveryID != "whdl_1" || msg.Header.Get(HeaderMsgID) != "whdl_1" {
		t.Errorf("delivery meta %+v, msg id %q", got, msg.Header.Get(HeaderMsgID))
	}
	if msg.Header.Get("X-Tenant") != "acme" || msg.Header.Get("Content-Type") != "application/cloudevents+json" {
		t.Errorf("event headers lost: %v", msg.Header)
	}
	if ev.Get("Whk-Delivery-Id") != "" {
		t.Error("the event's headers were modified")
	}
}

func TestHeaderSizeIsAnUpperBound(t *testing.T) {
	h := nats.Header{}
	h.Set("A", "1")
	h.Set("Bb", "22")
	// "NATS/1.0\r\n" + "A: 1\r\n" + "Bb: 22\r\n" + "\r\n"
	if got, want := HeaderSize(h), 10+6+8+2; got != want {
		t.Errorf("HeaderSize = %d, want %d", got, want)
	}
	msg := &nats.Msg{Header: h, Data: make([]byte, 100)}
	if MsgSize(msg) != 126 || !Fits(msg, 126) || Fits(msg, 125) || !Fits(msg, 0) {
		t.Errorf("MsgSize %d", MsgSize(msg))
	}
}

// A dead letter always fits the server's maximum payload: the payload is cut and marked.
func TestDeadLetterMessageFits(t *testing.T) {
	h := nats.Header{}
	h.Set("Content-Type", "application/json")
	SetDeliveryMeta(h, DeliveryMeta{DeliveryID: "whdl_a", EventID: "evt", Namespace: "ns", Endpoint: "ep"})
	dl := NewDeadLetter(h, ReasonPayloadTooLarge, "too large", nil, time.Now())
	payload := make([]byte, 10000)
	msg := DeadLetterMessage("whk.dlq.ns.ep.whdl_a", dl, payload, 4096)
	if MsgSize(msg) > 4096 || len(msg.Data) == 0 {
		t.Fatalf("dead letter is %d bytes with %d of payload, limit 4096", MsgSize(msg), len(msg.Data))
	}
	back, err := ParseDeadLetter(msg.Header)
	if err != nil || !back.PayloadTruncated || back.DeliveryID != "whdl_a" {
		t.Errorf("dead letter %+v, %v", back, err)
	}
	whole := DeadLetterMessage("s", dl, []byte("{}"), 4096)
	if back, _ := ParseDeadLetter(whole.Header); back.PayloadTruncated || string(whole.Data) != "{}" {
		t.Error("a dead letter that fits was changed")
	}
}

// One rule names a delivery without an id: the dispatcher and the controller's drain, which
// read the same stored message, name it alike.
func TestIdentifyNamesAMessageWithoutIDByWhereItIsStored(t *testing.T) {
	var a, b DeadLetter
	a.Identify("WEBHOOKS_DELIVERIES_ns", 42, "ns", "ep")
	b.Identify("WEBHOOKS_DELIVERIES_ns", 42, "ns", "ep")
	if a.DeliveryID != b.DeliveryID || !IsDeliveryID(a.DeliveryID) || a.Namespace != "ns" || a.Endpoint != "ep" {
		t.Errorf("identified as %+v and %+v", a, b)
	}
	var c DeadLetter
	c.Identify("WEBHOOKS_DELIVERIES_ns", 43, "ns", "ep")
	if c.DeliveryID == a.DeliveryID {
		t.Error("two stored messages share an id")
	}
	d := DeadLetter{DeliveryID: "whdl_keep", Namespace: "x", Endpoint: "y"}
	d.Identify("S", 1, "ns", "ep")
	if d.DeliveryID != "whdl_keep" || d.Namespace != "x" {
		t.Errorf("Identify replaced what the message said: %+v", d)
	}
}

func TestLogMsgIDNamesTheOutcome(t *testing.T) {
	ok1 := LogRecord{DeliveryID: "whdl_a", State: StateSucceeded, Attempt: 1}
	ok2 := LogRecord{DeliveryID: "whdl_a", State: StateSucceeded, Attempt: 2}
	f1 := LogRecord{DeliveryID: "whdl_a", State: StateFailed, Attempt: 1}
	f2 := LogRecord{DeliveryID: "whdl_a", State: StateFailed, Attempt: 2}
	dl := LogRecord{DeliveryID: "whdl_a", State: StateDeadLetter, Attempt: 7}
	if ok1.MsgID() != ok2.MsgID() {
		t.Error("two successes of one delivery must be one record")
	}
	ids := map[string]bool{ok1.MsgID(): true, f1.MsgID(): true, f2.MsgID(): true, dl.MsgID(): true}
	if len(ids) != 4 {
		t.Errorf("outcomes share ids: %v", ids)
	}
	msg := LogMessage("s", &f1, make([]byte, 0, 64))
	if msg.Header.Get(HeaderMsgID) != f1.MsgID() {
		t.Error("no message id")
	}
	var back LogRecord
	if err := json.Unmarshal(msg.Data, &back); err != nil || back.DeliveryID != "whdl_a" {
		t.Errorf("record %s: %v", msg.Data, err)
	}
}

func TestInvalidEvent(t *testing.T) {
	ok := nats.Header{}
	ok.Set("Content-Type", "application/json; charset=utf-8")
	ok.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	ok["Whk-Anything"] = []string{"\x01"} // stripped on ingest, not sent
	ok["X Bad Name"] = []string{"v"}      // not forwarded (ForwardedHeaders), never fatal
	ok["X-Ctl"] = []string{"a\x01"}
	if why := InvalidEvent("evt_1", "order.created", ok); why != "" {
		t.Errorf("a valid event refused: %s", why)
	}
	bad := func(k, v string) nats.Header { return nats.Header{k: []string{v}} }
	for name, tc := range map[string]struct {
		id, typ string
		h       nats.Header
	}{
		"control character in Content-Type": {"evt", "a", bad("Content-Type", "application/json\x01")},
		"control character in traceparent":  {"evt", "a", bad("traceparent", "00-\x7f")},
		"control character in event type":   {"evt", "order\x02created", nil},
		"event id with a space":             {"evt 1", "a", nil},
		"event id too long":                 {strings.Repeat("e", 257), "a", nil},
	} {
		if InvalidEvent(tc.id, tc.typ, tc.h) == "" {
			t.Errorf("%s: accepted", name)
		}
	}
}
