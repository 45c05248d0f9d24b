package monitoring

import (
	"slices"
	"strings"
	"testing"
)

func TestParseAndMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr  string
		names []string
		err   string
	}{
		{expr: `sum by (le) (rate(webhook_attempt_duration_seconds_bucket{namespace=~"$namespace"}[$__rate_interval]))`, names: []string{"webhook_attempt_duration_seconds_bucket"}},
		{expr: `a > 1 and on (x) {__name__="b", y="z"} unless rate(c[${__range}] offset 5m)`, names: []string{"a", "b", "c"}},
		{expr: `count(webhook_circuit_state == 2) or vector(0)`, names: []string{"webhook_circuit_state"}},
		{expr: `sum(rate(webhook_deliveries_total[5m])`, err: "does not parse"},
		{expr: `rate(webhook_deliveries_total{endpoint=~"$receiver"}[5m])`, err: "unknown variables [$receiver]"},
		{expr: `{__name__=~"webhook_.+"}`, err: "names no metric"},
	} {
		e, err := Parse(Query{Where: "test", Expr: tc.expr})
		var names []string
		if err == nil {
			names, err = MetricNames(e)
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.expr, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(names, tc.names) {
			t.Errorf("%s: names %v, %v; want %v", tc.expr, names, err, tc.names)
		}
	}
}

func TestDashboardQueries(t *testing.T) {
	qs, err := DashboardQueries([]byte(`{
		"panels": [
			{"title": "a", "targets": [{"refId": "A", "expr": "x"}]},
			{"type": "row", "title": "r", "panels": [{"title": "b", "targets": [{"refId": "B", "expr": "y"}]}]}
		],
		"templating": {"list": [
			{"name": "datasource", "type": "datasource", "query": "prometheus"},
			{"name": "ns", "type": "query", "query": {"query": "label_values(z{a=\"1\"}, ns)"}},
			{"name": "old", "type": "query", "query": "label_values(w, old)"}
		]}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, q := range qs {
		got = append(got, q.Where+"="+q.Expr)
	}
	want := []string{`panel "a" query A=x`, `panel "b" query B=y`, `variable ns=z{a="1"}`, `variable old=w`}
	if !slices.Equal(got, want) {
		t.Errorf("queries %q, want %q", got, want)
	}
	if _, err := DashboardQueries([]byte(`{"templating": {"list": [{"name": "v", "type": "query", "query": "query_result(up)"}]}}`)); err == nil {
		t.Error("a variable query other than label_values was accepted")
	}
	if _, err := DashboardQueries([]byte(`{"panels": [`)); err == nil {
		t.Error("invalid JSON accepted")
	}
}
