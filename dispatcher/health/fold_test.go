package health

import (
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

func record(ep, state string, attempt int, dlReason string, at time.Time) []byte {
	r := records.LogRecord{DeliveryID: "whdl_x", Endpoint: ep, State: state, Attempt: attempt, Time: at, DeadLetterReason: dlReason,
		Response: records.Response{StatusCode: 500, Error: "boom"}}
	return r.AppendJSON(nil)
}

func TestFoldCountsEachOutcome(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	serves := func(ep string) bool { return ep != "other" }
	p := Pending{}
	p.Add(10, record("a", records.StateSucceeded, 1, "", t0), serves)
	p.Add(11, record("a", records.StateFailed, 1, "", t0.Add(time.Second)), serves)
	p.Add(12, record("a", records.StateDeadLetter, 2, records.ReasonExhausted, t0.Add(2*time.Second)), serves)
	p.Add(13, record("a", records.StateDeadLetter, 0, records.ReasonEndpointDisabled, t0.Add(3*time.Second)), serves)
	p.Add(14, record("other", records.StateSucceeded, 1, "", t0), serves)
	p.Add(15, []byte("not json"), serves)
	p.Add(16, record("b", records.StateSucceeded, 3, "", t0.Add(time.Minute)), serves)
	a := p["a"]
	want := Delta{Attempts: 3, Failures: 2, Completed: 2, Failed: 1, Delivered: 1, DeadLettered: 2, From: 10, Through: 13}
	got := *a
	got.LastSuccess, got.LastFailure = time.Time{}, nil
	if got != want {
		t.Errorf("delta of a = %+v, want %+v", got, want)
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
