package harness

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// replicas measures how one namespace's work spreads over replicas of its dispatcher: with
// three replicas, how many deliveries and events each took and the CPU each used, for a
// best-effort endpoint (every replica pulls from its consumers) and for PerKey endpoints (each
// is delivered by the replica holding its partition); and, in the same run, the throughput of
// two replicas beside one.
func (b *bench) replicas(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Replicas"}
	rcv, err := newReceiver("replicas", nil)
	if err != nil {
		return nil, err
	}
	defer rcv.Close()

	// The split among three replicas.
	const nReplicas, nOrdered = 3, 12
	n := o.Events
	ns, err := b.namespace(ctx, "rep")
	if err != nil {
		return nil, err
	}
	eps := []endpoint{{name: "sink", spec: v1alpha1.WebhookEndpointSpec{URL: rcv.URLWithPath("/sink"), EventTypes: []v1alpha1.EventTypePattern{"be.*"}, MaxInFlight: ptr(int32(o.InFlight))}}}
	for i := range nOrdered {
		eps = append(eps, endpoint{name: fmt.Sprintf("ordered-%02d", i), spec: v1alpha1.WebhookEndpointSpec{URL: rcv.URLWithPath("/ordered"),
			EventTypes: []v1alpha1.EventTypePattern{v1alpha1.EventTypePattern(fmt.Sprintf("pk.%02d", i))}, MaxInFlight: ptr(int32(64)),
			Ordering: &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{JSONField: "i"}}}})
	}
	if err := b.createEndpoints(ctx, ns, eps); err != nil {
		return nil, err
	}
	progress("replicas: %d events to a best-effort endpoint and %d to %d PerKey endpoints, %d replicas", n, n, nOrdered, nReplicas)
	if err := b.publish(ctx, ns, "be.evt", "rep-be", 0, n); err != nil {
		return nil, err
	}
	per := n / nOrdered
	for i := range nOrdered {
		if err := b.publish(ctx, ns, fmt.Sprintf("pk.%02d", i), "rep-pk", i*per, per); err != nil {
			return nil, err
		}
	}
	ds, err := b.startReplicas(ns, "rep", nReplicas)
	if err != nil {
		return nil, err
	}
	cpu0 := make([]time.Duration, len(ds))
	for i, d := range ds {
		ps, _ := sampleProc(d.pid())
		cpu0[i] = ps.CPU
	}
	timeout := 3*time.Minute + time.Duration(2*n)*time.Millisecond
	wb := await(ctx, rcv, "rep-be", n, timeout, nil)
	wp := await(ctx, rcv, "rep-pk", per*nOrdered, timeout, nil)
	type split struct{ be, pk, events, cpu float64 }
	splits := make([]split, len(ds))
	var tot split
	for i, d := range ds {
		ps, _ := sampleProc(d.pid())
		m, err := d.metrics()
		if err != nil {
			return nil, err
		}
		sp := split{cpu: (ps.CPU - cpu0[i]).Seconds(), events: m.sum("webhook_events_routed_total", nil)}
		sp.be = m.sum("webhook_deliveries_total", map[string]string{"endpoint": "sink", "outcome": "succeeded"})
		sp.pk = m.sum("webhook_deliveries_total", map[string]string{"outcome": "succeeded"}) - sp.be
		splits[i] = sp
		tot.be, tot.pk, tot.events, tot.cpu = tot.be+sp.be, tot.pk+sp.pk, tot.events+sp.events, tot.cpu+sp.cpu
	}
	for _, d := range ds {
		if err := d.stop(time.Minute); err != nil {
			progress("  %v", err)
		}
	}
	b.retire(ctx, ns)
	if !wb.reached || !wp.reached {
		return nil, fmt.Errorf("replicas: delivered %d of %d best-effort and %d of %d PerKey events", wb.unique, n, wp.unique, per*nOrdered)
	}
	share := func(v, of float64) string {
		if of == 0 {
			return "–"
		}
		return fmt.Sprintf("%.0f (%.0f%%)", v, 100*v/of)
	}
	var rows [][]string
	third := true
	var shares []string
	for i, sp := range splits {
		all := (sp.be + sp.pk) / (tot.be + tot.pk)
		third = third && all >= 0.25 && all <= 0.42
		shares = append(shares, fmt.Sprintf("%.0f%%", 100*all))
		rows = append(rows, []string{fmt.Sprintf("rep-%d", i), share(sp.be, tot.be), share(sp.pk, tot.pk), share(sp.be+sp.pk, tot.be+tot.pk),
			share(sp.events, tot.events), fmt.Sprintf("%.1f s (%.0f%%)", sp.cpu, 100*sp.cpu/tot.cpu)})
	}
	s.printf("One namespace, %d replicas of its dispatcher (%d partitions): a best-effort endpoint with %d events waiting (`maxInFlight: %d`; every replica pulls from its consumers) and %d PerKey endpoints with %d events each (each delivered by the replica that holds its partition). Started together once everything was published; counts are each replica's own metrics (`webhook_deliveries_total`, `webhook_events_routed_total`: events it took from the events stream), CPU is its process's, until the last delivery arrived.",
		nReplicas, 12, n, o.InFlight, nOrdered, per)
	s.table([]string{"replica", "best-effort deliveries", "PerKey deliveries", "all deliveries", "events taken", "CPU"}, rows)
	b.rep.goal(s, third, "issue 14", "with 3 replicas each does about a third of the work (a share of all deliveries between 25%% and 42%%): %%GOAL%% (shares %s).", strings.Join(shares, ", "))

	// One replica beside two, same run.
	var r1, r2, rs []float64
	for r := range o.Repeat {
		for k := range 2 {
			reps := 1 + (k+r)%2 // alternate which goes first
			progress("replicas: run %d/%d, %d replica(s), %d events", r+1, o.Repeat, reps, n)
			run, _, err := b.dispatcherRun(ctx, rcv, fmt.Sprintf("rep%d-%d", r, reps), n, o.InFlight, reps, "")
			if err != nil {
				return nil, err
			}
			progress("  %s/s", num(run.rate))
			if reps == 1 {
				r1 = append(r1, run.rate)
			} else {
				r2 = append(r2, run.rate)
			}
		}
		rs = append(rs, r2[len(r2)-1]/r1[len(r1)-1])
	}
	s.printf("")
	s.printf("The throughput scenario's dispatcher (%d events, `maxInFlight: %d`) with one replica and with two, in turns, %d runs (each run starting with a different one); ratio is two replicas to one in the same run. On two cores the replicas share the CPU with nats-server and the receiver, so two cannot be much faster: the point is that they are not slower.", n, o.InFlight, o.Repeat)
	s.table([]string{"replicas", "runs (deliveries/s)", "median /s"}, [][]string{{"1", nums(r1), num(median(r1))}, {"2", nums(r2), num(median(r2))}})
	b.rep.goal(s, median(rs) >= 0.95, "issue 14", "2 replicas not slower than 1 on this machine (ratio at least 0.95, the noise of one run): %%GOAL%% (median ratio %s; per run %s).", ratio(median(rs)), strings.Join(ratioList(rs), ", "))
	return s, nil
}

func ratioList(v []float64) []string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = ratio(x)
	}
	return out
}

// promMetrics are a process's Prometheus metrics.
type promMetrics map[string]*dto.MetricFamily

// metrics reads the dispatcher's /metrics.
func (d *dispatcherProc) metrics() (promMetrics, error) {
	resp, err := http.Get("http://" + d.debug + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// sum adds up a counter's series whose labels include match.
func (m promMetrics) sum(name string, match map[string]string) float64 {
	f := m[name]
	if f == nil {
		return 0
	}
	total := 0.0
	for _, s := range f.GetMetric() {
		ok := true
		for k, v := range match {
			found := false
			for _, l := range s.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			ok = ok && found
		}
		if ok {
			total += s.GetCounter().GetValue()
		}
	}
	return total
}
