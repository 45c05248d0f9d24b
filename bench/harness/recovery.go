package harness

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// recovery takes a receiver down while deliveries queue, brings it back, and records the
// per-second receive rate and the circuit's states until the backlog has drained.
func (b *bench) recovery(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Recovery"}
	rcv, err := newReceiver("recovery", nil)
	if err != nil {
		return nil, err
	}
	defer rcv.Close()
	openFor, ramp, maxWait := 30*time.Second, 30*time.Second, 30*time.Second
	if o.Quick {
		openFor, ramp, maxWait = 5*time.Second, 10*time.Second, 5*time.Second
	}
	spec := v1alpha1.RetryPolicySpec{
		MaxAttempts: ptr(int32(100)),
		Backoff: &v1alpha1.BackoffSpec{Strategy: v1alpha1.BackoffExponential, InitialInterval: dur(time.Second), Factor: "2",
			MaxInterval: dur(maxWait), Jitter: v1alpha1.JitterFull},
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 5, OpenDuration: dur(openFor), SuccessesToClose: 1, RampUp: dur(ramp)},
	}
	type result struct {
		series      []float64 // receipts per second since the receiver came back
		firstAfter  float64   // seconds from recovery to the first receipt
		t50, t90    float64
		t100        float64
		reached     bool
		dups        int
		got         int
		transitions []string
		peak        float64
		// burst rates before the outage and after the backlog drained
		before, after float64
	}
	var results []result
	for r := range o.RecoveryRuns {
		progress("recovery run %d/%d: %s outage, %d deliveries queued", r+1, o.RecoveryRuns, o.Outage, o.RecoveryEvents)
		ns, err := b.namespace(ctx, "recovery")
		if err != nil {
			return nil, err
		}
		if err := b.retryPolicy(ctx, ns, "recovery", spec); err != nil {
			return nil, err
		}
		if err := b.createEndpoints(ctx, ns, []endpoint{{name: "flaky", spec: v1alpha1.WebhookEndpointSpec{URL: rcv.URLWithPath("/flaky"),
			EventTypes: []v1alpha1.EventTypePattern{">"}, RetryPolicyRef: &v1alpha1.LocalObjectReference{Name: "recovery"}}}}); err != nil {
			return nil, err
		}
		d, err := b.startDispatcher(ns)
		if err != nil {
			return nil, err
		}
		warm := fmt.Sprintf("rec%d-warm", r)
		if err := b.publish(ctx, ns, "rec.warm", warm, 0, 20); err != nil {
			d.kill()
			return nil, err
		}
		if w := await(ctx, rcv, warm, 20, time.Minute, nil); !w.reached {
			d.kill()
			return nil, fmt.Errorf("warm-up: %d of 20 delivered; dispatcher log %s", w.unique, d.logPath)
		}

		var res result
		burst := min(3000, max(500, o.RecoveryEvents/3))
		measureBurst := func(label string) (float64, error) {
			tag := fmt.Sprintf("rec%d-%s", r, label)
			if err := b.publish(ctx, ns, "rec.burst", tag, 0, burst); err != nil {
				return 0, err
			}
			w := await(ctx, rcv, tag, burst, 2*time.Minute, nil)
			if !w.reached {
				return 0, fmt.Errorf("burst %s: %d of %d delivered; dispatcher log %s", label, w.unique, burst, d.logPath)
			}
			rcv.forget(tag)
			return w.rate(), nil
		}
		if res.before, err = measureBurst("before"); err != nil {
			d.kill()
			return nil, err
		}

		// Follow the circuit state the dispatcher reports on the endpoint's status.
		var tmu sync.Mutex
		tDown := time.Now()
		stopWatch, watched := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(watched)
			last := ""
			for {
				st := b.circuitState(ctx, ns, "flaky")
				if st != last && st != "" {
					tmu.Lock()
					res.transitions = append(res.transitions, fmt.Sprintf("%+.1fs %s", time.Since(tDown).Seconds()-o.Outage.Seconds(), st))
					tmu.Unlock()
					last = st
				}
				select {
				case <-stopWatch:
					return
				case <-time.After(250 * time.Millisecond):
				}
			}
		}()

		rcv.Down()
		tag := fmt.Sprintf("rec%d", r)
		if err := b.publish(ctx, ns, "rec.evt", tag, 0, o.RecoveryEvents); err != nil {
			d.kill()
			return nil, err
		}
		select {
		case <-time.After(time.Until(tDown.Add(o.Outage))):
		case <-ctx.Done():
			d.kill()
			return nil, ctx.Err()
		}
		if err := rcv.Up(); err != nil {
			d.kill()
			return nil, err
		}
		tUp := time.Now()
		timeout := 10 * time.Minute
		if o.Quick {
			timeout = 3 * time.Minute
		}
		w := await(ctx, rcv, tag, o.RecoveryEvents, timeout, nil)
		close(stopWatch)
		<-watched
		if w.reached {
			// Past the ramp-up: is the endpoint back to full speed?
			if wait := time.Until(tUp.Add(ramp + openFor + 5*time.Second)); wait > 0 && w.last.Sub(tUp) < ramp+openFor {
				time.Sleep(wait)
			}
			if res.after, err = measureBurst("after"); err != nil {
				d.kill()
				return nil, err
			}
		}
		if err := d.stop(time.Minute); err != nil {
			progress("  %v", err)
		}
		b.retire(ctx, ns)

		recv, _ := rcv.times(tag)
		res.reached, res.got, res.dups = w.reached, w.unique, w.ok-w.unique
		res.series = countPer(res.series, tUp, time.Second, recv)
		for i, t := range recv {
			at := time.Unix(0, t).Sub(tUp).Seconds()
			if i == 0 {
				res.firstAfter = at
			}
			if i+1 == (len(recv)+1)/2 && res.t50 == 0 {
				res.t50 = at
			}
			if i+1 == int(0.9*float64(len(recv))) && res.t90 == 0 {
				res.t90 = at
			}
			res.t100 = at
		}
		for _, v := range res.series {
			res.peak = max(res.peak, v)
		}
		results = append(results, res)
		progress("  first receipt %.1fs after recovery, all %d by %.1fs, peak %s/s; bursts before %s/s, after %s/s", res.firstAfter, res.got, res.t100, num(res.peak), num(res.before), num(res.after))
		rcv.forget(tag)
	}

	s.printf("One endpoint (`maxInFlight: 50`) with a RetryPolicy: exponential backoff 1s × 2 up to %s with full jitter, 100 attempts; circuit opens after 5 consecutive failures, stays open %s, closes after 1 successful probe, then ramps up over %s. Its receiver is taken down (connections refused) for %s; right after it goes down, %d events are published. Time 0 below is when the receiver listens again; the backlog has drained when every event has arrived once.", maxWait, openFor, ramp, o.Outage, o.RecoveryEvents)
	var rows [][]string
	for i, res := range results {
		rows = append(rows, []string{strconv.Itoa(i + 1), fmt.Sprintf("%d / %d", res.got, o.RecoveryEvents), fmt.Sprintf("%.1f", res.firstAfter),
			fmt.Sprintf("%.1f", res.t50), fmt.Sprintf("%.1f", res.t90), fmt.Sprintf("%.1f", res.t100), num(res.peak),
			num(float64(res.got) / max(0.001, res.t100-res.firstAfter)), strconv.Itoa(res.dups), num(res.before), num(res.after), ratio(res.after / res.before)})
	}
	s.table([]string{"run", "received", "first receipt (s)", "50% (s)", "90% (s)", "all (s)", "peak /s", "mean /s from first to last", "duplicates",
		"burst before the outage /s", "burst after the drain /s", "after / before"}, rows)
	s.printf("The bursts (%d events at once, before the outage and again once the ramp-up is over) show whether the endpoint gets back to its full speed.", min(3000, max(500, o.RecoveryEvents/3)))
	for i, res := range results {
		s.printf("- run %d circuit states on the status (seconds from recovery; negative is during the outage): %s", i+1, strings.Join(res.transitions, ", "))
	}
	s.printf("")
	s.printf("Deliveries received per second after recovery:")
	head := []string{"second"}
	longest := 0
	for i, res := range results {
		head = append(head, fmt.Sprintf("run %d", i+1))
		longest = max(longest, len(res.series))
	}
	var srows [][]string
	series := map[string][]float64{}
	for sec := 0; sec < longest && sec < 240; sec++ {
		row := []string{strconv.Itoa(sec)}
		for _, res := range results {
			v := ""
			if sec < len(res.series) {
				v = num(res.series[sec])
			}
			row = append(row, v)
		}
		srows = append(srows, row)
	}
	for i, res := range results {
		series[fmt.Sprintf("run %d", i+1)] = res.series
	}
	s.table(head, srows)
	png := b.rep.file("recovery.png")
	if err := ratePNG(png, "webhook-operator: receive rate after a receiver outage", "seconds since the receiver came back", "deliveries received per second", time.Second, series); err != nil {
		s.printf("(recovery picture failed: %v)", err)
	} else {
		s.printf("Picture: `%s`", png)
	}
	return s, nil
}
