package counts

import (
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

func logRecord(ep, state string, attempt int, dlReason string, at time.Time) records.Outcome {
	return typedLogRecord(ep, "order.created", state, attempt, dlReason, at)
}

func typedLogRecord(ep, eventType, state string, attempt int, dlReason string, at time.Time) records.Outcome {
	r := records.LogRecord{DeliveryID: "whdl_x", EventID: "evt_x", EventType: eventType, Endpoint: ep, State: state, Attempt: attempt, Time: at, DeadLetterReason: dlReason,
		Response: records.Response{StatusCode: 500, Error: "boom"}}
	os := records.ReadOutcomes(records.LogMessage("whk.log.ns."+ep, &r, nil).Header)
	if len(os) != 1 {
		panic("no outcome header")
	}
	return os[0]
}

// A dead letter of an operational event is counted but not announced: an endpoint failing to
// deliver operational events makes no more of them (the loop guard).
func TestFoldDoesNotAnnounceDeadLettersOfOperationalEvents(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	p := Pending{}
	serves := func(string, uint64) bool { return true }
	p.AddIf(1, typedLogRecord("alerts", records.OpsCircuitOpened, records.StateDeadLetter, 1, records.ReasonExhausted, t0), serves)
	p.AddIf(2, typedLogRecord("alerts", records.OpsDeliveryDeadLettered, records.StateDeadLetter, 1, records.ReasonExhausted, t0), serves)
	if d := p["alerts"]; d.DeadLettered != 2 || d.News != nil {
		t.Fatalf("delta %+v news %+v: want 2 dead letters counted and none announced", d, d.News)
	}
}

func TestFoldCountsEachOutcome(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	serves := func(ep string, _ uint64) bool { return ep != "other" }
	p := Pending{}
	p.AddIf(10, logRecord("a", records.StateSucceeded, 1, "", t0), serves)
	p.AddIf(11, logRecord("a", records.StateFailed, 1, "", t0.Add(time.Second)), serves)
	p.AddIf(12, logRecord("a", records.StateDeadLetter, 2, records.ReasonExhausted, t0.Add(2*time.Second)), serves)
	p.AddIf(13, logRecord("a", records.StateDeadLetter, 0, records.ReasonEndpointDisabled, t0.Add(3*time.Second)), serves)
	p.AddIf(14, logRecord("other", records.StateSucceeded, 1, "", t0), serves)
	p.AddIf(16, logRecord("b", records.StateSucceeded, 3, "", t0.Add(time.Minute)), serves)
	a := p["a"]
	want := Delta{Attempts: 3, Failures: 2, Completed: 2, Failed: 1, Delivered: 1, DeadLettered: 2, From: 10, Through: 13}
	got := *a
	got.LastSuccess, got.LastFailure, got.News = time.Time{}, nil, nil
	if got != want {
		t.Errorf("delta of a = %+v, want %+v", got, want)
	}
	if n := a.News; n == nil || n.Count != 2 || n.FirstSeq != 12 || n.Reasons[records.ReasonExhausted] != 1 || n.Reasons[records.ReasonEndpointDisabled] != 1 || len(n.Sample) != 2 {
		t.Errorf("dead-letter news of a = %+v, want both dead letters from sequence 12", n)
	}
	if !a.LastSuccess.Equal(t0) || a.LastFailure == nil || !a.LastFailure.Time.Equal(t0.Add(2*time.Second)) || a.LastFailure.StatusCode != 500 {
		t.Errorf("last success %v, last failure %+v", a.LastSuccess, a.LastFailure)
	}
	if !a.FailedDeliveries() {
		t.Error("an exhausted dead letter is a failed delivery")
	}
	if _, ok := p["other"]; ok {
		t.Error("an endpoint this dispatcher does not serve was counted")
	}
	if b := p["b"]; b.Delivered != 1 || b.From != 16 || b.FailedDeliveries() {
		t.Errorf("delta of b = %+v", b)
	}
}
