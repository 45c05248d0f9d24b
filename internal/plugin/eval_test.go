package plugin_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
)

const sampleOrder = `{"order_id":"ord_7","total":150,"currency":"EUR","items":[{"sku":"a"},{"sku":"gift-card"}]}`

// evalLocal runs `kubectl webhooks eval` with no cluster and no NATS.
func evalLocal(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	full := append([]string{"--kubeconfig", filepath.Join(t.TempDir(), "none"), "-n", "shop", "eval"}, args...)
	code := plugin.Run(context.Background(), full, genericiooptions.IOStreams{In: strings.NewReader(stdin), Out: &out, ErrOut: &errOut},
		func(string) string { return "" })
	return result{code: code, out: out.String(), errOut: errOut.String()}
}

func TestEvalFilterAndTransformLocally(t *testing.T) {
	file := filepath.Join(t.TempDir(), "order.json")
	if err := os.WriteFile(file, []byte(sampleOrder), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		code int
		// want: substrings of standard output (or of standard error when the code is 2).
		want []string
	}{
		{"delivered, a file name", []string{"--filter", `payload.total > 100 && payload.currency == "EUR"`, "--event", file},
			0, []string{"filter:", `payload.total > 100 && payload.currency == "EUR"`, "verdict:", "true: the event is delivered"}},
		{"not delivered, @file", []string{"--filter", `payload.total > 200`, "--event", "@" + file},
			0, []string{"false: the event is not delivered"}},
		{"every variable", []string{"--filter", `type == "order.paid" && id == "evt_9" && ns == "shop" && headers["x-region"] == "eu" && time == timestamp("2026-01-02T03:04:05Z")`,
			"--event", sampleOrder, "--type", "order.paid", "--id", "evt_9", "-H", "X-Region=eu", "--time", "2026-01-02T03:04:05Z"},
			0, []string{"true: the event is delivered"}},
		{"slack transformation with a header", []string{"--transform", `{"text": "Order " + payload.order_id + " paid: " + string(payload.total) + " " + payload.currency}`,
			"--transform-header", "X-Order-Id=payload.order_id", "--event", sampleOrder},
			0, []string{"header:", "X-Order-Id: ord_7", "content-type:", "application/json", `{"text":"Order ord_7 paid: 150 EUR"}`}},
		{"headers only", []string{"--transform-header", "X-Type=type", "--event", sampleOrder},
			0, []string{"X-Type: webhook.test", "the event's body, unchanged"}},
		{"not JSON", []string{"--filter", `has(payload.total)`, "--transform", `{"text": raw}`, "--event", "total=150"},
			0, []string{"not JSON", "false: the event is not delivered", `{"text":"total=150"}`}},
		{"fails on the event", []string{"--filter", `payload.refund > 0`, "--event", sampleOrder},
			1, []string{"error: spec.filter: 1:8: no such key: refund"}},
		{"transformation fails on the event", []string{"--transform", `{"x": payload.refund}`, "--event", sampleOrder},
			1, []string{"error: spec.transform.body: 1:14: no such key: refund"}},
		{"does not compile", []string{"--filter", "payload.total > 100 &&\n paylod.x", "--event", sampleOrder},
			2, []string{"spec.filter: 2:2: undeclared reference to 'paylod'", " paylod.x", " .^"}},
		{"too costly", []string{"--filter", `payload.items.exists(x, payload.items.exists(y, x == y))`, "--event", sampleOrder},
			2, []string{"may cost too much"}},
		// Issue 30's expression is refused before it runs; one the cost estimate lets through
		// stops at what an evaluation may build, as it does in the dispatcher.
		{"issue 30", []string{"--filter", `size([` + strings.TrimSuffix(strings.Repeat("lists.range(1000000), ", 99), ", ") + `]) > 0`, "--event", sampleOrder},
			2, []string{"spec.filter: 1:18: lists.range(1000000): an expression makes ranges of at most 10000 elements"}},
		{"builds too much", []string{"--filter", `size([` + strings.TrimSuffix(strings.Repeat("lists.range(10000), ", 180), ", ") + `]) > 0`,
			"--transform", `{"maps": lists.range(10000).map(i, {"i": i, "l": lists.range(1000)})}`, "--event", sampleOrder},
			1, []string{"error: spec.filter: 1:", "built more than 33554432 bytes", "error: spec.transform.body: 1:"}},
		{"reserved header", []string{"--transform-header", "Webhook-Id=id", "--event", sampleOrder},
			2, []string{"the dispatcher owns this header"}},
		{"nothing to evaluate", []string{"--event", sampleOrder}, 2, []string{"nothing to evaluate"}},
		{"no event", []string{"--filter", "true"}, 2, []string{"--event is required"}},
		{"bad time", []string{"--filter", "true", "--event", "{}", "--time", "yesterday"}, 2, []string{"--time"}},
		{"endpoint and flags", []string{"--endpoint", "x", "--filter", "true", "--event", "{}"}, 2, []string{"leave out --filter"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := evalLocal(t, "", tc.args...).must(t, tc.code)
			got := r.out
			if tc.code == 2 || tc.code == 1 && r.out == "" {
				got = r.errOut
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("output does not have %q:\n%s", w, r)
				}
			}
		})
	}

	// Standard input and JSON output.
	r := evalLocal(t, sampleOrder, "--filter", `payload.items.exists(i, i.sku == "gift-card")`,
		"--transform", `payload.items.map(i, i.sku)`, "--event", "-", "-o", "json").must(t, 0)
	var res plugin.EvalResult
	r.decode(t, &res)
	if !res.PayloadIsJSON || res.Filter == nil || !res.Filter.Deliver || res.Transform == nil ||
		res.Transform.Body != `["a","gift-card"]` || res.Transform.ContentType != "application/json" {
		t.Errorf("JSON result %+v %+v %+v", res, res.Filter, res.Transform)
	}
}

// --endpoint reads the endpoint's expressions from the cluster.
func TestEvalEndpointExpressions(t *testing.T) {
	e := newEnv(t)
	ep := &v1alpha1.WebhookEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "slack"},
		Spec: v1alpha1.WebhookEndpointSpec{
			URL: "https://hooks.example.com/slack", EventTypes: []v1alpha1.EventTypePattern{"order.*"},
			Filter:    `payload.total > 100`,
			Transform: &v1alpha1.TransformSpec{Body: `{"text": "Order " + payload.order_id + " in " + ns}`},
		},
	}
	if err := cp.Client.Create(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	r := e.run("eval", "--endpoint", "slack", "--event", sampleOrder, "-o", "json").must(t, 0)
	var res plugin.EvalResult
	r.decode(t, &res)
	if res.Endpoint != "slack" || res.Filter == nil || !res.Filter.Deliver || res.Filter.Expression != `payload.total > 100` ||
		res.Transform == nil || res.Transform.Body != `{"text":"Order ord_7 in `+e.ns+`"}` {
		t.Errorf("result %+v %+v %+v", res, res.Filter, res.Transform)
	}
	e.run("eval", "--endpoint", "missing", "--event", sampleOrder).must(t, plugin.ExitNotFound)
}
