// Package state keeps each endpoint's shared state in the namespace's key-value bucket: its
// circuit, failure streak and disable (State, and the transitions that change them), its
// counts as folded from the delivery log, and the outbox of the operational events its
// changes made. Every replica changes it by compare-and-set (Store.Change), which returns what
// the change caused; carrying that out is the caller's (health.Health).
package state

import (
	"fmt"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/counts"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// State is one endpoint's health and circuit state, shared by every dispatcher replica
// through the key-value bucket and changed only by compare-and-set.
type State struct {
	// Consecutive failed attempts since the last success, retries included.
	Consecutive int `json:"consecutive,omitempty"`

	Circuit           v1alpha1.CircuitState `json:"circuit,omitempty"`
	OpenedAt          time.Time             `json:"openedAt,omitzero"`
	ProbeOwner        string                `json:"probeOwner,omitempty"`
	ProbeAt           time.Time             `json:"probeAt,omitzero"`
	HalfOpenSuccesses int                   `json:"halfOpenSuccesses,omitempty"`
	ClosedAt          time.Time             `json:"closedAt,omitzero"`

	DisabledSince  time.Time `json:"disabledSince,omitzero"`
	DisabledReason string    `json:"disabledReason,omitempty"`
	DisabledBy     string    `json:"disabledBy,omitempty"` // ConsecutiveFailures or FailureRate
	EnabledAt      time.Time `json:"enabledAt,omitzero"`

	// Buckets count attempts and completed deliveries over the health window.
	Buckets []bucket `json:"buckets,omitempty"`

	LastSuccess  time.Time       `json:"lastSuccess,omitzero"`
	LastFailure  *counts.Failure `json:"lastFailure,omitempty"`
	Delivered    int64           `json:"delivered,omitempty"`
	DeadLettered int64           `json:"deadLettered,omitempty"`
	// Folded is the delivery-log sequence the counts above (and the buckets) include: they
	// are a fold of the log (counts.Folder), never counted in memory only.
	Folded uint64 `json:"folded,omitempty"`
	// Filtered counts the events the endpoint's filter rejected. They leave no record in the
	// delivery log, so this is not a fold: each replica tallies those its workers filtered
	// (counts.FilterTally) and adds them here about every second.
	Filtered int64 `json:"filtered,omitempty"`

	// Outbox holds the operational events of this state's changes until they are published
	// (report.Announcer): written by the same compare-and-set as the change, so a crash between the
	// two loses nothing, and removed once stored.
	Outbox []records.OpsEvent `json:"outbox,omitempty"`
	// DeadLetterNews are dead letters not announced yet; NewsAt is when the last
	// delivery.dead_lettered event was queued (one per DeadLetterNewsWindow at most).
	DeadLetterNews *counts.DeadLetterNews `json:"deadLetterNews,omitempty"`
	NewsAt         time.Time              `json:"newsAt,omitzero"`
}

// bucket counts one slice of the window.
type bucket struct {
	Start    int64 `json:"s"` // unix nanoseconds
	Attempts int64 `json:"a,omitempty"`
	Failures int64 `json:"f,omitempty"`
	// Completed deliveries (succeeded or dead-lettered) and the failed ones among them.
	Completed int64 `json:"c,omitempty"`
	Failed    int64 `json:"x,omitempty"`
}

// Transition is a change worth an Event, an immediate status write and an operational event.
type Transition struct {
	Type    string // CircuitOpened, CircuitHalfOpen, CircuitClosed, Disabled, Enabled
	Message string
	// Data are the operational event's fields besides the message.
	Data map[string]any
}

// healthWindow is the window of an endpoint's health: the auto-disable window, else 24h.
func Window(p policy.Policy) time.Duration {
	if p.AutoDisable.FailureRatePercent > 0 && p.AutoDisable.Window > 0 {
		return p.AutoDisable.Window
	}
	return 24 * time.Hour
}

// bucketSize splits the window in 72 slices (an hour each for 72h), at least 100ms.
func bucketSize(window time.Duration) time.Duration {
	return max(window/72, 100*time.Millisecond)
}

// CircuitState is the circuit's state, Closed when never set.
func (s *State) CircuitState() v1alpha1.CircuitState {
	if s.Circuit == "" {
		return v1alpha1.CircuitClosed
	}
	return s.Circuit
}

// disabled reports whether the endpoint is disabled and not re-enabled since.
func (s *State) Disabled() bool { return !s.DisabledSince.IsZero() }

// ApplyFold adds a fold's delta to the counts, dropping slices older than the window, and
// records the log sequence the counts now include.
func (s *State) ApplyFold(d *counts.Delta, now time.Time, window time.Duration) {
	size := bucketSize(window)
	start := now.Truncate(size).UnixNano()
	cutoff := now.Add(-window).UnixNano()
	kept := s.Buckets[:0]
	for _, b := range s.Buckets {
		if b.Start+int64(size) > cutoff {
			kept = append(kept, b)
		}
	}
	s.Buckets = kept
	if d.Attempts != 0 || d.Completed != 0 {
		if n := len(s.Buckets); n > 0 && s.Buckets[n-1].Start == start {
			b := &s.Buckets[n-1]
			b.Attempts += d.Attempts
			b.Failures += d.Failures
			b.Completed += d.Completed
			b.Failed += d.Failed
		} else {
			s.Buckets = append(s.Buckets, bucket{Start: start, Attempts: d.Attempts, Failures: d.Failures, Completed: d.Completed, Failed: d.Failed})
		}
	}
	s.Delivered += d.Delivered
	s.DeadLettered += d.DeadLettered
	if d.LastSuccess.After(s.LastSuccess) {
		s.LastSuccess = d.LastSuccess
	}
	if d.LastFailure != nil && (s.LastFailure == nil || d.LastFailure.Time.After(s.LastFailure.Time)) {
		s.LastFailure = d.LastFailure
	}
	s.Folded = max(s.Folded, d.Through)
}

// totals sums the window.
func (s *State) Totals(now time.Time, window time.Duration) (attempts, failures, completed, failed int64) {
	cutoff := now.Add(-window).UnixNano()
	size := int64(bucketSize(window))
	for _, b := range s.Buckets {
		if b.Start+size <= cutoff {
			continue
		}
		attempts += b.Attempts
		failures += b.Failures
		completed += b.Completed
		failed += b.Failed
	}
	return
}

// onSuccess records a successful attempt: the failure streak ends and a half-open circuit
// counts a successful probe, closing after the policy's successes.
func (s *State) OnSuccess(p policy.Policy, now time.Time) []Transition {
	s.Consecutive = 0
	if s.CircuitState() == v1alpha1.CircuitHalfOpen {
		s.HalfOpenSuccesses++
		if s.HalfOpenSuccesses >= max(1, p.Circuit.SuccessesToClose) {
			s.Circuit, s.ClosedAt, s.ProbeOwner, s.HalfOpenSuccesses = v1alpha1.CircuitClosed, now, "", 0
			return []Transition{{"CircuitClosed", fmt.Sprintf("circuit closed after %d successful probe(s); ramping up over %s", max(1, p.Circuit.SuccessesToClose), p.Circuit.RampUp),
				map[string]any{"successfulProbes": max(1, p.Circuit.SuccessesToClose), "rampUp": p.Circuit.RampUp.String()}}}
		}
	}
	return nil
}

// onFailure records a failed attempt: the streak grows, the circuit opens at the policy's
// threshold (or re-opens on a failed probe), and the endpoint is disabled at the policy's
// consecutive-failure trigger.
func (s *State) OnFailure(p policy.Policy, now time.Time) []Transition {
	var out []Transition
	s.Consecutive++
	switch s.CircuitState() {
	case v1alpha1.CircuitHalfOpen:
		s.Circuit, s.OpenedAt, s.ProbeOwner, s.HalfOpenSuccesses = v1alpha1.CircuitOpen, now, "", 0
		out = append(out, Transition{"CircuitOpened", fmt.Sprintf("half-open probe failed; circuit open again for %s", p.Circuit.OpenDuration),
			map[string]any{"probeFailed": true, "consecutiveFailures": s.Consecutive, "openFor": p.Circuit.OpenDuration.String()}})
	case v1alpha1.CircuitClosed:
		if t := p.Circuit.Threshold; t > 0 && s.Consecutive >= t {
			s.Circuit, s.OpenedAt = v1alpha1.CircuitOpen, now
			out = append(out, Transition{"CircuitOpened", fmt.Sprintf("circuit opened after %d consecutive failed attempts; deliveries are parked for %s, then one probe", s.Consecutive, p.Circuit.OpenDuration),
				map[string]any{"probeFailed": false, "consecutiveFailures": s.Consecutive, "openFor": p.Circuit.OpenDuration.String()}})
		}
	}
	if t := p.AutoDisable.ConsecutiveFailures; t > 0 && !s.Disabled() && s.Consecutive >= t {
		s.DisabledSince, s.DisabledBy = now, v1alpha1.ReasonConsecutiveFailures
		s.DisabledReason = fmt.Sprintf("%d consecutive failed attempts (the policy disables at %d)", s.Consecutive, t)
		out = append(out, Transition{"Disabled", "endpoint auto-disabled: " + s.DisabledReason + "; new deliveries are dead-lettered with reason endpoint_disabled until it is re-enabled (kubectl webhooks enable)",
			map[string]any{"reason": "consecutive_failures", "consecutiveFailures": s.Consecutive, "threshold": t}})
	}
	return out
}

// onDeadLetter evaluates the failure-rate trigger, as seed 002 does whenever a delivery is
// dead-lettered: at least MinAttempts completed deliveries in the window, and at least
// FailureRatePercent of them failed.
func (s *State) OnDeadLetter(p policy.Policy, now time.Time) []Transition {
	ad := p.AutoDisable
	if ad.FailureRatePercent <= 0 || s.Disabled() {
		return nil
	}
	_, _, completed, failed := s.Totals(now, Window(p))
	if completed < int64(max(1, ad.MinAttempts)) || failed*100 < int64(ad.FailureRatePercent)*completed {
		return nil
	}
	s.DisabledSince, s.DisabledBy = now, v1alpha1.ReasonFailureRate
	s.DisabledReason = fmt.Sprintf("%d of %d deliveries in the last %s failed (%.1f%%, the policy disables at >= %d%% with at least %d)",
		failed, completed, ad.Window, float64(failed)*100/float64(completed), ad.FailureRatePercent, ad.MinAttempts)
	// The fields of seed 002's webhook_endpoint.disabled event.
	return []Transition{{"Disabled", "endpoint auto-disabled: " + s.DisabledReason + "; new deliveries are dead-lettered with reason endpoint_disabled until it is re-enabled (kubectl webhooks enable)",
		map[string]any{"reason": "failure_rate", "windowHours": ad.Window.Hours(), "total": completed, "failures": failed,
			"failureRatePercent": ad.FailureRatePercent, "minAttempts": ad.MinAttempts}}}
}

// enable re-enables the endpoint for an annotation set at `at`, resetting counters and
// closing the circuit.
func (s *State) Enable(at time.Time) []Transition {
	if !s.Disabled() || !at.After(s.DisabledSince) {
		return nil
	}
	disabledSince := s.DisabledSince
	*s = State{EnabledAt: at, Circuit: v1alpha1.CircuitClosed, LastSuccess: s.LastSuccess, LastFailure: s.LastFailure,
		Delivered: s.Delivered, DeadLettered: s.DeadLettered, Folded: s.Folded,
		Outbox: s.Outbox, DeadLetterNews: s.DeadLetterNews, NewsAt: s.NewsAt}
	return []Transition{{"Enabled", "endpoint re-enabled: counters reset and circuit closed", map[string]any{"disabledSince": disabledSince.UTC()}}}
}

// tryHalfOpen moves an open circuit whose open duration has passed to half-open with owner as
// the one replica that probes; it also takes over a probe whose owner went quiet.
func (s *State) TryHalfOpen(p policy.Policy, owner string, now time.Time, probeTimeout time.Duration) []Transition {
	switch s.CircuitState() {
	case v1alpha1.CircuitOpen:
		if now.Before(s.OpenedAt.Add(p.Circuit.OpenDuration)) {
			return nil
		}
		s.Circuit, s.ProbeOwner, s.ProbeAt, s.HalfOpenSuccesses = v1alpha1.CircuitHalfOpen, owner, now, 0
		return []Transition{{"CircuitHalfOpen", "circuit half-open: one probe delivery", map[string]any{"openedAt": s.OpenedAt.UTC()}}}
	case v1alpha1.CircuitHalfOpen:
		if s.ProbeOwner != owner && now.After(s.ProbeAt.Add(probeTimeout)) {
			s.ProbeOwner, s.ProbeAt = owner, now
		}
	}
	return nil
}

// rampFactor is the share (0..1] of full speed allowed after the circuit closed: it grows
// over the ramp-up period, so a recovering receiver is not hit by the whole backlog at once.
func RampFactor(s *State, p policy.Policy, now time.Time) float64 {
	if s.ClosedAt.IsZero() || p.Circuit.RampUp <= 0 {
		return 1
	}
	el := now.Sub(s.ClosedAt)
	if el >= p.Circuit.RampUp || el < 0 {
		return 1
	}
	return max(0.05, float64(el)/float64(p.Circuit.RampUp))
}
