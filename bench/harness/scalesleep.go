package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// sleepFigures are what the shared dispatcher's sleeping namespaces measured.
type sleepFigures struct {
	// asleep and awake are the namespaces the shared dispatcher's replicas counted when the
	// quiet window began (webhook_shared_dispatcher_namespaces, summed over replicas), after
	// waiting after every endpoint was Ready.
	asleep, awake int
	after         time.Duration
	// wakes are the publish → receipt times of one event each to endpoints of sleeping
	// namespaces, one after another.
	wakes []time.Duration
}

// sharedCounts sums webhook_shared_dispatcher_namespaces by state over the shared
// dispatcher's replicas.
func (in *seInstall) sharedCounts(ctx context.Context) (asleep, awake int, err error) {
	urls := in.stack.Runner.MetricsURLs(localstack.OperatorNamespace, names.SharedPool)
	if len(urls) == 0 {
		return 0, 0, fmt.Errorf("no replica of the shared dispatcher serves /metrics")
	}
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return 0, 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, 0, err
		}
		raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		resp.Body.Close()
		if err != nil {
			return 0, 0, err
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := p.TextToMetricFamilies(bytes.NewReader(raw))
		if err != nil {
			return 0, 0, err
		}
		if mf := mfs["webhook_shared_dispatcher_namespaces"]; mf != nil {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					switch {
					case l.GetName() == "state" && l.GetValue() == "asleep":
						asleep += int(m.GetGauge().GetValue())
					case l.GetName() == "state" && l.GetValue() == "awake":
						awake += int(m.GetGauge().GetValue())
					}
				}
			}
		}
	}
	return asleep, awake, nil
}

// untilAsleep waits, with the shared dispatcher and sleeping namespaces, until every namespace
// it serves sleeps (or three idle times and two minutes passed), so that the quiet window
// measures sleeping namespaces.
func (in *seInstall) untilAsleep(ctx context.Context, res *seResult) error {
	if !in.c.Shared || in.c.IdleAfter <= 0 {
		return nil
	}
	progress("  waiting for the namespaces to sleep (idle after %s)", in.c.IdleAfter)
	start := time.Now()
	deadline := start.Add(3*in.c.IdleAfter + 2*time.Minute)
	for {
		asleep, awake, err := in.sharedCounts(ctx)
		if err == nil {
			res.sleep.asleep, res.sleep.awake, res.sleep.after = asleep, awake, time.Since(start)
			if awake == 0 && asleep > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			progress("  %d namespaces asleep and %d awake after %s (%v)", res.sleep.asleep, res.sleep.awake, secs(time.Since(start)), err)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	progress("  %d namespaces asleep after %s", res.sleep.asleep, secs(res.sleep.after))
	return nil
}

// wakeLatency sends one event each to an idle endpoint of up to five sleeping namespaces, one
// after another, and times each from publish to receipt.
func (in *seInstall) wakeLatency(ctx context.Context, res *seResult) error {
	if !in.c.Shared || in.c.IdleAfter <= 0 || res.sleep.asleep == 0 {
		return nil
	}
	var picked []seEndpoint
	for _, ep := range in.eps {
		if ep.class == seIdle && ep.ns != "se-ref" && !slices.ContainsFunc(picked, func(p seEndpoint) bool { return p.ns == ep.ns }) {
			picked = append(picked, ep)
		}
		if len(picked) == 5 {
			break
		}
	}
	const tag = "wake"
	for i, ep := range picked {
		m := nats.NewMsg(streams.DefaultConfig().For(ep.ns).EventSubject(ep.name + ".wake"))
		m.Header.Set(records.HeaderMsgID, fmt.Sprintf("wake-%d", i))
		sent := time.Now()
		m.Data = eventBody(tag, i, sent)
		if _, err := in.js.PublishMsg(ctx, m); err != nil {
			return err
		}
		for {
			if ok, _, _ := in.ok.counts(tag); ok > i {
				break
			}
			if time.Since(sent) > 2*time.Minute {
				return fmt.Errorf("the event to sleeping namespace %s was not delivered within 2 minutes", ep.ns)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		recv, sentAt := in.ok.times(tag)
		res.sleep.wakes = append(res.sleep.wakes, time.Duration(recv[len(recv)-1]-sentAt[len(sentAt)-1]))
	}
	in.ok.forget(tag)
	progress("  first event after sleeping: %v", res.sleep.wakes)
	return nil
}
