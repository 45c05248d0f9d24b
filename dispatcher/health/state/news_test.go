package state

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/dispatcher/health/counts"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// The first dead letters after a quiet window are announced at once; those that follow within
// the window wait and are announced together, once, when it ends.
func TestDeadLetterNewsAreAnnouncedAtMostOncePerWindow(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	news := func(seq uint64, n int) *counts.DeadLetterNews {
		d := &counts.DeadLetterNews{}
		for i := range n {
			d.Add(seq+uint64(i), records.Outcome{DeliveryID: "whdl_" + string(rune('a'+i)), EventID: "evt", DeadLetterReason: records.ReasonExhausted, Time: t0})
		}
		return d
	}
	var s State
	if got := s.TakeDeadLetterNews(news(10, 1), t0, time.Minute); got == nil || got.Count != 1 || got.FirstSeq != 10 {
		t.Fatalf("the first dead letter: %+v, want it announced at once", got)
	}
	if got := s.TakeDeadLetterNews(news(20, 3), t0.Add(10*time.Second), time.Minute); got != nil {
		t.Fatalf("within the window: %+v announced, want them held", got)
	}
	if got := s.TakeDeadLetterNews(news(30, 12), t0.Add(20*time.Second), time.Minute); got != nil || s.DeadLetterNews.Count != 15 || len(s.DeadLetterNews.Sample) != counts.MaxNewsSample {
		t.Fatalf("within the window: %+v announced, held %+v; want 15 held, %d named", got, s.DeadLetterNews, counts.MaxNewsSample)
	}
	if s.NewsDue(t0.Add(59*time.Second), time.Minute) {
		t.Fatal("due before the window ended")
	}
	if !s.NewsDue(t0.Add(time.Minute), time.Minute) {
		t.Fatal("not due when the window ended")
	}
	got := s.TakeDeadLetterNews(nil, t0.Add(time.Minute), time.Minute)
	if got == nil || got.Count != 15 || got.FirstSeq != 20 || got.Reasons[records.ReasonExhausted] != 15 {
		t.Fatalf("at the end of the window: %+v, want the 15 held, from sequence 20", got)
	}
	if s.DeadLetterNews != nil || s.TakeDeadLetterNews(nil, t0.Add(3*time.Minute), time.Minute) != nil {
		t.Fatal("announced twice")
	}
	ev := deadLetterEvent("ns", "crm", got, t0, time.Minute)
	if ev.Type != records.OpsDeliveryDeadLettered || ev.Data["count"] != int64(15) || ev.Data["deliveryId"] != "whdl_a" || ev.ID != deadLetterEvent("ns", "crm", got, t0.Add(time.Hour), time.Minute).ID {
		t.Fatalf("event %+v: want its id from the first dead letter's sequence only", ev)
	}
}

// A transition's event is queued by the same compare-and-set, survives a re-enable, and
// leaves the outbox once published.
func TestOutboxKeepsEventsUntilPublished(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var s State
	ev, ok := transitionEvent("ns", "crm", Transition{Type: "Disabled", Message: "m", Data: map[string]any{"windowHours": 72.0}}, now)
	if !ok || ev.Type != records.OpsEndpointDisabled || ev.Data["message"] != "m" || ev.Data["windowHours"] != 72.0 || ev.Namespace != "ns" || ev.Endpoint != "crm" {
		t.Fatalf("event %+v", ev)
	}
	s.queue(ev)
	s.DisabledSince = now
	s.Enable(now.Add(time.Second))
	if len(s.Outbox) != 1 {
		t.Fatalf("re-enabling dropped the outbox: %+v", s.Outbox)
	}
	s.Published(map[string]bool{ev.ID: true})
	if s.Outbox != nil {
		t.Fatalf("outbox %+v after publishing", s.Outbox)
	}
	for i := range maxOutbox + 3 {
		e, _ := transitionEvent("ns", "crm", Transition{Type: "CircuitOpened"}, now.Add(time.Duration(i)))
		s.queue(e)
	}
	if len(s.Outbox) != maxOutbox {
		t.Fatalf("outbox holds %d events, want at most %d", len(s.Outbox), maxOutbox)
	}
	// Large events (dead-letter news naming ten dead letters with long ids) are bounded by
	// size, so the state always fits the bucket's values.
	big := &counts.DeadLetterNews{}
	for i := range counts.MaxNewsSample {
		big.Add(uint64(i+1), records.Outcome{DeliveryID: "whdl_x", EventID: strings.Repeat("e", records.MaxEventIDLength), EventType: strings.Repeat("t", 256),
			DeadLetterReason: records.ReasonExhausted, Time: now})
	}
	for i := range 20 {
		s.queue(deadLetterEvent("ns", "crm", big, now.Add(time.Duration(i)), time.Minute))
	}
	if b, _ := json.Marshal(&s); len(b) > 2*maxOutboxBytes || len(s.Outbox) == 0 {
		t.Fatalf("the state is %d bytes with %d events waiting, want at most about %d", len(b), len(s.Outbox), maxOutboxBytes)
	}
}
