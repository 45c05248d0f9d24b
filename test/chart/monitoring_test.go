package chart

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
	"github.com/webhook-operator/webhook-operator/test/docs"
	"github.com/webhook-operator/webhook-operator/test/monitoring"
)

// alertNames are the alerts of the chart's PrometheusRule; each has a section of
// docs/runbooks.md.
var alertNames = []string{
	"WebhookEndpointDisabled", "WebhookCircuitOpen", "WebhookDeadLettersGrowing",
	"WebhookDeliveriesPendingGrowing", "WebhookDispatcherUnavailable", "WebhookNATSUnreachable",
}

// TestMonitoringOffByDefault: neither the dashboard nor the PrometheusRule without asking.
func TestMonitoringOffByDefault(t *testing.T) {
	r := render(t, "")
	if n := len(r.ofKind("ConfigMap")) + len(r.ofKind("PrometheusRule")); n != 0 {
		t.Errorf("rendered %v: no dashboard ConfigMap or PrometheusRule by default", r.kinds())
	}
}

// TestDashboardConfigMap checks the dashboard's ConfigMap: the sidecar's label, namespace and
// annotations from the values, and the dashboard file as it is, valid JSON with the
// variables and panels Grafana needs.
func TestDashboardConfigMap(t *testing.T) {
	r := render(t, "grafana: {dashboards: {enabled: true, namespace: monitoring, annotations: {grafana_folder: Webhooks}}}")
	var cm corev1.ConfigMap
	typed(t, r.must(t, "ConfigMap", "webhook-operator-dashboard"), &cm)
	if cm.Namespace != "monitoring" || cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "Webhooks" {
		t.Errorf("ConfigMap namespace %q labels %v annotations %v", cm.Namespace, cm.Labels, cm.Annotations)
	}
	file, err := os.ReadFile(filepath.Join(chartDir(), "dashboards", "webhook-operator.json"))
	if err != nil {
		t.Fatal(err)
	}
	got := cm.Data["webhook-operator.json"]
	if len(cm.Data) != 1 || got != strings.TrimRight(string(file), "\n") {
		t.Fatalf("the ConfigMap's data is not dashboards/webhook-operator.json as it is (keys %v)", keys(cm.Data))
	}
	if !json.Valid([]byte(got)) {
		t.Fatal("the dashboard in the ConfigMap is not valid JSON")
	}
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct{ Name, Type string } `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID      int                      `json:"id"`
			Type    string                   `json:"type"`
			Title   string                   `json:"title"`
			GridPos struct{ X, Y, W, H int } `json:"gridPos"`
			Targets []struct {
				Expr       string `json:"expr"`
				Datasource struct {
					UID string `json:"uid"`
				} `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(got), &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q", d.UID, d.Title)
	}
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name+":"+v.Type)
	}
	if !slices.Equal(vars, []string{"datasource:datasource", "namespace:query", "endpoint:query"}) {
		t.Errorf("variables %v: want the data source, then namespace and endpoint", vars)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q is outside Grafana's 24 columns: %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if q.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q queries data source %q, not the dashboard's ${datasource}", p.Title, q.Datasource.UID)
			}
		}
	}
	// What the issue asks the dashboard to show, by the metric each reads.
	for _, m := range []string{"webhook_deliveries_total", "webhook_attempt_duration_seconds_bucket", "webhook_circuit_state",
		"webhook_endpoint_disabled", "webhook_consumer_pending", "webhook_dead_letters_total", "process_cpu_seconds_total",
		"process_resident_memory_bytes", "controller_runtime_reconcile_errors_total"} {
		if !strings.Contains(got, m) {
			t.Errorf("no panel reads %s", m)
		}
	}
}

// TestPrometheusRule checks the alerts the values ask for: names, thresholds, labels,
// severities and a runbook_url that points at a section of docs/runbooks.md.
func TestPrometheusRule(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		rule := render(t, "prometheusRule: {enabled: true}").must(t, "PrometheusRule", "webhook-operator")
		alerts := ruleAlerts(t, rule)
		if got := slices.Collect(maps.Keys(alerts)); !sameSet(got, alertNames) {
			t.Errorf("alerts %v, want %v", got, alertNames)
		}
		runbooks := runbookAnchors(t)
		for name, a := range alerts {
			want := "https://github.com/webhook-operator/webhook-operator/blob/main/docs/runbooks.md#" + strings.ToLower(name)
			if a.Annotations["runbook_url"] != want {
				t.Errorf("%s runbook_url %q, want %q", name, a.Annotations["runbook_url"], want)
			}
			if !runbooks[strings.ToLower(name)] {
				t.Errorf("docs/runbooks.md has no section %q for %s", name, name)
			}
			if a.Labels["severity"] == "" || a.Annotations["summary"] == "" || a.Annotations["description"] == "" {
				t.Errorf("%s: labels %v annotations %v", name, a.Labels, a.Annotations)
			}
		}
		for name, want := range map[string]string{
			"WebhookCircuitOpen":              "15m",
			"WebhookDeliveriesPendingGrowing": "15m",
			"WebhookDispatcherUnavailable":    "5m",
			"WebhookNATSUnreachable":          "2m",
		} {
			if alerts[name].For != want {
				t.Errorf("%s for %q, want %q", name, alerts[name].For, want)
			}
		}
		if e := alerts["WebhookDeliveriesPendingGrowing"].Expr; !strings.Contains(e, "> 1000") || !strings.Contains(e, "[30m]") {
			t.Errorf("pending alert %q: want the default threshold 1000 over 30m", e)
		}
	})

	t.Run("non-default", func(t *testing.T) {
		rule := render(t, nonDefaultValues).must(t, "PrometheusRule", "webhook-operator")
		if rule.GetLabels()["release"] != "prometheus" || rule.GetNamespace() != releaseNamespace {
			t.Errorf("PrometheusRule %s/%s labels %v", rule.GetNamespace(), rule.GetName(), rule.GetLabels())
		}
		alerts := ruleAlerts(t, rule)
		if _, ok := alerts["WebhookDispatcherUnavailable"]; ok || len(alerts) != len(alertNames)-1 {
			t.Errorf("alerts %v: want every one but the disabled WebhookDispatcherUnavailable", slices.Collect(maps.Keys(alerts)))
		}
		for name, a := range alerts {
			if a.Labels["team"] != "platform" {
				t.Errorf("%s labels %v: want alertLabels", name, a.Labels)
			}
			if want := "https://runbooks.example.com/webhooks.md#" + strings.ToLower(name); a.Annotations["runbook_url"] != want {
				t.Errorf("%s runbook_url %q, want %q", name, a.Annotations["runbook_url"], want)
			}
		}
		if a := alerts["WebhookEndpointDisabled"]; a.For != "1m" || a.Labels["severity"] != "page" {
			t.Errorf("WebhookEndpointDisabled for %q severity %q", a.For, a.Labels["severity"])
		}
		if a := alerts["WebhookCircuitOpen"]; a.For != "30m" || !strings.Contains(a.Annotations["summary"], "30m") {
			t.Errorf("WebhookCircuitOpen for %q summary %q", a.For, a.Annotations["summary"])
		}
		if e := alerts["WebhookDeadLettersGrowing"].Expr; !strings.Contains(e, "[1h]") || !strings.HasSuffix(e, "> 10") {
			t.Errorf("dead-letter alert %q: want window 1h, threshold 10", e)
		}
		if a := alerts["WebhookDeliveriesPendingGrowing"]; !strings.Contains(a.Expr, "> 5000") || !strings.Contains(a.Expr, "[2h]") || a.For != "20m" {
			t.Errorf("pending alert %q for %q: want threshold 5000, window 2h, for 20m", a.Expr, a.For)
		}
	})
}

// TestMonitoringQueriesParse parses every query of the rendered dashboard and PrometheusRule
// with the Prometheus query parser, and checks that each reads at least one metric.
// test/e2e checks that those metrics exist in the real processes' /metrics.
func TestMonitoringQueriesParse(t *testing.T) {
	queries := monitoring.Queries(t)
	for _, q := range queries {
		e, err := monitoring.Parse(q)
		if err != nil {
			t.Error(err)
			continue
		}
		names, err := monitoring.MetricNames(e)
		if err != nil || len(names) == 0 {
			t.Errorf("%s: metrics %v, %v", q.Where, names, err)
		}
	}
	t.Logf("%d queries parsed", len(queries))
}

// alert is one rule of the PrometheusRule.
type alert struct {
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// ruleAlerts returns the PrometheusRule's alerts by name.
func ruleAlerts(t *testing.T, rule *unstructured.Unstructured) map[string]alert {
	t.Helper()
	var spec struct {
		Groups []struct {
			Rules []struct {
				Alert string `json:"alert"`
				alert
			} `json:"rules"`
		} `json:"groups"`
	}
	b, _ := json.Marshal(rule.Object["spec"])
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	out := map[string]alert{}
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			if _, dup := out[r.Alert]; dup || r.Alert == "" {
				t.Errorf("alert %q twice or unnamed", r.Alert)
			}
			out[r.Alert] = r.alert
		}
	}
	return out
}

// runbookAnchors returns the anchors of docs/runbooks.md's headings, as GitHub makes them.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.Root(), "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	return docs.Anchors(string(b))
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
