package cluster

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// chartAlert is one alerting rule of the chart's PrometheusRule.
type chartAlert struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// chartRules renders the chart's PrometheusRule (its defaults, prometheusRule.enabled) with
// the checkout's helm and returns its groups as a Prometheus rule file, and its alerts.
func chartRules(t *testing.T, root string) ([]byte, map[string]chartAlert) {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "bin", "helm"), "template", release, "charts/webhook-operator", "--namespace", operatorNS,
		"--set", "prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var rule struct {
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	var typed struct {
		Spec struct {
			Groups []struct {
				Rules []chartAlert `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(out, &rule); err != nil || len(rule.Spec.Groups) == 0 {
		t.Fatalf("the chart's PrometheusRule: %v\n%s", err, out)
	}
	if err := yaml.Unmarshal(out, &typed); err != nil {
		t.Fatal(err)
	}
	alerts := map[string]chartAlert{}
	for _, g := range typed.Spec.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = r
		}
	}
	// The groups as they are: a Prometheus rule file.
	file, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	return file, alerts
}

// promtool returns bin/promtool (hack/build-tools.sh prometheus, part of make cluster-tools),
// skipping the test without it unless the cluster runs (make test-cluster builds it).
func promtool(t *testing.T, root string) string {
	t.Helper()
	p := filepath.Join(root, "bin", "promtool")
	if _, err := os.Stat(p); err != nil {
		if *enabled {
			t.Fatalf("%s: make test-cluster builds it (make cluster-tools)", p)
		}
		t.Skipf("%s: make cluster-tools builds it", p)
	}
	return p
}

// ruleCase is a unit test of one alert: series sampled once a minute from 0 (promtool's
// notation), and at which minutes the alert fires, with which labels and $value (humanized).
type ruleCase struct {
	name, alert string
	series      map[string]string
	firing      map[int]bool
	labels      map[string]string
	values      map[int]string
}

// TestAlertRules evaluates every alert of the chart's PrometheusRule with Prometheus' own
// rule-test engine (promtool test rules): over series as the dispatchers, the controller and
// kube-state-metrics export them, each fires when it should, only after its `for`, with its
// labels and its annotations expanded, and resolves. The cluster test then runs the same
// rules in a real Prometheus scraping the dispatchers.
func TestAlertRules(t *testing.T) {
	root := testenv.Root()
	tool := promtool(t, root)
	rules, alerts := chartRules(t, root)
	const ep = `namespace="shop",endpoint="orders"`
	shop := map[string]string{"namespace": "shop", "endpoint": "orders"}
	cases := []ruleCase{{
		name: "endpoint disabled on one replica, then enabled", alert: "WebhookEndpointDisabled",
		series: map[string]string{
			`webhook_endpoint_disabled{` + ep + `,pod="d-1"}`: "0 0 1 1 1 0 0 0",
			`webhook_endpoint_disabled{` + ep + `,pod="d-2"}`: "0 0 0 1 1 0 0 0",
		},
		firing: map[int]bool{1: false, 2: true, 4: true, 5: false, 7: false}, labels: shop,
	}, {
		name: "circuit open for 20m", alert: "WebhookCircuitOpen",
		series: map[string]string{`webhook_circuit_state{` + ep + `,pod="d-1"}`: "0 1x20 0x10"},
		firing: map[int]bool{1: false, 15: false, 16: true, 21: true, 22: false, 30: false}, labels: shop,
	}, {
		name: "a dead letter a minute for 30m", alert: "WebhookDeadLettersGrowing",
		series: map[string]string{`webhook_deliveries_total{` + ep + `,pod="d-1",outcome="dead_letter"}`: "0+1x30 30x30"},
		// increase over 15m of one a minute: 15 (extrapolated to the window's edges).
		firing: map[int]bool{20: true, 30: true, 47: false, 60: false}, labels: shop, values: map[int]string{20: "15", 30: "15"},
	}, {
		name: "no dead letter", alert: "WebhookDeadLettersGrowing",
		series: map[string]string{`webhook_deliveries_total{` + ep + `,pod="d-1",outcome="dead_letter"}`: "5x30"},
		firing: map[int]bool{10: false, 30: false},
	}, {
		name: "pending grows 100 a minute, then holds", alert: "WebhookDeliveriesPendingGrowing",
		series: map[string]string{`webhook_consumer_pending{` + ep + `,pod="d-1"}`: "0+100x45 4500x60"},
		// Over 1000 from 11m and growing: firing 15m later, until deriv over 30m is 0.
		firing: map[int]bool{11: false, 25: false, 26: true, 45: true, 100: false}, labels: shop,
		values: map[int]string{26: "2.6k", 45: "4.5k"},
	}, {
		name: "many pending, not growing", alert: "WebhookDeliveriesPendingGrowing",
		series: map[string]string{`webhook_consumer_pending{` + ep + `,pod="d-1"}`: "5000x60"},
		firing: map[int]bool{20: false, 40: false, 60: false},
	}, {
		name: "a dispatcher without an available replica for 10m", alert: "WebhookDispatcherUnavailable",
		series: map[string]string{
			`kube_deployment_spec_replicas{namespace="shop",deployment="webhook-dispatcher"}`:             "1x20",
			`kube_deployment_status_replicas_available{namespace="shop",deployment="webhook-dispatcher"}`: "1 1 0x10 1x8",
		},
		firing: map[int]bool{2: false, 6: false, 7: true, 12: true, 13: false, 20: false},
		labels: map[string]string{"namespace": "shop", "deployment": "webhook-dispatcher"},
	}, {
		name: "the controller disconnected from NATS for 5m", alert: "WebhookNATSUnreachable",
		series: map[string]string{`webhook_nats_connected{namespace="webhook-operator-system",pod="controller-0"}`: "1 0x5 1x5"},
		firing: map[int]bool{1: false, 2: false, 3: true, 6: true, 7: false, 10: false},
		labels: map[string]string{"namespace": "webhook-operator-system", "pod": "controller-0"},
	}}
	covered := map[string]bool{}
	var tests []map[string]any
	for _, c := range cases {
		a, ok := alerts[c.alert]
		if !ok {
			t.Fatalf("the chart has no alert %s", c.alert)
		}
		covered[c.alert] = true
		var input []map[string]string
		for _, s := range slices.Sorted(maps.Keys(c.series)) {
			input = append(input, map[string]string{"series": s, "values": c.series[s]})
		}
		var evals []map[string]any
		for _, m := range slices.Sorted(maps.Keys(c.firing)) {
			exp := []map[string]any{}
			if c.firing[m] {
				lbls := maps.Clone(c.labels)
				maps.Copy(lbls, a.Labels)
				exp = append(exp, map[string]any{"exp_labels": lbls, "exp_annotations": expand(a.Annotations, c.labels, c.values[m])})
			}
			evals = append(evals, map[string]any{"eval_time": fmt.Sprintf("%dm", m), "alertname": c.alert, "exp_alerts": exp})
		}
		tests = append(tests, map[string]any{"name": c.name, "interval": "1m", "input_series": input, "alert_rule_test": evals})
	}
	for name := range alerts {
		if !covered[name] {
			t.Errorf("alert %s has no unit test here", name)
		}
	}
	dir := t.TempDir()
	unit, err := yaml.Marshal(map[string]any{"rule_files": []string{"rules.yml"}, "evaluation_interval": "1m", "tests": tests})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"rules.yml": rules, "rules_test.yml": unit} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(tool, "test", "rules", "rules_test.yml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s\nthe tests:\n%s", err, out, unit)
	}
	t.Logf("promtool test rules: %d alerts, %d cases: %s", len(alerts), len(cases), strings.TrimSpace(string(out)))
}

// expand is what Prometheus makes of the annotations' templates for an alert with labels and
// $value: the chart uses {{ $labels.<name> }} and {{ $value | humanize }} only.
func expand(annotations, labels map[string]string, value string) map[string]string {
	out := map[string]string{}
	for k, v := range annotations {
		for name, l := range labels {
			v = strings.ReplaceAll(v, "{{ $labels."+name+" }}", l)
		}
		out[k] = strings.ReplaceAll(v, "{{ $value | humanize }}", value)
	}
	return out
}
