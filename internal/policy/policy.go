// Package policy turns a RetryPolicy (or its absence) into the numbers the dispatcher acts on:
// when to retry, when to give up, when to open the circuit and when to disable an endpoint.
package policy

import (
	"fmt"
	"math"
	"strings"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// DefaultName is how the built-in default shows in status.
const DefaultName = "(default)"

// Policy is an effective retry policy.
type Policy struct {
	// MaxAttempts counts every attempt, the first included.
	MaxAttempts int
	// Schedule, when set, is the wait before each attempt (Schedule[0] is the first, 0s).
	Schedule []time.Duration
	// Backoff, used without Schedule.
	Strategy v1alpha1.BackoffStrategy
	Initial  time.Duration
	Factor   float64
	Max      time.Duration
	Jitter   v1alpha1.JitterMode
	// JitterPercent is the most Additive jitter adds, in percent of the bound.
	JitterPercent int

	// MaxRetryDuration, when positive, ends retries in time: no attempt starts later than
	// this after the delivery was created.
	MaxRetryDuration time.Duration

	// RetryAfter: honour a Retry-After header on 429/503, up to RetryAfterMax.
	HonorRetryAfter bool
	RetryAfterMax   time.Duration

	Circuit     Circuit
	AutoDisable AutoDisable
}

// Circuit configures the circuit breaker; Threshold 0 disables it.
type Circuit struct {
	Threshold        int
	OpenDuration     time.Duration
	SuccessesToClose int
	RampUp           time.Duration
}

// AutoDisable configures auto-disable; a zero trigger is off.
type AutoDisable struct {
	ConsecutiveFailures int
	FailureRatePercent  int
	Window              time.Duration
	MinAttempts         int
}

// DefaultSchedule is seed 002's schedule: 7 attempts at 0s, 30s, 5m, 30m, 2h, 12h, 24h.
var DefaultSchedule = []time.Duration{0, 30 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 12 * time.Hour, 24 * time.Hour}

// DefaultCircuit is the circuit breaker of the built-in policy and of a RetryPolicy's defaults.
var DefaultCircuit = Circuit{Threshold: 5, OpenDuration: 30 * time.Second, SuccessesToClose: 1, RampUp: 30 * time.Second}

// Default is the built-in policy of an endpoint without retryPolicyRef.
func Default() Policy {
	return Policy{
		MaxAttempts:     len(DefaultSchedule),
		Schedule:        append([]time.Duration(nil), DefaultSchedule...),
		HonorRetryAfter: true,
		RetryAfterMax:   time.Hour,
		Circuit:         DefaultCircuit,
		AutoDisable:     AutoDisable{FailureRatePercent: 95, Window: 72 * time.Hour, MinAttempts: 20},
	}
}

// defaultBackoff is seed 000's: 2s, factor 2, up to 1h, full jitter, 7 attempts.
func defaultBackoff() Policy {
	return Policy{
		MaxAttempts: 7, Strategy: v1alpha1.BackoffExponential, Initial: 2 * time.Second, Factor: 2,
		Max: time.Hour, Jitter: v1alpha1.JitterFull,
		HonorRetryAfter: true, RetryAfterMax: time.Hour, Circuit: DefaultCircuit,
	}
}

// FromSpec resolves a RetryPolicy's spec; the API server has validated it, but FromSpec
// checks again so a hand-made object can never make the dispatcher misbehave.
func FromSpec(spec *v1alpha1.RetryPolicySpec) (Policy, error) {
	if spec == nil {
		return Default(), nil
	}
	p := defaultBackoff()
	if len(spec.Schedule) > 0 && spec.Backoff != nil {
		return Policy{}, fmt.Errorf("set either schedule or backoff, not both")
	}
	if len(spec.Schedule) > 0 {
		p.Schedule = make([]time.Duration, len(spec.Schedule))
		for i, d := range spec.Schedule {
			if d.Duration < 0 {
				return Policy{}, fmt.Errorf("schedule[%d] is negative", i)
			}
			p.Schedule[i] = d.Duration
		}
		p.MaxAttempts = len(p.Schedule)
	}
	if b := spec.Backoff; b != nil {
		if b.Strategy != "" {
			p.Strategy = b.Strategy
		}
		if b.InitialInterval != nil && b.InitialInterval.Duration > 0 {
			p.Initial = b.InitialInterval.Duration
		}
		if b.Factor != "" {
			f, err := b.Factor.Float64()
			if err != nil || f < 1 || f > 10 {
				return Policy{}, fmt.Errorf("factor %q must be a number from 1 to 10", b.Factor)
			}
			p.Factor = f
		}
		if b.MaxInterval != nil && b.MaxInterval.Duration > 0 {
			p.Max = b.MaxInterval.Duration
		}
		if b.Jitter != "" {
			p.Jitter = b.Jitter
		}
		if p.Jitter == v1alpha1.JitterAdditive {
			p.JitterPercent = v1alpha1.DefaultJitterPercent
		}
		if b.JitterPercent != nil {
			pct := int(*b.JitterPercent)
			if p.Jitter != v1alpha1.JitterAdditive || pct < 1 || pct > 100 {
				return Policy{}, fmt.Errorf("jitterPercent %d needs jitter: Additive and must be within 1..100", pct)
			}
			p.JitterPercent = pct
		}
		if p.Max < p.Initial {
			return Policy{}, fmt.Errorf("maxInterval %s is below initialInterval %s", p.Max, p.Initial)
		}
	}
	if spec.MaxAttempts != nil {
		n := int(*spec.MaxAttempts)
		if n < 1 || n > 100 {
			return Policy{}, fmt.Errorf("maxAttempts %d is not within 1..100", n)
		}
		if p.Schedule != nil && n > len(p.Schedule) {
			return Policy{}, fmt.Errorf("maxAttempts %d exceeds the schedule's %d waits", n, len(p.Schedule))
		}
		p.MaxAttempts = n
	}
	if d := spec.MaxRetryDuration; d != nil {
		if d.Duration <= 0 {
			return Policy{}, fmt.Errorf("maxRetryDuration %s must be positive", d.Duration)
		}
		p.MaxRetryDuration = d.Duration
	}
	if ra := spec.RetryAfter; ra != nil {
		p.HonorRetryAfter = ra.Honor
		if ra.MaxDelay != nil {
			p.RetryAfterMax = ra.MaxDelay.Duration
		}
	}
	if cb := spec.CircuitBreaker; cb != nil {
		p.Circuit = Circuit{Threshold: int(cb.ConsecutiveFailures), OpenDuration: DefaultCircuit.OpenDuration,
			SuccessesToClose: int(cb.SuccessesToClose), RampUp: DefaultCircuit.RampUp}
		if cb.OpenDuration != nil {
			p.Circuit.OpenDuration = cb.OpenDuration.Duration
		}
		if cb.RampUp != nil {
			p.Circuit.RampUp = cb.RampUp.Duration
		}
		if p.Circuit.OpenDuration <= 0 {
			p.Circuit.OpenDuration = DefaultCircuit.OpenDuration
		}
		if p.Circuit.SuccessesToClose < 1 {
			p.Circuit.SuccessesToClose = 1
		}
	}
	if ad := spec.AutoDisable; ad != nil {
		if ad.ConsecutiveFailures != nil {
			p.AutoDisable.ConsecutiveFailures = int(*ad.ConsecutiveFailures)
		}
		if ad.FailureRatePercent != nil {
			if ad.Window == nil || ad.MinAttempts == nil {
				return Policy{}, fmt.Errorf("autoDisable.failureRatePercent needs window and minAttempts")
			}
			p.AutoDisable.FailureRatePercent = int(*ad.FailureRatePercent)
			p.AutoDisable.Window = ad.Window.Duration
			p.AutoDisable.MinAttempts = int(*ad.MinAttempts)
		}
	}
	return p, nil
}

// Bounds returns the range of the wait before attempt n (1-based; attempt 1 is immediate): the
// backoff's bound capped at Max, then the jitter's range around it (Additive adds to the
// capped bound, so its waits reach Max plus JitterPercent).
func (p Policy) Bounds(n int) (lo, hi time.Duration) {
	if n <= 1 {
		return 0, 0
	}
	if p.Schedule != nil {
		i := min(n-1, len(p.Schedule)-1)
		return p.Schedule[i], p.Schedule[i]
	}
	k := float64(n - 1) // retry number
	var bound float64
	switch p.Strategy {
	case v1alpha1.BackoffLinear:
		bound = float64(p.Initial) * k
	default:
		bound = float64(p.Initial) * math.Pow(p.Factor, k-1)
	}
	if bound >= float64(p.Max) || math.IsInf(bound, 0) || math.IsNaN(bound) {
		hi = p.Max // not through float64, which rounds a Max near the int64 limit past it
	} else {
		hi = time.Duration(bound)
	}
	switch p.Jitter {
	case v1alpha1.JitterFull:
		return 0, hi
	case v1alpha1.JitterEqual:
		return hi / 2, hi
	case v1alpha1.JitterAdditive:
		top := float64(hi) * (1 + float64(p.JitterPercent)/100)
		if top >= math.MaxInt64 { // only a hand-made maxInterval of centuries gets here
			return hi, time.Duration(math.MaxInt64)
		}
		return hi, time.Duration(top)
	default:
		return hi, hi
	}
}

// Wait returns the wait before attempt n, drawing jitter from rnd (uniform in [0,1)).
func (p Policy) Wait(n int, rnd func() float64) time.Duration {
	lo, hi := p.Bounds(n)
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rnd()*float64(hi-lo))
}

// Next decides what follows failed attempt n: the wait before attempt n+1, or false when the
// attempts are exhausted. A Retry-After (from a 429 or 503) replaces the computed wait when the
// policy honours it, cut to RetryAfterMax.
func (p Policy) Next(n int, retryAfter time.Duration, rnd func() float64) (time.Duration, bool) {
	if n >= p.MaxAttempts {
		return 0, false
	}
	if retryAfter > 0 && p.HonorRetryAfter {
		return min(retryAfter, p.RetryAfterMax), true
	}
	return p.Wait(n+1, rnd), true
}

// Verdict is what follows a failed attempt.
type Verdict int

const (
	// Retry: attempt again after the wait.
	Retry Verdict = iota
	// Exhausted: the policy's attempts are used up.
	Exhausted
	// RetryDurationExceeded: the next attempt would start later than MaxRetryDuration after
	// the delivery was created.
	RetryDurationExceeded
)

// After decides what follows failed attempt n of a delivery created at created, the attempt
// having failed at now: Next's wait and Retry, or why there is no next attempt. A zero
// created (a delivery written before deliveries carried it) is never too old.
func (p Policy) After(n int, retryAfter time.Duration, created, now time.Time, rnd func() float64) (time.Duration, Verdict) {
	wait, ok := p.Next(n, retryAfter, rnd)
	switch {
	case !ok:
		return 0, Exhausted
	case p.MaxRetryDuration > 0 && !created.IsZero() && now.Add(wait).After(created.Add(p.MaxRetryDuration)):
		return 0, RetryDurationExceeded
	default:
		return wait, Retry
	}
}

// Summary lists the waits before each attempt, e.g. "0s, 30s, 5m, 30m, 2h, 12h, 24h",
// "0s, ≤2s, ≤4s, ≤8s" or "0s, 2s-2.2s, 4s-4.4s", then the time limit if there is one
// ("…, within 24h").
func (p Policy) Summary() string {
	parts := make([]string, 0, p.MaxAttempts)
	for n := 1; n <= p.MaxAttempts; n++ {
		lo, hi := p.Bounds(n)
		switch {
		case lo == hi:
			parts = append(parts, short(hi))
		case lo == 0:
			parts = append(parts, "≤"+short(hi))
		default:
			parts = append(parts, short(lo)+"-"+short(hi))
		}
		if n == 8 && p.MaxAttempts > 9 {
			parts = append(parts, fmt.Sprintf("… (%d attempts)", p.MaxAttempts))
			break
		}
	}
	if p.MaxRetryDuration > 0 {
		parts = append(parts, "within "+short(p.MaxRetryDuration))
	}
	return strings.Join(parts, ", ")
}

// short prints 30m0s as 30m and 2h0m0s as 2h.
func short(d time.Duration) string {
	s := d.Round(time.Millisecond).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
