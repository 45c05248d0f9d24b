package harness

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// latency offers events at fixed rates to a dispatcher delivering to a receiver answering
// 200, and measures each event's time from the publish call to its arrival.
func (b *bench) latency(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Latency"}
	rcv, err := newReceiver("latency", nil)
	if err != nil {
		return nil, err
	}
	defer rcv.Close()
	all := map[int][]float64{}
	var rows [][]string
	p99s := map[int][]float64{}
	waits := map[int]map[string]int{}
	for r := range o.Repeat {
		ns, err := b.namespace(ctx, "lat")
		if err != nil {
			return nil, err
		}
		if err := b.createEndpoints(ctx, ns, []endpoint{{name: "sink", spec: v1alpha1.WebhookEndpointSpec{
			URL: rcv.URLWithPath("/sink"), EventTypes: []v1alpha1.EventTypePattern{"lat.>"}}}}); err != nil {
			return nil, err
		}
		d, err := b.startDispatcher(ns)
		if err != nil {
			return nil, err
		}
		warm := fmt.Sprintf("lat%d-warm", r)
		if err := b.publish(ctx, ns, "lat.warm", warm, 0, 200); err != nil {
			d.kill()
			return nil, err
		}
		if w := await(ctx, rcv, warm, 200, time.Minute, nil); !w.reached {
			d.kill()
			return nil, fmt.Errorf("warm-up: %d of 200 delivered; dispatcher log %s", w.unique, d.logPath)
		}
		for _, rate := range o.Rates {
			tag := fmt.Sprintf("lat%d-%d", r, rate)
			progress("latency run %d/%d: %d events/s for %s", r+1, o.Repeat, rate, o.LatencyTime)
			wch := make(chan map[string]int, 1)
			go func() { wch <- d.waits(5, o.LatencyTime/6) }()
			sent, offered, err := b.paced(ctx, ns, "lat.evt", tag, rate, o.LatencyTime)
			for k, v := range <-wch {
				if waits[rate] == nil {
					waits[rate] = map[string]int{}
				}
				waits[rate][k] += v
			}
			if err != nil {
				d.kill()
				return nil, err
			}
			w := await(ctx, rcv, tag, sent, time.Minute, nil)
			recv, pub := rcv.times(tag)
			lat := make([]float64, len(recv))
			for i := range recv {
				lat[i] = float64(recv[i]-pub[i]) / 1e6
			}
			slices.Sort(lat)
			all[rate] = append(all[rate], lat...)
			p99s[rate] = append(p99s[rate], percentile(lat, 99))
			rows = append(rows, []string{strconv.Itoa(rate), strconv.Itoa(r + 1), num(offered), fmt.Sprintf("%d / %d", w.unique, sent),
				ms(percentile(lat, 50)), ms(percentile(lat, 90)), ms(percentile(lat, 99)), ms(percentile(lat, 100))})
			progress("  p50 %s ms, p99 %s ms, max %s ms", ms(percentile(lat, 50)), ms(percentile(lat, 99)), ms(percentile(lat, 100)))
			rcv.forget(tag)
		}
		if err := d.stop(time.Minute); err != nil {
			progress("  %v", err)
		}
		b.retire(ctx, ns)
	}
	s.printf("One endpoint (defaults: `maxInFlight: 50`, timeout 10s, default retry policy), every feature on; a receiver answering 200. Events are published at a fixed rate for %s (asynchronous publishes paced every millisecond); latency runs from the publish call to the request's arrival at the receiver (both clocks are the same machine's). A warm-up of 200 events precedes each run.", o.LatencyTime)
	s.table([]string{"offered /s", "run", "achieved /s", "received / published", "p50 ms", "p90 ms", "p99 ms", "max ms"}, rows)
	var sum [][]string
	for _, rate := range o.Rates {
		lat := all[rate]
		slices.Sort(lat)
		sum = append(sum, []string{strconv.Itoa(rate), strconv.Itoa(len(lat)), ms(percentile(lat, 50)), ms(percentile(lat, 90)), ms(percentile(lat, 99)), ms(percentile(lat, 100)), ms(median(p99s[rate]))})
	}
	s.printf("All runs together:")
	s.table([]string{"offered /s", "deliveries", "p50 ms", "p90 ms", "p99 ms", "max ms", "median of the runs' p99"}, sum)
	if p, ok := p99s[1000]; ok {
		s.printf("Goal (issue 4): p99 < 10 ms at 1,000 events/s: %s (median p99 of the runs %s ms).", goal(median(p) < 10), ms(median(p)))
		b.rep.goal(s, median(p) < 5, "issue 32", "p99 publish → receipt under 5 ms at 1,000 events/s: %%GOAL%% (median of the runs' p99 %s ms).", ms(median(p)))
	}
	if p, ok := p99s[5000]; ok {
		per := make([]string, len(p))
		for i, v := range p {
			per[i] = ms(v)
		}
		b.rep.goal(s, median(p) < 10, "issue 14", "p99 publish → receipt under 10 ms at 5,000 events/s: %%GOAL%% (median of the runs' p99 %s ms; per run %s ms).", ms(median(p)), strings.Join(per, ", "))
	}
	for _, rate := range o.Rates {
		s.printf("Where in-flight deliveries were at %d events/s (goroutines under `worker.runMsg`, 5 samples per run):", rate)
		waitTable(s, waits[rate], 5*o.Repeat)
	}
	png := b.rep.file("latency.png")
	series := map[string][]float64{}
	for rate, lat := range all {
		series[fmt.Sprintf("%d events/s", rate)] = lat
	}
	if err := latencyPNG(png, series); err != nil {
		s.printf("(latency picture failed: %v)", err)
	} else {
		s.printf("")
		s.printf("Distribution (CDF, log scale): `%s`", png)
	}
	return s, nil
}

// paced publishes events at rate per second for d, each stamped with its publish time. It
// returns how many it published and the rate achieved.
func (b *bench) paced(ctx context.Context, ns, eventType, tag string, rate int, d time.Duration) (int, float64, error) {
	subject := b.cfg.Streams.For(ns).EventSubject(eventType)
	total := int(float64(rate) * d.Seconds())
	futures := make([]jetstream.PubAckFuture, 0, total)
	start := time.Now()
	for i := 0; i < total; {
		due := min(total, int(time.Since(start).Seconds()*float64(rate))+1)
		for ; i < due; i++ {
			m := nats.NewMsg(subject)
			m.Header.Set(records.HeaderMsgID, fmt.Sprintf("%s-%d", tag, i))
			m.Data = eventBody(tag, i, time.Now())
			f, err := b.js.PublishMsgAsync(m)
			if err != nil {
				return i, 0, err
			}
			futures = append(futures, f)
		}
		next := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
		if wait := time.Until(next); wait > 0 {
			time.Sleep(min(wait, time.Millisecond))
		}
	}
	achieved := float64(total) / time.Since(start).Seconds()
	return total, achieved, waitFutures(ctx, futures)
}
