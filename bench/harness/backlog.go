package harness

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// backlog puts o.Backlog deliveries of one endpoint on a 24h retry, and measures new
// deliveries on that endpoint and on another one of the same dispatcher, before and after.
func (b *bench) backlog(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Retry backlog"}
	same, err := newReceiver("bl-same", func(tag string) int {
		if strings.HasPrefix(tag, "old") {
			return 500
		}
		return 200
	})
	if err != nil {
		return nil, err
	}
	defer same.Close()
	other, err := newReceiver("bl-other", nil)
	if err != nil {
		return nil, err
	}
	defer other.Close()
	const inFlight = 100
	ns, err := b.namespace(ctx, "backlog")
	if err != nil {
		return nil, err
	}
	if err := b.retryPolicy(ctx, ns, "late", v1alpha1.RetryPolicySpec{
		Schedule:       []metav1.Duration{{Duration: 0}, {Duration: 24 * time.Hour}},
		CircuitBreaker: &v1alpha1.CircuitBreakerSpec{ConsecutiveFailures: 0},
	}); err != nil {
		return nil, err
	}
	if err := b.createEndpoints(ctx, ns, []endpoint{
		{name: "same", spec: v1alpha1.WebhookEndpointSpec{URL: same.URLWithPath("/same"), EventTypes: []v1alpha1.EventTypePattern{">"},
			RetryPolicyRef: &v1alpha1.LocalObjectReference{Name: "late"}, MaxInFlight: ptr(int32(inFlight))}},
		{name: "other", spec: v1alpha1.WebhookEndpointSpec{URL: other.URLWithPath("/other"), EventTypes: []v1alpha1.EventTypePattern{"new.>"}, MaxInFlight: ptr(int32(inFlight))}},
	}); err != nil {
		return nil, err
	}
	d, err := b.startDispatcher(ns)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := d.stop(time.Minute); err != nil {
			progress("  %v", err)
		}
		b.retire(ctx, ns)
	}()
	if err := b.publish(ctx, ns, "new.warm", "new-warm", 0, 100); err != nil {
		return nil, err
	}
	if w := await(ctx, other, "new-warm", 100, time.Minute, nil); !w.reached {
		return nil, fmt.Errorf("warm-up: %d of 100 delivered; dispatcher log %s", w.unique, d.logPath)
	}

	type batchResult struct {
		label             string
		sameRate, otherRt float64
		ackPending        int
		natsUS, dispUS    float64
		others            float64
	}
	var batches []batchResult
	var stallNotes []string
	// When each receiver took what, for the picture.
	const (
		sameNew, otherNew, sameOld = "same: new events delivered", "other: new events delivered", "same: the backlog's failing first attempts"
	)
	t0 := time.Now()
	arrivals := map[string][]int64{}
	batch := func(label string) error {
		tag := "new-" + label
		progress("backlog: batch %s, %d new events to both endpoints", label, o.BacklogNew)
		if err := b.publish(ctx, ns, "new.evt", tag, 0, o.BacklogNew); err != nil {
			return err
		}
		var ws [2]window
		var wg sync.WaitGroup
		maxAck := 0
		stop, sampled := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				if ci := b.consumerInfo(ctx, ns, "same"); ci != nil {
					maxAck = max(maxAck, ci.NumAckPending)
				}
			}
		}()
		// A pause of 5s or more on the other endpoint: record what both endpoints'
		// consumers and the dispatcher's goroutines look like, once per batch.
		var stallOnce sync.Once
		var stallNote string
		sw := watchStalls(other, tag, o.BacklogNew, func() {
			stallOnce.Do(func() {
				stallNote = fmt.Sprintf("same: events %s, deliveries %s; other: events %s, deliveries %s", b.eventsState(ctx, ns, "same"), fmtConsumer(b.consumerInfo(ctx, ns, "same")), b.eventsState(ctx, ns, "other"), fmtConsumer(b.consumerInfo(ctx, ns, "other")))
				dump := b.rep.file(tag + "-stall-goroutines.txt")
				if d.fetch("goroutine?debug=2", dump) == nil {
					stallNote += "; dispatcher goroutines: `" + dump + "`"
				}
			})
		})
		for i, r := range []*receiver{same, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var watch map[string]int
				if i == 0 {
					watch = map[string]int{"nats-server": b.nats.pid(), "dispatcher": d.pid()}
				}
				ws[i] = await(ctx, r, tag, o.BacklogNew, 3*time.Minute+time.Duration(o.BacklogNew)*time.Millisecond, watch)
			}()
		}
		wg.Wait()
		stalls := sw.end()
		close(stop)
		<-sampled
		if len(stalls) > 0 {
			var tot time.Duration
			for _, st := range stalls {
				tot += st
			}
			stallNotes = append(stallNotes, fmt.Sprintf("%s: %d pause(s) of 5s or more without a delivery to `other` (%.0fs in all); at the first, %s", label, len(stalls), tot.Seconds(), stallNote))
		}
		if !ws[0].reached || !ws[1].reached {
			return fmt.Errorf("batch %s: %d and %d of %d delivered; dispatcher log %s", label, ws[0].unique, ws[1].unique, o.BacklogNew, d.logPath)
		}
		// Both endpoints deliver each event: CPU per delivery counts the two.
		per := func(name string) float64 {
			return ws[0].cpu[name].Seconds() * 1e6 / float64(max(1, 2*ws[0].sampled))
		}
		batches = append(batches, batchResult{label: label, sameRate: ws[0].rate(), otherRt: ws[1].rate(), ackPending: maxAck,
			natsUS: per("nats-server"), dispUS: per("dispatcher"), others: ws[0].others})
		progress("  same %s/s, other %s/s", num(ws[0].rate()), num(ws[1].rate()))
		sameRecv, _ := same.times(tag)
		otherRecv, _ := other.times(tag)
		arrivals[sameNew] = append(arrivals[sameNew], sameRecv...)
		arrivals[otherNew] = append(arrivals[otherNew], otherRecv...)
		same.forget(tag)
		other.forget(tag)
		return nil
	}
	for i := range max(2, o.Repeat) {
		if err := batch(fmt.Sprintf("before-%d", i+1)); err != nil {
			return nil, err
		}
	}

	progress("backlog: building %d deliveries waiting for a 24h retry", o.Backlog)
	start := time.Now()
	if err := b.publish(ctx, ns, "old.evt", "old", 0, o.Backlog); err != nil {
		return nil, err
	}
	published := time.Since(start)
	buildWaits := make(chan map[string]int, 1)
	go func() { buildWaits <- d.waits(10, 500*time.Millisecond) }()
	buildTimeout := 3*time.Minute + time.Duration(o.Backlog)*5*time.Millisecond
	built := testenv.Poll(buildTimeout, func() bool { _, _, f := same.counts("old"); return f >= o.Backlog }) == nil
	_, _, failed := same.counts("old")
	attempted := time.Since(start)
	settled := testenv.Poll(2*time.Minute, func() bool {
		ci := b.consumerInfo(ctx, ns, "same")
		return ci != nil && ci.NumPending == 0 && ci.NumAckPending == 0
	}) == nil
	buildTime := time.Since(start)
	var scheduled uint64
	if st, err := b.js.Stream(ctx, b.cfg.Streams.For(ns).DeliveriesStream()); err == nil {
		if info, err := st.Info(ctx); err == nil {
			scheduled = info.State.Msgs
		}
	}
	ci := b.consumerInfo(ctx, ns, "same")
	waits := <-buildWaits
	n0, _ := sampleProc(b.nats.pid())
	d0, _ := sampleProc(d.pid())
	time.Sleep(5 * time.Second)
	n1, _ := sampleProc(b.nats.pid())
	d1, _ := sampleProc(d.pid())
	mem, _ := d.stats()
	ps, _ := sampleProc(d.pid())
	progress("  %d first attempts failed in %s; %d messages wait in the deliveries stream", failed, buildTime.Round(time.Second), scheduled)

	for i := range max(2, o.Repeat) {
		if err := batch(fmt.Sprintf("after-%d", i+1)); err != nil {
			return nil, err
		}
	}

	var rows [][]string
	var sb, ob, sa, oa []float64
	for _, x := range batches {
		rows = append(rows, []string{x.label, num(x.sameRate), num(x.otherRt), fmt.Sprint(x.ackPending), fmt.Sprintf("%.1f", x.natsUS), fmt.Sprintf("%.1f", x.dispUS), fmt.Sprintf("%.2f", x.others)})
		if strings.HasPrefix(x.label, "before") {
			sb, ob = append(sb, x.sameRate), append(ob, x.otherRt)
		} else {
			sa, oa = append(sa, x.sameRate), append(oa, x.otherRt)
		}
	}
	s.printf("One dispatcher with two endpoints (`maxInFlight: %d` each). `same` subscribes to `>` with a RetryPolicy `schedule: [0s, 24h]` (circuit breaker off), and its receiver answers 500 to the backlog's events and 200 to new ones; `other` subscribes to `new.>`. Batches of %d new events go to both endpoints, before and after %d events whose first attempt at `same` fails, so each waits for its 24h retry.", inFlight, o.BacklogNew, o.Backlog)
	s.printf("")
	s.printf("- building the backlog: %d events published in %s; %d first attempts failed within %s (%s/s)%s; the endpoint's consumer drained (nothing pending or unacknowledged: %v) after %s.",
		o.Backlog, published.Round(time.Millisecond), failed, attempted.Round(time.Millisecond), num(float64(failed)/attempted.Seconds()), map[bool]string{true: "", false: " — **incomplete within " + buildTimeout.String() + "**"}[built], settled, buildTime.Round(time.Millisecond))
	if ci != nil {
		s.printf("- with the backlog in place: the deliveries stream holds %d messages (the scheduled retries); `same`'s consumer has %d pending, %d unacknowledged (MaxAckPending %d); dispatcher RSS %s, live heap %s, %d goroutines.",
			scheduled, ci.NumPending, ci.NumAckPending, inFlight, mib(ps.RSS), mib(int64(mem.HeapAlloc)), mem.Goroutines)
	}
	s.printf("- idle with the backlog in place (5s, nothing delivered): nats-server %.3f cores, dispatcher %.3f cores.", (n1.CPU-n0.CPU).Seconds()/5, (d1.CPU-d0.CPU).Seconds()/5)
	s.table([]string{"batch", "same endpoint /s", "other endpoint /s", "max unacknowledged on `same` during the batch", "nats-server µs per delivery", "dispatcher µs per delivery", "other users' CPU (cores)"}, rows)
	s.printf("Rate of new deliveries with the backlog, as a ratio to before it (medians): same endpoint %s, other endpoint %s.", ratio(median(sa)/median(sb)), ratio(median(oa)/median(ob)))
	for _, n := range stallNotes {
		s.printf("- stall, %s.", n)
	}
	arrivals[sameOld] = same.failures("old")
	// Whole seconds, or tenths for a short (-quick) run.
	step := time.Second
	if time.Since(t0) < time.Minute {
		step = 100 * time.Millisecond
	}
	timeline := map[string][]float64{}
	for name, ts := range arrivals {
		timeline[name] = countPer(nil, t0, step, ts)
	}
	png := b.rep.file("backlog.png")
	if err := ratePNG(png, "webhook-operator: requests per second through the retry backlog scenario", "seconds since the first batch", "requests received per second", step, timeline); err != nil {
		s.printf("(backlog picture failed: %v)", err)
	} else {
		s.printf("Picture (batches before the backlog, its failing first attempts, batches after): `%s`", png)
	}
	s.printf("")
	s.printf("While the backlog was being built (failing first attempts, each scheduled for 24h), where in-flight deliveries were:")
	waitTable(s, waits, 10)
	return s, nil
}

// consumerInfo reads an endpoint consumer's state.
func (b *bench) consumerInfo(ctx context.Context, ns, ep string) *consumerState {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	set := b.cfg.Streams.For(ns)
	c, err := b.js.Consumer(ictx, set.DeliveriesStream(), set.EndpointConsumer(ep))
	if streams.IsNotFound(err) {
		c, err = b.js.Consumer(ictx, set.DeliveriesStream(), set.QueueConsumer()) // the shared lane
	}
	if err != nil {
		return nil
	}
	info := c.CachedInfo()
	return &consumerState{NumPending: info.NumPending, NumAckPending: info.NumAckPending, NumWaiting: info.NumWaiting}
}

// eventsState describes an endpoint's consumer on the events stream, for stall reports.
func (b *bench) eventsState(ctx context.Context, ns, ep string) string {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	set := b.cfg.Streams.For(ns)
	c, err := b.js.Consumer(ictx, set.EventsStream(), set.EndpointConsumer(ep))
	if streams.IsNotFound(err) {
		c, err = b.js.Consumer(ictx, set.EventsStream(), streams.IntakeConsumer(ns)) // the shared lane
	}
	if err != nil {
		return err.Error()
	}
	i := c.CachedInfo()
	return fmt.Sprintf("%d unacknowledged, %d pending, %d waiting pulls, %d redelivered", i.NumAckPending, i.NumPending, i.NumWaiting, i.NumRedelivered)
}

func fmtConsumer(c *consumerState) string {
	if c == nil {
		return "unknown"
	}
	return fmt.Sprintf("%d unacknowledged, %d pending, %d waiting pulls", c.NumAckPending, c.NumPending, c.NumWaiting)
}

type consumerState struct {
	NumPending    uint64
	NumAckPending int
	NumWaiting    int
}
