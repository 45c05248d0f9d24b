// Package monitoring reads the PromQL that the chart's Grafana dashboard
// (charts/webhook-operator/dashboards) and PrometheusRule run, for the tests that check it:
// test/chart parses every query and renders both objects, test/e2e checks that every metric
// they read is in the real controller's and dispatchers' /metrics.
package monitoring

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// External are the metrics the dashboard and the alerts read that neither the controller nor
// a dispatcher serves, with where they come from. Every other metric they read must be in
// the real processes' /metrics.
var External = map[string]string{
	// kube-state-metrics, for WebhookDispatcherUnavailable: a Deployment's replicas.
	"kube_deployment_spec_replicas":             "kube-state-metrics",
	"kube_deployment_status_replicas_available": "kube-state-metrics",
	// Prometheus itself, per scrape target: the dashboard's "Dispatcher replicas up".
	"up": "Prometheus",
}

// Query is one PromQL expression of the dashboard or the PrometheusRule.
type Query struct {
	// Where says where it is, for error messages: `alert WebhookCircuitOpen`, `panel "Circuit
	// state" query A`, `variable endpoint`.
	Where string
	// Expr is the expression as written, with Grafana's variables ($namespace,
	// $__rate_interval) where the dashboard has them.
	Expr string
}

// DashboardQueries returns every query of a Grafana dashboard: each panel's targets (panels
// nested in rows too) and each query variable (label_values(<selector>, <label>) gives its
// selector).
func DashboardQueries(dashboard []byte) ([]Query, error) {
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, fmt.Errorf("the dashboard is not valid JSON: %w", err)
	}
	var out []Query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out = append(out, Query{Where: fmt.Sprintf("panel %q query %s", p.Title, t.RefID), Expr: t.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		sel, err := labelValuesSelector(q)
		if err != nil {
			return nil, fmt.Errorf("variable %s: %w", v.Name, err)
		}
		out = append(out, Query{Where: "variable " + v.Name, Expr: sel})
	}
	return out, nil
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

var labelValuesRE = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

// labelValuesSelector is the series selector of a Grafana label_values(<selector>, <label>)
// query; any other variable query is refused, since it could not be checked.
func labelValuesSelector(q string) (string, error) {
	m := labelValuesRE.FindStringSubmatch(strings.TrimSpace(q))
	if m == nil {
		return "", fmt.Errorf("query %q is not label_values(<selector>, <label>)", q)
	}
	return m[1], nil
}

// RuleQueries returns the expression of every rule of a PrometheusRule object.
func RuleQueries(rule map[string]any) ([]Query, error) {
	var r struct {
		Spec struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Alert  string `json:"alert"`
					Record string `json:"record"`
					Expr   string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	b, err := json.Marshal(rule)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	var out []Query
	for _, g := range r.Spec.Groups {
		for _, x := range g.Rules {
			name := "alert " + x.Alert
			if x.Alert == "" {
				name = "record " + x.Record
			}
			out = append(out, Query{Where: name, Expr: x.Expr})
		}
	}
	return out, nil
}

// grafanaVariables are the variables the dashboard may use, with a value of their kind to
// parse the query with: durations for Grafana's interval macros, a regular expression for the
// dashboard's own multi-value variables (they only appear in =~ matchers).
var grafanaVariables = map[string]string{
	"__rate_interval": "5m",
	"__interval":      "1m",
	"__range":         "6h",
	"namespace":       ".*",
	"endpoint":        ".*",
}

var variableRE = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?`)

// Parse parses q with the Prometheus query parser, after replacing the dashboard's variables;
// an unknown variable is an error.
func Parse(q Query) (parser.Expr, error) {
	var unknown []string
	expr := variableRE.ReplaceAllStringFunc(q.Expr, func(v string) string {
		name := variableRE.FindStringSubmatch(v)[1]
		val, ok := grafanaVariables[name]
		if !ok {
			unknown = append(unknown, v)
		}
		return val
	})
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%s: unknown variables %v in %q", q.Where, unknown, q.Expr)
	}
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, fmt.Errorf("%s: %q does not parse: %w", q.Where, q.Expr, err)
	}
	return e, nil
}

// MetricNames returns the metric names e selects, sorted. A selector without a literal name
// (a regular expression on __name__) is an error: its metrics could not be checked.
func MetricNames(e parser.Expr) ([]string, error) {
	var names []string
	var errs []error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			errs = append(errs, fmt.Errorf("selector %s names no metric", vs))
			return nil
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
		return nil
	})
	slices.Sort(names)
	return names, errors.Join(errs...)
}

// Render renders the chart with the dashboard and the PrometheusRule enabled (default values
// otherwise) and returns the dashboard's JSON, as its ConfigMap holds it, and the
// PrometheusRule object.
func Render(t testing.TB) (dashboard []byte, rule map[string]any) {
	t.Helper()
	show := func(template string) map[string]any {
		t.Helper()
		out, err := testenv.Helm(t, nil, "template", "webhook-operator", testenv.Root()+"/charts/webhook-operator",
			"--set", "grafana.dashboards.enabled=true", "--set", "prometheusRule.enabled=true", "--show-only", template)
		if err != nil {
			t.Fatal(err)
		}
		var o map[string]any
		if err := yaml.Unmarshal([]byte(out), &o); err != nil {
			t.Fatalf("%s: %v\n%s", template, err, out)
		}
		return o
	}
	cm := show("templates/grafana-dashboard.yaml")
	data, _ := cm["data"].(map[string]any)
	if len(data) != 1 {
		t.Fatalf("the dashboard ConfigMap holds %d files, want 1", len(data))
	}
	for _, v := range data {
		s, _ := v.(string)
		dashboard = []byte(s)
	}
	return dashboard, show("templates/prometheusrule.yaml")
}

// Queries returns every query of the rendered dashboard and PrometheusRule (Render).
func Queries(t testing.TB) []Query {
	t.Helper()
	dashboard, rule := Render(t)
	dq, err := DashboardQueries(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	rq, err := RuleQueries(rule)
	if err != nil {
		t.Fatal(err)
	}
	if len(dq) == 0 || len(rq) == 0 {
		t.Fatalf("%d dashboard and %d alert queries: the chart rendered nothing to check", len(dq), len(rq))
	}
	return append(dq, rq...)
}

// Scrape reads url (a /metrics endpoint, in the Prometheus text format) and returns the name
// of every series it has: a histogram gives its _bucket, _sum and _count series, and a
// metric without series (a vector never used) gives nothing.
func Scrape(url string) (map[string]bool, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names, sc.Err()
}
