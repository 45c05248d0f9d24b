package policy

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

func ptr[T any](v T) *T { return &v }

func d(s string) metav1.Duration {
	x, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return metav1.Duration{Duration: x}
}

func dp(s string) *metav1.Duration { x := d(s); return &x }

func TestBuiltInDefaultIsSeed002(t *testing.T) {
	p := Default()
	if got, want := p.Summary(), "0s, 30s, 5m, 30m, 2h, 12h, 24h"; got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}
	var total time.Duration
	for n := 1; n <= p.MaxAttempts; n++ {
		total += p.Wait(n, rand.Float64)
	}
	// Seed 002: about 38.5 hours from creation to the 7th attempt.
	if want := 38*time.Hour + 35*time.Minute + 30*time.Second; total != want {
		t.Errorf("schedule spans %s, want %s", total, want)
	}
	if _, ok := p.Next(7, 0, rand.Float64); ok {
		t.Error("an 8th attempt was scheduled")
	}
	if p.AutoDisable.FailureRatePercent != 95 || p.AutoDisable.Window != 72*time.Hour || p.AutoDisable.MinAttempts != 20 {
		t.Errorf("auto-disable = %+v", p.AutoDisable)
	}
}

func TestBackoffBounds(t *testing.T) {
	cases := []struct {
		name   string
		spec   v1alpha1.RetryPolicySpec
		n      int
		lo, hi time.Duration
	}{
		// Seed 000: bound(n) = min(cap, 2s * 2^(retry-1)), delay in [0, bound].
		{"seed000 retry 1", v1alpha1.RetryPolicySpec{}, 2, 0, 2 * time.Second},
		{"seed000 retry 2", v1alpha1.RetryPolicySpec{}, 3, 0, 4 * time.Second},
		{"seed000 retry 4", v1alpha1.RetryPolicySpec{}, 5, 0, 16 * time.Second},
		{"seed000 capped", v1alpha1.RetryPolicySpec{MaxAttempts: ptr[int32](100)}, 30, 0, time.Hour},
		{"first attempt is immediate", v1alpha1.RetryPolicySpec{}, 1, 0, 0},
		{"equal jitter", v1alpha1.RetryPolicySpec{Backoff: &v1alpha1.BackoffSpec{Strategy: v1alpha1.BackoffExponential, InitialInterval: dp("2s"), Factor: "2", MaxInterval: dp("16s"), Jitter: v1alpha1.JitterEqual}}, 4, 4 * time.Second, 8 * time.Second},
		{"no jitter", v1alpha1.RetryPolicySpec{Backoff: &v1alpha1.BackoffSpec{InitialInterval: dp("1s"), Factor: "3", MaxInterval: dp("1h"), Jitter: v1alpha1.JitterNone}}, 4, 9 * time.Second, 9 * time.Second},
		{"linear", v1alpha1.RetryPolicySpec{Backoff: &v1alpha1.BackoffSpec{Strategy: v1alpha1.BackoffLinear, InitialInterval: dp("5s"), MaxInterval: dp("12s"), Jitter: v1alpha1.JitterNone}}, 3, 10 * time.Second, 10 * time.Second},
		{"linear capped", v1alpha1.RetryPolicySpec{Backoff: &v1alpha1.BackoffSpec{Strategy: v1alpha1.BackoffLinear, InitialInterval: dp("5s"), MaxInterval: dp("12s"), Jitter: v1alpha1.JitterNone}}, 5, 12 * time.Second, 12 * time.Second},
		{"fractional factor", v1alpha1.RetryPolicySpec{Backoff: &v1alpha1.BackoffSpec{InitialInterval: dp("2s"), Factor: "1.5", MaxInterval: dp("1h"), Jitter: v1alpha1.JitterNone}}, 3, 3 * time.Second, 3 * time.Second},
		{"schedule", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{d("0s"), d("30s"), d("5m")}}, 3, 5 * time.Minute, 5 * time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := FromSpec(&tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := p.Bounds(tc.n)
			if lo != tc.lo || hi != tc.hi {
				t.Fatalf("Bounds(%d) = [%s, %s], want [%s, %s]", tc.n, lo, hi, tc.lo, tc.hi)
			}
			for range 1000 {
				if w := p.Wait(tc.n, rand.Float64); w < lo || w > hi {
					t.Fatalf("Wait(%d) = %s outside [%s, %s]", tc.n, w, lo, hi)
				}
			}
		})
	}
}

// Full jitter really spreads retries: waits cover the whole range, not one point.
func TestFullJitterSpreads(t *testing.T) {
	p, _ := FromSpec(&v1alpha1.RetryPolicySpec{})
	var below, above int
	for range 2000 {
		if p.Wait(3, rand.Float64) < 2*time.Second {
			below++
		} else {
			above++
		}
	}
	if below < 800 || above < 800 {
		t.Errorf("full jitter on [0,4s] is lopsided: %d below 2s, %d above", below, above)
	}
}

func TestSeed001FiveAttemptsInAboutThirtySeconds(t *testing.T) {
	p, err := FromSpec(&v1alpha1.RetryPolicySpec{MaxAttempts: ptr[int32](5), Backoff: &v1alpha1.BackoffSpec{
		Strategy: v1alpha1.BackoffExponential, InitialInterval: dp("2s"), Factor: "2", MaxInterval: dp("16s"), Jitter: v1alpha1.JitterEqual}})
	if err != nil {
		t.Fatal(err)
	}
	var maxTotal time.Duration
	for n := 1; n <= 5; n++ {
		_, hi := p.Bounds(n)
		maxTotal += hi
	}
	if maxTotal != 30*time.Second {
		t.Errorf("5 attempts span at most %s, want 30s (2+4+8+16)", maxTotal)
	}
	if got := p.Summary(); got != "0s, 1s-2s, 2s-4s, 4s-8s, 8s-16s" {
		t.Errorf("Summary = %q", got)
	}
}

func TestRetryAfterIsHonouredUpToTheBound(t *testing.T) {
	p := Default()
	if w, ok := p.Next(1, 90*time.Second, rand.Float64); !ok || w != 90*time.Second {
		t.Errorf("Retry-After 90s gave %s %v", w, ok)
	}
	if w, _ := p.Next(1, 5*time.Hour, rand.Float64); w != time.Hour {
		t.Errorf("Retry-After 5h was not cut to 1h: %s", w)
	}
	p.HonorRetryAfter = false
	if w, _ := p.Next(1, 90*time.Second, rand.Float64); w != 30*time.Second {
		t.Errorf("ignored Retry-After should give the schedule's 30s, got %s", w)
	}
}

func TestFromSpecRejectsWhatTheSchemaRejects(t *testing.T) {
	bad := []v1alpha1.RetryPolicySpec{
		{Schedule: []metav1.Duration{d("0s")}, Backoff: &v1alpha1.BackoffSpec{}},
		{Backoff: &v1alpha1.BackoffSpec{Factor: "0.5"}},
		{Backoff: &v1alpha1.BackoffSpec{Factor: "NaN"}},
		{Backoff: &v1alpha1.BackoffSpec{InitialInterval: dp("10s"), MaxInterval: dp("1s")}},
		{Backoff: &v1alpha1.BackoffSpec{Jitter: v1alpha1.JitterFull, JitterPercent: ptr[int32](10)}},
		{Backoff: &v1alpha1.BackoffSpec{Jitter: v1alpha1.JitterAdditive, JitterPercent: ptr[int32](0)}},
		{Backoff: &v1alpha1.BackoffSpec{Jitter: v1alpha1.JitterAdditive, JitterPercent: ptr[int32](101)}},
		{MaxRetryDuration: &metav1.Duration{Duration: -time.Second}},
		{MaxRetryDuration: &metav1.Duration{}},
		{MaxAttempts: ptr[int32](0)},
		{MaxAttempts: ptr[int32](3), Schedule: []metav1.Duration{d("0s")}},
		{Schedule: []metav1.Duration{d("0s"), {Duration: -time.Second}}},
		{AutoDisable: &v1alpha1.AutoDisableSpec{FailureRatePercent: ptr[int32](95)}},
	}
	for i, s := range bad {
		if _, err := FromSpec(&s); err == nil {
			t.Errorf("case %d accepted: %+v", i, s)
		}
	}
}

func FuzzBackoffWaitStaysInBounds(f *testing.F) {
	f.Add(int64(2e9), "2", int64(3600e9), 5, uint8(0), uint8(0))
	f.Add(int64(1e6), "10", int64(1e9), 100, uint8(1), uint8(1))
	f.Add(int64(5e9), "1", int64(5e9), 1, uint8(2), uint8(0))
	f.Add(int64(2e9), "2", int64(16e9), 5, uint8(3), uint8(0))
	f.Add(int64(2e9), "2", int64(math.MaxInt64), 80, uint8(99), uint8(1))
	f.Fuzz(func(t *testing.T, initial int64, factor string, maxI int64, n int, jitter, strategy uint8) {
		if initial <= 0 || maxI < initial || n < 0 || n > 1000 {
			return
		}
		js := []v1alpha1.JitterMode{v1alpha1.JitterFull, v1alpha1.JitterEqual, v1alpha1.JitterNone, v1alpha1.JitterAdditive}[int(jitter)%4]
		st := []v1alpha1.BackoffStrategy{v1alpha1.BackoffExponential, v1alpha1.BackoffLinear}[int(strategy)%2]
		var pct *int32
		limit := float64(maxI)
		if js == v1alpha1.JitterAdditive {
			pct = ptr(int32(jitter)%100 + 1)
			limit *= 1 + float64(*pct)/100
		}
		p, err := FromSpec(&v1alpha1.RetryPolicySpec{MaxAttempts: ptr[int32](100), Backoff: &v1alpha1.BackoffSpec{
			Strategy: st, InitialInterval: &metav1.Duration{Duration: time.Duration(initial)}, Factor: v1alpha1.Decimal(factor),
			MaxInterval: &metav1.Duration{Duration: time.Duration(maxI)}, Jitter: js, JitterPercent: pct}})
		if err != nil {
			return
		}
		lo, hi := p.Bounds(n)
		if lo < 0 || hi < lo || float64(hi) > limit {
			t.Fatalf("Bounds(%d) = [%s,%s] with max %s", n, lo, hi, time.Duration(maxI))
		}
		if w := p.Wait(n, rand.Float64); w < lo || w > hi {
			t.Fatalf("Wait(%d) = %s outside [%s,%s]", n, w, lo, hi)
		}
	})
}

// Additive jitter (seed 001: "a small added jitter") never shortens a wait and adds at most
// jitterPercent of the bound: the bound is capped at maxInterval first.
func TestAdditiveJitterAddsAtMostThePercent(t *testing.T) {
	additive := func(strategy v1alpha1.BackoffStrategy, initial, maxI string, pct *int32) v1alpha1.RetryPolicySpec {
		return v1alpha1.RetryPolicySpec{MaxAttempts: ptr[int32](10), Backoff: &v1alpha1.BackoffSpec{Strategy: strategy,
			InitialInterval: dp(initial), Factor: "2", MaxInterval: dp(maxI), Jitter: v1alpha1.JitterAdditive, JitterPercent: pct}}
	}
	ms := time.Millisecond
	cases := []struct {
		name   string
		spec   v1alpha1.RetryPolicySpec
		n      int
		lo, hi time.Duration
	}{
		{"first attempt is immediate", additive(v1alpha1.BackoffExponential, "2s", "16s", nil), 1, 0, 0},
		{"default 10%, retry 1", additive(v1alpha1.BackoffExponential, "2s", "16s", nil), 2, 2 * time.Second, 2200 * ms},
		{"default 10%, retry 2", additive(v1alpha1.BackoffExponential, "2s", "16s", nil), 3, 4 * time.Second, 4400 * ms},
		{"default 10%, retry 3", additive(v1alpha1.BackoffExponential, "2s", "16s", nil), 4, 8 * time.Second, 8800 * ms},
		{"default 10%, retry 4", additive(v1alpha1.BackoffExponential, "2s", "16s", nil), 5, 16 * time.Second, 17600 * ms},
		{"capped bound, then added", additive(v1alpha1.BackoffExponential, "2s", "5s", nil), 5, 5 * time.Second, 5500 * ms},
		{"25%", additive(v1alpha1.BackoffExponential, "2s", "1h", ptr[int32](25)), 3, 4 * time.Second, 5 * time.Second},
		{"1%", additive(v1alpha1.BackoffExponential, "10s", "1h", ptr[int32](1)), 2, 10 * time.Second, 10100 * ms},
		{"100%", additive(v1alpha1.BackoffExponential, "10s", "1h", ptr[int32](100)), 2, 10 * time.Second, 20 * time.Second},
		{"linear", additive(v1alpha1.BackoffLinear, "3s", "1h", ptr[int32](10)), 3, 6 * time.Second, 6600 * ms},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := FromSpec(&tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := p.Bounds(tc.n)
			if lo != tc.lo || hi != tc.hi {
				t.Fatalf("Bounds(%d) = [%s, %s], want [%s, %s]", tc.n, lo, hi, tc.lo, tc.hi)
			}
			if w := p.Wait(tc.n, func() float64 { return 0 }); w != lo {
				t.Errorf("Wait(%d) with no jitter drawn = %s, want the bound %s", tc.n, w, lo)
			}
			var low, high int
			for range 2000 {
				w := p.Wait(tc.n, rand.Float64)
				if w < lo || w > hi {
					t.Fatalf("Wait(%d) = %s outside [%s, %s]", tc.n, w, lo, hi)
				}
				if w < lo+(hi-lo)/2 {
					low++
				} else {
					high++
				}
			}
			if hi > lo && (low < 800 || high < 800) {
				t.Errorf("the added jitter does not spread over [%s, %s]: %d in the lower half, %d in the upper", lo, hi, low, high)
			}
		})
	}
}

// The crm-resend sample is seed 001: 5 attempts at about 0, 2, 4, 8 and 16s with a small added
// jitter, in about 30 seconds.
func TestCRMResendSampleIsSeed001(t *testing.T) {
	raw, err := os.ReadFile("../../config/samples/webhook-operator_v1alpha1_retrypolicy_crm-resend.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rp v1alpha1.RetryPolicy
	if err := yaml.Unmarshal(raw, &rp); err != nil {
		t.Fatal(err)
	}
	p, err := FromSpec(&rp.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Summary(), "0s, 2s-2.2s, 4s-4.4s, 8s-8.8s, 16s-17.6s"; got != want {
		t.Errorf("crm-resend waits %q, want %q", got, want)
	}
	var lo, hi time.Duration
	for n := 1; n <= p.MaxAttempts; n++ {
		l, h := p.Bounds(n)
		lo, hi = lo+l, hi+h
	}
	if p.MaxAttempts != 5 || lo != 30*time.Second || hi != 33*time.Second {
		t.Errorf("%d attempts within [%s, %s], want 5 within [30s, 33s]", p.MaxAttempts, lo, hi)
	}
	if p.AutoDisable.ConsecutiveFailures != 10 {
		t.Errorf("auto-pause after %d consecutive failures, want 10", p.AutoDisable.ConsecutiveFailures)
	}
}

// maxRetryDuration ends retries in time (seed 000: "an attempt limit or a time limit"): when the
// next attempt would start later than created + maxRetryDuration, there is none.
func TestMaxRetryDurationEndsRetries(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sched := func(limit string, waits ...string) Policy {
		spec := v1alpha1.RetryPolicySpec{}
		for _, w := range waits {
			spec.Schedule = append(spec.Schedule, d(w))
		}
		if limit != "" {
			spec.MaxRetryDuration = dp(limit)
		}
		p, err := FromSpec(&spec)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name       string
		p          Policy
		n          int
		retryAfter time.Duration
		created    time.Time
		failedAt   time.Duration // after created
		wait       time.Duration
		verdict    Verdict
	}{
		{"within the limit", sched("1m", "0s", "30s", "5m"), 1, 0, created, time.Second, 30 * time.Second, Retry},
		{"next attempt past the limit", sched("1m", "0s", "30s", "5m"), 2, 0, created, 31 * time.Second, 0, RetryDurationExceeded},
		{"next attempt exactly at the limit", sched("1m", "0s", "30s", "30s"), 2, 0, created, 30 * time.Second, 30 * time.Second, Retry},
		{"a Retry-After past the limit", sched("1m", "0s", "1s", "1s"), 1, 2 * time.Minute, created, time.Second, 0, RetryDurationExceeded},
		{"attempts exhausted first", sched("1h", "0s", "1s"), 2, 0, created, 2 * time.Second, 0, Exhausted},
		{"no limit", sched("", "0s", "30s", "5m"), 2, 0, created, 24 * time.Hour, 5 * time.Minute, Retry},
		{"no creation time", sched("1m", "0s", "30s", "5m"), 2, 0, time.Time{}, 31 * time.Second, 5 * time.Minute, Retry},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wait, v := tc.p.After(tc.n, tc.retryAfter, tc.created, created.Add(tc.failedAt), rand.Float64)
			if wait != tc.wait || v != tc.verdict {
				t.Errorf("After(%d) = %s, %v; want %s, %v", tc.n, wait, v, tc.wait, tc.verdict)
			}
		})
	}
	if got, want := sched("24h", "0s", "30s").Summary(), "0s, 30s, within 24h"; got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}
}
