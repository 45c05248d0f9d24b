package state

import (
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/counts"
	"github.com/webhook-operator/webhook-operator/internal/policy"
)

func TestFailureRateTrigger(t *testing.T) {
	p := policy.Default() // >= 95% over 72h with at least 20
	now := time.Date(2026, 7, 19, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name              string
		completed, failed int64
		disable           bool
	}{
		{"19 dead letters are never enough", 19, 19, false},
		{"20 of 20 failed", 20, 20, true},
		{"19 of 20 failed is exactly 95%", 20, 19, true},
		{"18 of 20 failed is 90%", 20, 18, false},
		{"95 of 100", 100, 95, true},
		{"94 of 100", 100, 94, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s State
			s.ApplyFold(&counts.Delta{Completed: tc.completed, Failed: tc.failed}, now, 72*time.Hour)
			tr := s.OnDeadLetter(p, now)
			if got := s.Disabled(); got != tc.disable || (len(tr) == 1) != tc.disable {
				t.Fatalf("disabled=%v transitions=%v, want %v", got, tr, tc.disable)
			}
			if tc.disable && s.DisabledBy != v1alpha1.ReasonFailureRate {
				t.Errorf("DisabledBy = %q", s.DisabledBy)
			}
		})
	}
}

// Deliveries older than the window no longer count.
func TestWindowForgetsOldDeliveries(t *testing.T) {
	p := policy.Default()
	start := time.Date(2026, 7, 19, 12, 0, 0, 0, time.UTC)
	var s State
	s.ApplyFold(&counts.Delta{Completed: 30, Failed: 30}, start, 72*time.Hour)
	later := start.Add(73 * time.Hour)
	s.ApplyFold(&counts.Delta{Completed: 1, Failed: 1}, later, 72*time.Hour)
	if _, _, c, _ := s.Totals(later, 72*time.Hour); c != 1 {
		t.Fatalf("window holds %d completed deliveries, want 1", c)
	}
	if s.OnDeadLetter(p, later); s.Disabled() {
		t.Fatal("disabled by deliveries older than the window")
	}
}

func TestConsecutiveFailuresOpenTheCircuitAndDisable(t *testing.T) {
	p := policy.Default()
	p.Circuit.Threshold = 3
	p.AutoDisable.ConsecutiveFailures = 10
	now := time.Now()
	var s State
	for i := 1; i <= 10; i++ {
		s.OnFailure(p, now)
		if open := s.CircuitState() != v1alpha1.CircuitClosed; open != (i >= 3) {
			t.Fatalf("after %d failures circuit=%s", i, s.CircuitState())
		}
		if s.Disabled() != (i == 10) {
			t.Fatalf("after %d failures disabled=%v", i, s.Disabled())
		}
	}
	// A success in between resets the streak.
	var r State
	for range 9 {
		r.OnFailure(p, now)
	}
	r.OnSuccess(p, now)
	r.OnFailure(p, now)
	if r.Disabled() || r.Consecutive != 1 {
		t.Fatalf("streak not reset by a success: %+v", r)
	}
}

func TestHalfOpenProbeAndClose(t *testing.T) {
	p := policy.Default()
	p.Circuit = policy.Circuit{Threshold: 1, OpenDuration: time.Second, SuccessesToClose: 2, RampUp: 10 * time.Second}
	t0 := time.Now()
	var s State
	s.OnFailure(p, t0)
	if s.TryHalfOpen(p, "a", t0.Add(500*time.Millisecond), time.Minute); s.CircuitState() != v1alpha1.CircuitOpen {
		t.Fatal("half-open before openDuration")
	}
	s.TryHalfOpen(p, "a", t0.Add(time.Second), time.Minute)
	s.TryHalfOpen(p, "b", t0.Add(time.Second), time.Minute)
	if s.CircuitState() != v1alpha1.CircuitHalfOpen || s.ProbeOwner != "a" {
		t.Fatalf("want half-open owned by a, got %s %q", s.CircuitState(), s.ProbeOwner)
	}
	s.OnSuccess(p, t0.Add(2*time.Second))
	if s.CircuitState() != v1alpha1.CircuitHalfOpen {
		t.Fatal("closed after one success; the policy wants two")
	}
	s.OnSuccess(p, t0.Add(3*time.Second))
	if s.CircuitState() != v1alpha1.CircuitClosed {
		t.Fatal("not closed after two successes")
	}
	if f := RampFactor(&s, p, t0.Add(4*time.Second)); f >= 0.2 {
		t.Errorf("ramp factor 1s after closing = %.2f, want a trickle", f)
	}
	if f := RampFactor(&s, p, t0.Add(20*time.Second)); f != 1 {
		t.Errorf("ramp factor after the ramp = %.2f", f)
	}
	// A failed probe re-opens.
	var r State
	r.OnFailure(p, t0)
	r.TryHalfOpen(p, "a", t0.Add(2*time.Second), time.Minute)
	r.OnFailure(p, t0.Add(2*time.Second))
	if r.CircuitState() != v1alpha1.CircuitOpen || !r.OpenedAt.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("failed probe did not re-open: %+v", r)
	}
}

func TestEnableResetsCountersAndClosesTheCircuit(t *testing.T) {
	p := policy.Default()
	p.AutoDisable.ConsecutiveFailures = 2
	t0 := time.Now()
	var s State
	s.OnFailure(p, t0)
	s.OnFailure(p, t0)
	if !s.Disabled() {
		t.Fatal("not disabled")
	}
	if tr := s.Enable(t0.Add(-time.Second)); tr != nil || !s.Disabled() {
		t.Fatal("an annotation older than the disabling re-enabled the endpoint")
	}
	if tr := s.Enable(t0.Add(time.Second)); len(tr) != 1 || s.Disabled() || s.Consecutive != 0 || s.CircuitState() != v1alpha1.CircuitClosed {
		t.Fatalf("enable: %+v", s)
	}
}
