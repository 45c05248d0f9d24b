package harness

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// isolation measures 99 healthy endpoints alone, beside one whose receiver hangs until the
// endpoint's timeout, and beside one whose circuit is open; each event goes to every endpoint.
func (b *bench) isolation(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Isolation"}
	ok, err := newReceiver("iso-ok", nil)
	if err != nil {
		return nil, err
	}
	defer ok.Close()
	hang, err := newReceiver("iso-hang", nil)
	if err != nil {
		return nil, err
	}
	hang.SetResponder(hangUntilTimeout)
	defer hang.Close()
	fail, err := newReceiver("iso-fail", func(string) int { return 503 })
	if err != nil {
		return nil, err
	}
	defer fail.Close()

	variants := []string{"99 healthy endpoints alone", "+ 1 endpoint hanging until its timeout", "+ 1 endpoint with its circuit open"}
	rates := make([][]float64, len(variants))
	rel := make([][]float64, len(variants))
	notes := make([][]string, len(variants))
	others := make([][]float64, len(variants))
	for r := range o.IsoRepeat {
		// Each run starts with a different case, so a drift in the machine's load does not
		// always favour the same one.
		got := make([]float64, len(variants))
		for k := range variants {
			v := (k + r) % len(variants)
			progress("isolation run %d/%d: %s", r+1, o.IsoRepeat, variants[v])
			rate, note, load, err := b.isoRun(ctx, r, v, ok, hang, fail)
			if err != nil {
				return nil, err
			}
			others[v] = append(others[v], load)
			got[v] = rate
			rates[v] = append(rates[v], rate)
			notes[v] = append(notes[v], note)
			progress("  %s deliveries/s to the healthy endpoints (%s)", num(rate), note)
		}
		for v := range variants {
			rel[v] = append(rel[v], got[v]/got[0])
		}
	}
	var rows [][]string
	for v, name := range variants {
		rows = append(rows, []string{name, nums(rates[v]), "**" + num(median(rates[v])) + "**", ratios(rel[v]), "**" + ratio(median(rel[v])) + "**", cores(others[v])})
	}
	s.printf("One dispatcher, one namespace; 99 healthy endpoints (defaults: `maxInFlight: 50`) subscribe to `iso.>`, all on one receiver answering 200 (one path each). %d events are published at once, so each healthy endpoint gets %d deliveries (%d in all); the rate is distinct healthy deliveries between the first and the last arrival. Each run measures the three cases (each run starting with a different one), each with a fresh namespace and dispatcher; ratios are to the healthy-only case of the same run.", o.IsoEvents, o.IsoEvents, 99*o.IsoEvents)
	s.printf("- hanging: the 100th endpoint also subscribes to `iso.>`; its receiver never answers, its `timeout` is %s, and its RetryPolicy has the circuit breaker off (`consecutiveFailures: 0`), so it keeps %d requests hanging to the timeout throughout.", o.IsoTimeout, 50)
	s.printf("- circuit open: the 100th endpoint subscribes to `>`, its receiver answers 503, and its RetryPolicy opens the circuit after 5 failures for 1h; it is opened before the measurement (status shows `Open`), so its deliveries of the measured events are parked.")
	s.table([]string{"case", "runs (healthy deliveries/s)", "median /s", "ratio to healthy-only, per run", "median ratio", "other users' CPU during it, per run (cores)"}, rows)
	s.printf("Goal (issue 5): ≥ 0.95 of the healthy-only rate: hanging %s (%s), circuit open %s (%s).",
		goal(median(rel[1]) >= 0.95), ratio(median(rel[1])), goal(median(rel[2]) >= 0.95), ratio(median(rel[2])))
	s.printf("")
	for v := 1; v < len(variants); v++ {
		s.printf("- %s, per run: %s", variants[v], strings.Join(notes[v], "; "))
	}
	return s, nil
}

func (b *bench) isoRun(ctx context.Context, r, v int, ok, hang, fail *receiver) (float64, string, float64, error) {
	o := b.o
	ns, err := b.namespace(ctx, "iso")
	if err != nil {
		return 0, "", 0, err
	}
	if err := b.retryPolicy(ctx, ns, "no-circuit", v1alpha1.RetryPolicySpec{CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 0}}); err != nil {
		return 0, "", 0, err
	}
	if err := b.retryPolicy(ctx, ns, "long-open", v1alpha1.RetryPolicySpec{CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 5, OpenDuration: dur(time.Hour)}}); err != nil {
		return 0, "", 0, err
	}
	var eps []endpoint
	for i := range 99 {
		eps = append(eps, endpoint{name: fmt.Sprintf("h%02d", i), spec: v1alpha1.WebhookEndpointSpec{URL: ok.URLWithPath(fmt.Sprintf("/h%02d", i)), EventTypes: []v1alpha1.EventTypePattern{"iso.>"}}})
	}
	switch v {
	case 1:
		eps = append(eps, endpoint{name: "bad", spec: v1alpha1.WebhookEndpointSpec{URL: hang.URLWithPath("/bad"), EventTypes: []v1alpha1.EventTypePattern{"iso.>"},
			Timeout: dur(o.IsoTimeout), RetryPolicyRef: &v1alpha1.LocalObjectReference{Name: "no-circuit"}}})
	case 2:
		eps = append(eps, endpoint{name: "bad", spec: v1alpha1.WebhookEndpointSpec{URL: fail.URLWithPath("/bad"), EventTypes: []v1alpha1.EventTypePattern{">"},
			RetryPolicyRef: &v1alpha1.LocalObjectReference{Name: "long-open"}}})
	}
	if err := b.createEndpoints(ctx, ns, eps); err != nil {
		return 0, "", 0, err
	}
	d, err := b.startDispatcher(ns)
	if err != nil {
		return 0, "", 0, err
	}
	defer func() {
		if err := d.stop(time.Minute); err != nil {
			progress("  %v", err)
		}
		b.retire(ctx, ns)
	}()
	tag := fmt.Sprintf("iso%d-%d", r, v)
	if err := b.publish(ctx, ns, "iso.warm", tag+"-warm", 0, 1); err != nil {
		return 0, "", 0, err
	}
	if w := await(ctx, ok, tag+"-warm", 99, time.Minute, nil); !w.reached {
		return 0, "", 0, fmt.Errorf("warm-up: %d of 99 endpoints delivered; dispatcher log %s", w.unique, d.logPath)
	}
	note := ""
	switch v {
	case 1:
		if testenv.Poll(30*time.Second, func() bool { return hang.Stats().Waiting > 0 }) != nil {
			return 0, "", 0, fmt.Errorf("the hanging endpoint got no request")
		}
	case 2:
		if err := b.publish(ctx, ns, "warm.fail", tag+"-fail", 0, 10); err != nil {
			return 0, "", 0, err
		}
		if testenv.Poll(time.Minute, func() bool { return b.circuitState(ctx, ns, "bad") == string(v1alpha1.CircuitOpen) }) != nil {
			return 0, "", 0, fmt.Errorf("the failing endpoint's circuit did not open; dispatcher log %s", d.logPath)
		}
	}
	failedBefore := 0
	if v == 2 {
		_, _, failedBefore = fail.counts(tag)
	}
	if err := b.publish(ctx, ns, "iso.evt", tag, 0, o.IsoEvents); err != nil {
		return 0, "", 0, err
	}
	want := 99 * o.IsoEvents
	w := await(ctx, ok, tag, want, 3*time.Minute+time.Duration(want)*time.Millisecond, nil)
	if !w.reached {
		return 0, "", 0, fmt.Errorf("%s: %d of %d healthy deliveries; dispatcher log %s", tag, w.unique, want, d.logPath)
	}
	switch v {
	case 1:
		note = fmt.Sprintf("%d requests hanging at the end", hang.Stats().Waiting)
	case 2:
		_, _, failedAfter := fail.counts(tag)
		note = fmt.Sprintf("circuit %s, %d requests to it during the measurement", b.circuitState(ctx, ns, "bad"), failedAfter-failedBefore)
	}
	ok.forget(tag)
	return w.rate(), note, w.others, nil
}
