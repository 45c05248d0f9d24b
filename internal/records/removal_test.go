package records

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// A rewritten delivery-log message keeps every record and its outcome, and drops the payload
// of the selected records only; a message with nothing left to remove is not rewritten.
func TestRewriteLogRemovesThePayloadOfSelectedRecords(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	recs := []LogRecord{
		{DeliveryID: "whdl_a", EventID: "evt_erase", Endpoint: "orders", State: StateFailed, Attempt: 1, Time: at,
			RequestHeaders: map[string]string{"X-Customer": "ana@example.com"}, Response: Response{StatusCode: 500, Body: "ana@example.com unknown", Error: "HTTP 500"}},
		{DeliveryID: "whdl_b", EventID: "evt_keep", Endpoint: "orders", State: StateSucceeded, Attempt: 1, Time: at,
			RequestHeaders: map[string]string{"X-Customer": "bob@example.com"}, Response: Response{StatusCode: 200, Body: "ok"}},
	}
	entries := []LogEntry{EncodeLog(&recs[0], nil), EncodeLog(&recs[1], nil)}
	orig := LogBatch("whk.log.ns.orders", entries)
	byID := func(r *LogRecord) bool { return r.EventID == "evt_erase" }

	msg, n := RewriteLog("WEBHOOKS_ATTEMPTS_ns", 42, orig.Subject, orig.Data, byID, PayloadErased)
	if msg == nil || n != 1 {
		t.Fatalf("rewrote %d records", n)
	}
	if strings.Contains(string(msg.Data), "ana@example.com") || !strings.Contains(string(msg.Data), "bob@example.com") {
		t.Errorf("rewritten records: %s", msg.Data)
	}
	got := LogRecords(msg.Data)
	if len(got) != 2 || got[0].PayloadRemoved != PayloadErased || got[1].PayloadRemoved != "" ||
		got[0].Response.StatusCode != 500 || got[0].Response.Error != "HTTP 500" || got[0].State != StateFailed {
		t.Errorf("records %+v", got)
	}
	if len(ReadOutcomes(msg.Header)) != 2 || !IsRewrite(msg.Header) || msg.Header.Get(HeaderMsgID) != RewriteID("WEBHOOKS_ATTEMPTS_ns", 42) {
		t.Errorf("headers %v", msg.Header)
	}
	if again, n := RewriteLog("WEBHOOKS_ATTEMPTS_ns", 99, msg.Subject, msg.Data, byID, PayloadErased); again != nil || n != 0 {
		t.Error("a message whose selected records have no payload left was rewritten again")
	}
	if IsRewrite(orig.Header) {
		t.Error("an original message counts as a rewrite")
	}
}

// A dead letter without its payload keeps its reason, attempts and last status code.
func TestRewriteDeadLetterKeepsTheAttemptHistory(t *testing.T) {
	h := nats.Header{}
	h.Set("X-Customer", "ana@example.com")
	SetDeliveryMeta(h, DeliveryMeta{DeliveryID: "whdl_a", EventID: "evt", Namespace: "ns", Endpoint: "ep",
		History: []Attempt{{N: 1, StatusCode: 503}, {N: 2, StatusCode: 503}}})
	dl := NewDeadLetter(h, ReasonExhausted, "gave up", &Response{StatusCode: 503, Body: "ana@example.com"}, time.Now())
	orig := DeadLetterMessage("whk.dlq.ns.ep.whdl_a", dl, []byte(`{"email":"ana@example.com"}`), 0)
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	msg, err := RewriteDeadLetter("WEBHOOKS_DLQ_ns", 7, orig.Subject, orig.Header, PayloadExpired, at)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Data) != 0 || strings.Contains(msg.Header.Get(HDeadLetter), "ana@example.com") || DeadLetterHasPayload(msg.Header) || !DeadLetterHasPayload(orig.Header) {
		t.Errorf("payload left: %q %v", msg.Data, msg.Header)
	}
	back, err := ParseDeadLetter(msg.Header)
	if err != nil || back.PayloadRemoved != PayloadExpired || back.PayloadRemovedAt == nil || !back.PayloadRemovedAt.Equal(at) ||
		len(back.Attempts) != 2 || back.LastResponse == nil || back.LastResponse.StatusCode != 503 || back.Reason != ReasonExhausted || back.DeliveryID != "whdl_a" {
		t.Errorf("dead letter %+v, %v", back, err)
	}
	if msg.Subject != orig.Subject || msg.Header.Get(HeaderMsgID) == orig.Header.Get(HeaderMsgID) {
		t.Errorf("subject %s, id %s", msg.Subject, msg.Header.Get(HeaderMsgID))
	}
}
