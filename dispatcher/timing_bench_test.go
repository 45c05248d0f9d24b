package dispatcher_test

import (
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// The timings the delivery tests only bound (never early, never faster than the limit) are
// measured here, on whatever machine runs them:
//
//	go test ./dispatcher -run '^$' -bench 'RetryWaits|RateLimit' -benchtime 1x

// BenchmarkRetryWaits runs the seeds' retry schedules and reports how late the attempts came
// at the receiver, after the previous attempt, beyond their wait (seed 002's schedule), their
// step (seed 001's equal jitter: at most the step) or full jitter's bound (seed 000):
// ms-late-max is the latest attempt, ms-late-mean the mean over all of them.
func BenchmarkRetryWaits(b *testing.B) {
	b.Run("seed002-schedule", func(b *testing.B) {
		var late lateness
		for range b.N {
			_, rcv, waits := runSeed002(b)
			hits := attemptsOf(rcv)["evt_pay_1"]
			for i := 1; i < len(hits) && i < len(waits); i++ {
				late.add(attemptGap(hits, i) - waits[i])
			}
		}
		late.report(b)
	})
	b.Run("seed001-equal-jitter", func(b *testing.B) {
		var late lateness
		for range b.N {
			rcv, steps := runSeed001(b)
			hits := attemptsOf(rcv)["evt_c1"]
			for i := 1; i < len(hits) && i < len(steps); i++ {
				late.add(attemptGap(hits, i) - steps[i])
			}
		}
		late.report(b)
	})
	b.Run("seed000-full-jitter", func(b *testing.B) {
		var late lateness
		for range b.N {
			_, rcv := runSeed000(b)
			for _, hits := range attemptsOf(rcv) {
				for i := 1; i < len(hits); i++ {
					late.add(attemptGap(hits, i) - 20*time.Millisecond<<(i-1))
				}
			}
		}
		late.report(b)
	})
}

// lateness collects how much later than their bound attempts came (negative: within it).
type lateness struct {
	max, sum time.Duration
	n        int
}

func (l *lateness) add(d time.Duration) {
	l.max = max(l.max, d)
	l.sum += d
	l.n++
}

func (l *lateness) report(b *testing.B) {
	if l.n == 0 {
		b.Fatal("no attempts measured")
	}
	b.ReportMetric(float64(l.max)/float64(time.Millisecond), "ms-late-max")
	b.ReportMetric(float64(l.sum/time.Duration(l.n))/float64(time.Millisecond), "ms-late-mean")
}

// BenchmarkRateLimit runs TestRateLimitAndMaxInFlightAcrossReplicas's world and reports the
// rate-limited endpoint's sustained rate at the receiver (req/s, after the first ten requests;
// its limit is 40/s) and the most requests the slow endpoint had at once (max-inflight; its
// maxInFlight is 8).
func BenchmarkRateLimit(b *testing.B) {
	var rate, inflight float64
	for range b.N {
		r := runRateLimit(b)
		hits := r.limited.Requests()
		rate += sustainedRate(hits, 10)
		inflight = max(inflight, float64(r.maxInflight))
	}
	b.ReportMetric(rate/float64(b.N), "req/s")
	b.ReportMetric(inflight, "max-inflight")
}

// sustainedRate is the rate of the requests after the first skip (an initial burst).
func sustainedRate(hits []testenv.Request, skip int) float64 {
	if len(hits) < skip+2 {
		return 0
	}
	span := hits[len(hits)-1].At.Sub(hits[skip].At).Seconds()
	return float64(len(hits)-skip-1) / span
}
