package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
	"github.com/webhook-operator/webhook-operator/test/monitoring"
)

// TestDashboardAndAlertMetricsExist checks that every metric the chart's Grafana dashboard
// and PrometheusRule read is served by the real controller or a real dispatcher: after a
// delivery and a dead letter (so that every vector has series), it scrapes the controller's
// and the namespace's dispatcher's /metrics and looks up each query's metrics, apart from
// monitoring.External (kube-state-metrics, Prometheus' own up).
func TestDashboardAndAlertMetricsExist(t *testing.T) {
	queries := monitoring.Queries(t)
	used := map[string][]string{} // metric -> where it is read
	for _, q := range queries {
		e, err := monitoring.Parse(q)
		if err != nil {
			t.Fatal(err)
		}
		names, err := monitoring.MetricNames(e)
		if err != nil {
			t.Fatalf("%s: %v", q.Where, err)
		}
		for _, n := range names {
			used[n] = append(used[n], q.Where)
		}
	}

	u := newUser(t, "e2e-metrics")
	ok, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: testenv.SecretKey(stack.Client, u.ns, "ok-signing", "secret")})
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close()
	bad, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: testenv.SecretKey(stack.Client, u.ns, "bad-signing", "secret")})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	bad.SetResponder(testenv.Failing)
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: once}
spec:
  schedule: [0s]
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: ok}
spec:
  url: %s
  eventTypes: [metric.*]
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: bad}
spec:
  url: %s
  eventTypes: [metric.*]
  retryPolicyRef: {name: once}
`, ok.URL(), bad.URL()))
	u.waitReady("ok", "bad")
	u.publish("metric.tick", "metric_evt_1", `{"n":1}`)
	receive(t, ok, "metric_evt_1")
	testenv.Eventually(t, 60*time.Second, func() error {
		var p page[deadLetter]
		u.json(&p, "kubectl", "webhooks", "dlq", "list", "bad")
		if len(p.Data) == 0 {
			return fmt.Errorf("no dead letter of bad yet")
		}
		return nil
	}, "")

	var missing []string
	testenv.Eventually(t, 60*time.Second, func() error {
		urls := append([]string{stack.ControllerMetricsURL()}, stack.Runner.MetricsURLs(u.ns, "webhook-dispatcher")...)
		if len(urls) < 2 {
			return fmt.Errorf("no dispatcher replica of %s runs", u.ns)
		}
		served := map[string]bool{}
		missing = missing[:0]
		for i, url := range urls {
			names, err := monitoring.Scrape(url)
			if err != nil {
				return err
			}
			for n := range names {
				served[n] = true
			}
			// What each kind of process must serve itself: both are asked about NATS, and
			// the dashboard's dispatcher panels read the dispatchers' process metrics.
			own := []string{"webhook_nats_connected", "process_cpu_seconds_total", "process_resident_memory_bytes"}
			if i == 0 {
				own = append(own, "controller_runtime_reconcile_errors_total")
			}
			for _, n := range own {
				if !names[n] {
					missing = append(missing, fmt.Sprintf("%s (not served by %s)", n, url))
				}
			}
		}
		for n, where := range used {
			if !served[n] && monitoring.External[n] == "" {
				missing = append(missing, fmt.Sprintf("%s (read by %s)", n, strings.Join(where, ", ")))
			}
		}
		slices.Sort(missing)
		if len(missing) > 0 {
			return fmt.Errorf("not in the /metrics of %v:\n%s", urls, strings.Join(missing, "\n"))
		}
		return nil
	}, "")
	t.Logf("%d metrics read by %d queries: every one is served (or external: %v)", len(used), len(queries), external(used))
}

// external lists the metrics of used that come from elsewhere.
func external(used map[string][]string) []string {
	var out []string
	for n := range used {
		if src := monitoring.External[n]; src != "" {
			out = append(out, n+" from "+src)
		}
	}
	slices.Sort(out)
	return out
}
