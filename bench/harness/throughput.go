package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// tpRun is one measurement of the throughput scenario.
type tpRun struct {
	rate float64
	// CPU per delivery (µs) of the client process, nats-server and the receiver process.
	clientUS, natsUS, recvUS float64
	// allocs are the dispatcher's heap allocations per delivery (0: not measured).
	allocs float64
	dups   int
	errors int
	// others is the CPU the rest of the machine used during the measurement, in cores.
	others float64
	// missed heartbeats of a baseline's pull iterator; stalls of the dispatcher (no delivery
	// for 5s or more), with what was seen at the first.
	missed    int
	stalls    []time.Duration
	stallNote string
}

// throughput measures, in the same run and with the same concurrency: a plain Go HTTP client
// to the receiver, raw JetStream consume-and-ack, a naive consume→POST→ack loop, and the
// dispatcher with every feature on, each over a backlog of o.Events 1 KB events.
func (b *bench) throughput(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Throughput"}
	rcv, err := newReceiver("throughput", nil)
	if err != nil {
		return nil, err
	}
	defer rcv.Close()
	n, c := o.Events, o.InFlight
	names := []string{
		"raw HTTP POST (plain Go client process → receiver)",
		"raw HTTP POST, client inside the receiver's process (calibration)",
		"raw JetStream consume + ack",
		"naive loop: consume → POST → ack",
		"dispatcher, every feature on",
	}
	roles := []string{"http", "http-inproc", "jsack", "naive"}
	const naiveIdx, dispIdx = 3, 4
	runs := make([][]tpRun, len(names))
	var loads []string
	for r := range o.Repeat {
		progress("throughput run %d/%d: %d events, concurrency %d", r+1, o.Repeat, n, c)
		// Each run starts with a different measure, so a drift in the machine's load does not
		// always favour the same one.
		for k := range len(names) {
			i := (k + r) % len(names)
			var run tpRun
			var err error
			if i == dispIdx {
				run, _, err = b.dispatcherRun(ctx, rcv, fmt.Sprintf("tp%d-disp", r), n, c, 1, "")
			} else {
				run, err = b.rawRun(ctx, rcv, roles[i], fmt.Sprintf("tp%d-%s", r, roles[i]), n, c)
			}
			if err != nil {
				return nil, err
			}
			runs[i] = append(runs[i], run)
			progress("  %-40s %s/s", names[i], num(run.rate))
		}
		loads = append(loads, loadAvg())
	}

	rates := func(i int) []float64 {
		var v []float64
		for _, r := range runs[i] {
			v = append(v, r.rate)
		}
		return v
	}
	var rows [][]string
	naive := rates(naiveIdx)
	var dispRatios []float64
	for i, name := range names {
		var rs []float64
		for j, r := range runs[i] {
			rs = append(rs, r.rate/naive[j])
		}
		if i == dispIdx {
			dispRatios = rs
		}
		rows = append(rows, []string{name, nums(rates(i)), "**" + num(median(rates(i))) + "**", ratios(rs), "**" + ratio(median(rs)) + "**"})
	}
	s.printf("%d events of 1 KB per measurement, receiver answering 200; concurrency %d for every client (the dispatcher endpoint's `maxInFlight: %d`, so its consumer's MaxAckPending is %d; the naive loop's workers; the HTTP client's goroutines). %d runs, each runs all five in turn (each run starting with a different one); ratios are to the naive loop of the same run.", n, c, c, c, o.Repeat)
	s.printf("The dispatcher's endpoint subscribes to `order.*` beside four endpoints with other patterns (routing is real), signs every request (Standard Webhooks), writes every attempt to the delivery log stream and keeps shared health (key-value bucket, status on the resource). The events are published before the dispatcher starts; its rate is distinct deliveries between the first and the last arrival at the receiver. The naive loop and consume-and-ack read the same number of messages from a work-queue stream with the same storage.")
	s.table([]string{"measure", "runs (deliveries/s)", "median /s", "ratio to naive, per run", "median ratio"}, rows)
	med, medRatio := median(rates(dispIdx)), median(dispRatios)
	naiveMed := median(rates(naiveIdx))
	b.rep.goal(s, medRatio >= 0.8, "issue 14", "at least 0.8 of the naive loop's deliveries/s in the same run, every feature on: %%GOAL%% (median ratio %s; per run %s; the dispatcher's median %s/s, the naive loop's %s/s).",
		ratio(medRatio), ratios(dispRatios), num(med), num(naiveMed))
	b.rep.goal(s, medRatio >= 0.95, "issue 32", "every feature on, at least 0.95 of the naive loop's deliveries/s in the same run: %%GOAL%% (median ratio %s).", ratio(medRatio))
	s.printf("Goal (issue 4): at least 20,000 deliveries/s, i.e. at least 0.5 of the naive loop in the same run. Ratio: %s (median %s). Absolute: %s (median %s/s).",
		goal(medRatio >= 0.5), ratio(medRatio), goal(med >= 20000), num(med))
	s.printf("")
	s.printf("CPU per delivery (µs, median over runs; client = the process under test, measured from its first message to its last; for the calibration row the client and the receiver share one process, so its client figure is both). Pull stalls, per run: for the baselines, \"no heartbeat received\" errors of their JetStream pull iterator (the loop carries on); for the dispatcher, pauses of 5s or more without a delivery (count and total).")
	var cpuRows [][]string
	for i, name := range names {
		var cl, na, rc, ot, al []float64
		dups, errs := 0, 0
		var pulls []string
		for _, r := range runs[i] {
			switch {
			case r.missed > 0:
				pulls = append(pulls, fmt.Sprintf("%d missed heartbeats", r.missed))
			case len(r.stalls) > 0:
				var tot time.Duration
				for _, st := range r.stalls {
					tot += st
				}
				pulls = append(pulls, fmt.Sprintf("%d (%.0fs)", len(r.stalls), tot.Seconds()))
			default:
				pulls = append(pulls, "0")
			}
			cl, na, rc, ot = append(cl, r.clientUS), append(na, r.natsUS), append(rc, r.recvUS), append(ot, r.others)
			if r.allocs > 0 {
				al = append(al, r.allocs)
			}
			dups += r.dups
			errs += r.errors
		}
		allocs := "-"
		if len(al) > 0 {
			allocs = fmt.Sprintf("%.0f", median(al))
		}
		cpuRows = append(cpuRows, []string{name, fmt.Sprintf("%.1f", median(cl)), fmt.Sprintf("%.1f", median(na)), fmt.Sprintf("%.1f", median(rc)), allocs, strconv.Itoa(dups), strconv.Itoa(errs), cores(ot), strings.Join(pulls, ", ")})
	}
	s.table([]string{"measure", "client µs/delivery", "nats-server µs/delivery", "receiver µs/delivery", "client heap allocations/delivery", "duplicates", "errors", "other users' CPU during it, per run (cores)", "pull stalls"}, cpuRows)
	var natsRatios []float64
	for j, r := range runs[dispIdx] {
		if j < len(runs[naiveIdx]) && runs[naiveIdx][j].natsUS > 0 {
			natsRatios = append(natsRatios, r.natsUS/runs[naiveIdx][j].natsUS)
		}
	}
	b.rep.goal(s, len(natsRatios) > 0 && median(natsRatios) <= 1.5, "issue 14", "nats-server CPU per delivery at most 1.5x the naive loop's, same run: %%GOAL%% (median %s; per run %s).",
		ratio(median(natsRatios)), ratios(natsRatios))
	for _, r := range runs[dispIdx] {
		if r.stallNote != "" {
			s.printf("- dispatcher stall: %s.", r.stallNote)
		}
	}
	s.printf("Load average (1, 5, 15 min) after each run: %s.", strings.Join(loads, "; "))

	if o.Profile {
		pn := 3 * n
		secs := max(2, min(15, int(0.6*float64(pn)/max(1, med))))
		prof := b.rep.file("dispatcher-cpu.pprof")
		progress("throughput: profiling a dispatcher run of %d events for %ds", pn, secs)
		run, perr, err := b.dispatcherRun(ctx, rcv, "tp-prof", pn, c, 1, prof, secs)
		if err != nil {
			return nil, err
		}
		s.printf("")
		s.printf("### Where the dispatcher's time goes")
		s.printf("")
		if perr != nil {
			s.printf("profile failed: %v", perr)
		} else {
			s.printf("CPU profile of the dispatcher process for %ds in the middle of a %d-event run (%s deliveries/s under the profiler); saved as `%s` (not committed; `go tool pprof -top %s`).", secs, pn, num(run.rate), prof, prof)
			s.printf("")
			s.printf("Flat (self time):")
			s.printf("```")
			s.printf("%s", pprofTop(prof))
			s.printf("```")
			s.printf("Cumulative:")
			s.printf("```")
			s.printf("%s", pprofTop(prof, "-cum"))
			s.printf("```")
			s.printf("Cumulative, the project's functions only:")
			s.printf("```")
			s.printf("%s", pprofTop(prof, "-cum", "-show=webhook-operator/"))
			s.printf("```")
			if np := strings.TrimSuffix(prof, "dispatcher-cpu.pprof") + "nats-cpu.pprof"; fileExists(np) {
				s.printf("nats-server over the same seconds (`%s`), cumulative:", np)
				s.printf("```")
				s.printf("%s", pprofTop(np, "-cum"))
				s.printf("```")
			}
			if ap := strings.TrimSuffix(prof, "cpu.pprof") + "allocs.pprof"; fileExists(ap) {
				base := strings.TrimSuffix(prof, "cpu.pprof") + "allocs-base.pprof"
				s.printf("The dispatcher's heap allocations over the same seconds (`%s` less `%s`), objects, cumulative, the project's functions and what they call:", ap, base)
				s.printf("```")
				s.printf("%s", pprofTop(ap, "-sample_index=alloc_objects", "-diff_base="+base, "-cum", "-focus=webhook-operator/"))
				s.printf("```")
			}
			s.printf("Where in-flight deliveries are (goroutines under `worker.runMsg`, summed over 10 goroutine profiles taken during the profile):")
			waitTable(s, b.waits, 10)
		}
	}
	return s, nil
}

// rawRun runs one baseline (role http, jsack or naive) in a child process.
func (b *bench) rawRun(ctx context.Context, rcv *receiver, role, tag string, n, c int) (tpRun, error) {
	var run tpRun
	args := []string{role, "-n", strconv.Itoa(n)}
	switch role {
	case "http":
		args = append(args, "-url", rcv.URLWithPath("/raw"), "-c", strconv.Itoa(c), "-tag", tag)
	default:
		if err := b.rawConsumer(ctx, tag, c); err != nil {
			return run, err
		}
		if err := b.publishTo(ctx, "benchraw."+tag, tag, 0, n); err != nil {
			return run, err
		}
		args = append(args, "-nats", b.natsURL, "-stream", rawStream, "-consumer", tag)
		if role == "naive" {
			args = append(args, "-url", rcv.URLWithPath("/naive"), "-c", strconv.Itoa(c))
		} else {
			args = append(args, "-batch", strconv.Itoa(c))
		}
	}
	timeout := 2*time.Minute + time.Duration(n)*time.Millisecond
	if role == "http-inproc" {
		done := make(chan clientResult, 1)
		go func() { done <- postLoop(rcv.URLWithPath("/inproc"), n, c, tag) }()
		win := await(ctx, rcv, tag, n, timeout, map[string]int{"nats-server": b.nats.pid()})
		res := <-done
		if !win.reached {
			return run, fmt.Errorf("%s: the receiver saw %d of %d", tag, win.unique, n)
		}
		rcv.forget(tag)
		return tpRun{rate: win.rate(), clientUS: res.CPU * 1e6 / float64(n), errors: res.Errors, dups: win.ok - win.unique, others: win.others}, nil
	}
	load := startMeter()
	p, err := startChild(b.dir, tag, nil, args...)
	if err != nil {
		return run, err
	}
	var win window
	if role != "jsack" {
		win = await(ctx, rcv, tag, n, timeout, map[string]int{"nats-server": b.nats.pid(), "receiver": os.Getpid()})
	}
	line, err := p.line("RESULT", timeout)
	if err != nil {
		p.kill()
		return run, err
	}
	_ = p.stop(30 * time.Second)
	if role != "http" {
		_ = b.js.DeleteConsumer(ctx, rawStream, tag)
	}
	var res clientResult
	if err := json.Unmarshal([]byte(line), &res); err != nil {
		return run, err
	}
	run.errors = res.Errors
	run.clientUS = res.CPU * 1e6 / float64(n)
	run.others = load.others()
	run.missed = res.MissedHeartbeats
	if role == "jsack" {
		run.rate = float64(n) / res.Seconds
		return run, nil
	}
	if !win.reached {
		return run, fmt.Errorf("%s: the receiver saw %d of %d", tag, win.unique, n)
	}
	run.rate = win.rate()
	run.dups = win.ok - win.unique
	run.others = win.others
	if win.sampled > 0 {
		run.natsUS = win.cpu["nats-server"].Seconds() * 1e6 / float64(win.sampled)
		run.recvUS = win.cpu["receiver"].Seconds() * 1e6 / float64(win.sampled)
	}
	rcv.forget(tag)
	return run, nil
}

// dispatcherRun delivers n pre-published events through a fresh dispatcher of the given
// replicas (its client CPU is theirs together). With profile set, it saves a CPU profile of
// profSecs[0] seconds of the first replica, taken once deliveries flow.
func (b *bench) dispatcherRun(ctx context.Context, rcv *receiver, tag string, n, c, replicas int, profile string, profSecs ...int) (tpRun, error, error) {
	var run tpRun
	ns, err := b.namespace(ctx, "tp")
	if err != nil {
		return run, nil, err
	}
	eps := []endpoint{{name: "sink", spec: v1alpha1.WebhookEndpointSpec{URL: rcv.URLWithPath("/sink"), EventTypes: []v1alpha1.EventTypePattern{"order.*"}, MaxInFlight: ptr(int32(c))}}}
	for i, p := range []v1alpha1.EventTypePattern{"invoice.>", "user.created", "refund.*.done", "shipment.>"} {
		eps = append(eps, endpoint{name: fmt.Sprintf("other-%d", i), spec: v1alpha1.WebhookEndpointSpec{URL: rcv.URLWithPath("/other"), EventTypes: []v1alpha1.EventTypePattern{p}}})
	}
	if b.sinkSetup != nil {
		if err := b.sinkSetup(ctx, ns, &eps[0].spec); err != nil {
			return run, nil, err
		}
	}
	if err := b.createEndpoints(ctx, ns, eps); err != nil {
		return run, nil, err
	}
	if err := b.publish(ctx, ns, "order.created", tag, 0, n); err != nil {
		return run, nil, err
	}
	ds, err := b.startReplicas(ns, tag, replicas)
	if err != nil {
		return run, nil, err
	}
	d := ds[0]
	var perr error
	profDone := make(chan struct{})
	if profile != "" {
		go func() {
			defer close(profDone)
			_ = testenv.Poll(time.Minute, func() bool { _, u, _ := rcv.counts(tag); return u > 0 })
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				// Meanwhile, where in-flight deliveries wait: 10 goroutine profiles.
				defer wg.Done()
				b.waits = d.waits(10, time.Duration(profSecs[0])*time.Second/11)
			}()
			if natsProfile := strings.TrimSuffix(profile, "dispatcher-cpu.pprof") + "nats-cpu.pprof"; natsProfile != profile {
				// nats-server's CPU over the same seconds.
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := fetchPprof(b.natsDebug, fmt.Sprintf("profile?seconds=%d", profSecs[0]), natsProfile); err != nil {
						progress("  nats-server profile: %v", err)
					}
				}()
			}
			// The heap allocations over the same seconds: two allocs profiles, the first the base.
			allocs0 := strings.TrimSuffix(profile, "cpu.pprof") + "allocs-base.pprof"
			haveBase := allocs0 != profile && d.fetch("allocs", allocs0) == nil
			perr = d.fetch(fmt.Sprintf("profile?seconds=%d", profSecs[0]), profile)
			if haveBase {
				_ = d.fetch("allocs", strings.TrimSuffix(profile, "cpu.pprof")+"allocs.pprof")
			}
			wg.Wait()
		}()
	} else {
		close(profDone)
	}
	timeout := 2*time.Minute + time.Duration(n)*time.Millisecond
	var stallOnce sync.Once
	sw := watchStalls(rcv, tag, n, func() {
		stallOnce.Do(func() {
			// What the endpoint's consumer and the dispatcher look like during the first stall.
			run.stallNote = fmt.Sprintf("at the first stall the endpoint's consumer on the events stream had %s (MaxAckPending %d)", b.eventsState(ctx, ns, "sink"), c)
			dump := b.rep.file(tag + "-stall-goroutines.txt")
			if d.fetch("goroutine?debug=2", dump) == nil {
				run.stallNote += "; dispatcher goroutines: `" + dump + "`"
			}
		})
	})
	watch := map[string]int{"nats-server": b.nats.pid(), "receiver": os.Getpid()}
	for i, d := range ds {
		watch[fmt.Sprintf("dispatcher-%d", i)] = d.pid()
	}
	// The replicas' allocations from the first delivery on.
	mallocs := func() (sum uint64, ok bool) {
		for _, d := range ds {
			m, err := d.mallocs()
			if err != nil {
				return 0, false
			}
			sum += m
		}
		return sum, true
	}
	var m0 uint64
	var at0 int
	var m0ok bool
	allocStart := make(chan struct{})
	go func() {
		defer close(allocStart)
		_ = testenv.Poll(time.Minute, func() bool { _, u, _ := rcv.counts(tag); return u > 0 })
		m0, m0ok = mallocs()
		_, at0, _ = rcv.counts(tag)
	}()
	win := await(ctx, rcv, tag, n, timeout, watch)
	<-allocStart
	if m1, ok := mallocs(); ok && m0ok {
		if _, at1, _ := rcv.counts(tag); at1 > at0 {
			run.allocs = float64(m1-m0) / float64(at1-at0)
		}
	}
	run.stalls = sw.end()
	<-profDone
	for _, d := range ds {
		if err := d.stop(time.Minute); err != nil {
			progress("  %v", err)
		}
	}
	b.retire(ctx, ns)
	if !win.reached {
		return run, perr, fmt.Errorf("%s: the receiver saw %d of %d deliveries within %s; dispatcher log: %s", tag, win.unique, n, timeout, d.logPath)
	}
	run.rate = win.rate()
	run.dups = win.ok - win.unique
	run.others = win.others
	if win.sampled > 0 {
		var cpu time.Duration
		for i := range ds {
			cpu += win.cpu[fmt.Sprintf("dispatcher-%d", i)]
		}
		run.clientUS = cpu.Seconds() * 1e6 / float64(win.sampled)
		run.natsUS = win.cpu["nats-server"].Seconds() * 1e6 / float64(win.sampled)
		run.recvUS = win.cpu["receiver"].Seconds() * 1e6 / float64(win.sampled)
	}
	rcv.forget(tag)
	return run, perr, nil
}

func sortedByCount(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	return keys
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
