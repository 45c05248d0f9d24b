package expr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// order is a typical event body.
const order = `{"order_id":"ord_1","total":150,"price":9.5,"currency":"EUR","customer":{"name":"Zoë 🚀","email":"z@example.com"},
"items":[{"sku":"a","qty":1,"tags":["x","y"]},{"sku":"gift-card","qty":2,"tags":[]}],"big":18446744073709551615,"note":null,"paid":true}`

var eventTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func event(data string) *Event {
	return &Event{
		ID: "evt_1", Type: "order.created", Namespace: "shop", Time: eventTime, Data: []byte(data),
		Headers: map[string][]string{
			"X-Region":     {"eu", "us"},
			"Nats-Msg-Id":  {"evt_1"},
			"Whk-Attempts": {"3"},
			"Content-Type": {"application/json"},
		},
	}
}

// wantError checks that err is an *Error of field whose message has every part of want.
func wantError(t *testing.T, err error, field string, want ...string) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want an *expr.Error", err, err)
	}
	if e.Field != field {
		t.Errorf("field %q, want %q (%v)", e.Field, field, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	return e
}

func TestCompileFilter(t *testing.T) {
	cases := []struct {
		name, src string
		// want: substrings of the error (line:column first); nil when it compiles.
		want []string
	}{
		{"content", `payload.total > 100 && payload.currency == "EUR"`, nil},
		{"presence", `has(payload.customer) && headers["x-region"] == "eu"`, nil},
		{"every variable", `type == "order.created" && id.startsWith("evt_") && ns == "shop" && time > timestamp("2020-01-01T00:00:00Z") && raw.contains("ord_") && size(headers) > 0`, nil},
		{"iteration over the payload", `payload.items.exists(i, i.sku == "gift-card")`, nil},
		{"iteration over the items' own lists", `payload.items.exists(i, i.tags.exists(t, t == "x"))`, nil},
		{"optional", `payload.?customer.?name.orValue("") != ""`, nil},
		{"extensions", `payload.currency.lowerAscii() == "eur" && math.greatest(1, 2) == 2 && sets.contains([1, 2], [1])`, nil},
		{"unicode", `payload.customer.name == "Zoë 🚀" && "日本".size() == 2`, nil},
		{"namespace is a reserved word", `namespace == "shop"`, []string{"1:1:", "reserved identifier: namespace (the event's namespace is ns)"}},
		{"undeclared", `paylod.total > 100`, []string{"1:1:", "undeclared reference to 'paylod'"}},
		{"syntax", `payload.total >`, []string{"1:16:", "Syntax error"}},
		{"second line", "payload.total > 100 &&\n  paylod.currency == \"EUR\"", []string{"2:3:", "undeclared reference to 'paylod'"}},
		{"several errors", `a + b`, []string{"1:1:", "undeclared reference to 'a'", "(and 1 more error)"}},
		{"dyn", `payload.paid`, nil}, // checked on each event
		{"not a bool", `payload.total + 1`, []string{"must give a bool", "int"}},
		{"a string", `"yes"`, []string{"must give a bool", "string"}},
		{"type error", `1 + "a" == 2`, []string{"1:3:", "no matching overload"}},
		{"nested iteration over the payload", `payload.items.exists(x, payload.items.exists(y, x != y && x.sku == y.sku))`, []string{"may cost too much", "do not iterate over the payload inside another iteration"}},
		{"empty", "  ", []string{"empty"}},
		{"too long", `payload.a == "` + strings.Repeat("x", MaxSourceLength) + `"`, []string{"at most 4096"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := CompileFilter(tc.src)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("does not compile: %v", err)
				}
				if f.Source() != tc.src {
					t.Errorf("source %q", f.Source())
				}
				return
			}
			if err == nil {
				t.Fatalf("compiles, want an error with %q", tc.want)
			}
			wantError(t, err, FieldFilter, tc.want...)
		})
	}
}

// A compilation error carries CEL's report, with the line and a caret, for terminals.
func TestCompileErrorReport(t *testing.T) {
	_, err := CompileFilter("payload.total > 100 &&\n  paylod.currency == \"EUR\"")
	e := wantError(t, err, FieldFilter)
	if e.Line != 2 || e.Column != 3 {
		t.Errorf("located at %d:%d, want 2:3", e.Line, e.Column)
	}
	if !strings.Contains(e.Report, "paylod.currency") || !strings.Contains(e.Report, "..^") {
		t.Errorf("report without the line and a caret:\n%s", e.Report)
	}
}

func TestFilterMatch(t *testing.T) {
	cases := []struct {
		name, filter, data string
		want               bool
		// wantErr: substrings of the evaluation error.
		wantErr []string
	}{
		{"matches", `payload.total > 100 && payload.currency == "EUR"`, order, true, nil},
		{"does not match", `payload.total > 200`, order, false, nil},
		{"integer and double", `payload.total > 149.5 && payload.price < 10 && payload.price == 9.5`, order, true, nil},
		{"integral numbers are int", `type(payload.total) == int && type(payload.price) == double`, order, true, nil},
		{"above int64", `payload.big == 18446744073709551615u`, order, true, nil},
		{"json null", `payload.note == null`, order, true, nil},
		{"bool", `payload.paid`, order, true, nil},
		{"iteration", `payload.items.exists(i, i.sku == "gift-card" && i.qty == 2)`, order, true, nil},
		{"every variable", `type == "order.created" && id == "evt_1" && ns == "shop" && time == timestamp("2026-01-02T03:04:05Z")`, order, true, nil},
		{"headers: lower-case names, first value", `headers["x-region"] == "eu" && headers["content-type"] == "application/json"`, order, true, nil},
		{"headers: no JetStream or operator headers", `!("nats-msg-id" in headers) && !("whk-attempts" in headers) && size(headers) == 2`, order, true, nil},
		{"unicode", `payload.customer.name.size() == 5 && payload.customer.name.endsWith("🚀")`, order, true, nil},
		{"raw of a JSON body", `raw.startsWith("{\"order_id\"")`, order, true, nil},
		{"not JSON: payload is null", `payload == null`, "total=150", true, nil},
		{"not JSON: has() is false", `has(payload.total)`, "total=150", false, nil},
		{"not JSON: raw", `raw == "total=150"`, "total=150", true, nil},
		{"not JSON: a field is an error", `payload.total > 100`, "total=150", false, []string{"1:8:", "no such key: total"}},
		{"two JSON values are not JSON", `payload == null`, `{"a":1} {"b":2}`, true, nil},
		{"empty body", `payload == null && raw == ""`, "", true, nil},
		{"a JSON scalar", `payload == "hello"`, `"hello"`, true, nil},
		{"invalid UTF-8", `raw == "a\uFFFDb"`, "a\xffb", true, nil},
		{"missing field", `payload.refund > 0`, order, false, []string{"1:8:", "no such key: refund"}},
		{"missing field, guarded", `has(payload.refund) && payload.refund > 0`, order, false, nil},
		{"type error", `payload.currency + 1 == 2`, order, false, []string{"1:18:", "no such overload"}},
		{"error on the second line", "payload.total > 100 &&\n payload.customer.phone == \"1\"", order, false, []string{"2:18:", "no such key: phone"}},
		{"not a bool on this event", `payload.currency`, order, false, []string{"must give a bool", "string"}},
		{"division by zero", `payload.total / 0 == 1`, order, false, []string{"1:15:", "division by zero"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := CompileFilter(tc.filter)
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.Match(context.Background(), NewInput(event(tc.data)))
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("= %v, want an error with %q", got, tc.wantErr)
				}
				wantError(t, err, FieldFilter, tc.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("= %v, want %v", got, tc.want)
			}
		})
	}
}

// A worker sees the same variables in a delivery message as the router in the event: the
// operator's Whk-* headers are not among them.
func TestDeliveryEvent(t *testing.T) {
	h := map[string][]string{}
	for k, v := range event(order).Headers {
		h[k] = v
	}
	meta := records.DeliveryMeta{DeliveryID: "whdl_x", EventID: "evt_1", EventType: "order.created", Namespace: "shop", EventTime: eventTime, Endpoint: "orders"}
	records.SetDeliveryMeta(h, meta)
	f, err := CompileFilter(`id == "evt_1" && type == "order.created" && ns == "shop" && time == timestamp("2026-01-02T03:04:05Z") && size(headers) == 2 && payload.total == 150`)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := f.Match(context.Background(), NewInput(DeliveryEvent(records.ParseDeliveryMeta(h), h, []byte(order))))
	if !ok || err != nil {
		t.Errorf("= %v, %v; headers %v", ok, err, h)
	}
}

// No filter (nil) matches every event; FilterOf and TransformOf read the spec.
func TestOfSpec(t *testing.T) {
	spec := &v1alpha1.WebhookEndpointSpec{}
	f, err := FilterOf(spec)
	if err != nil || f != nil {
		t.Fatalf("FilterOf without a filter = %v, %v", f, err)
	}
	if ok, err := f.Match(context.Background(), NewInput(event(order))); !ok || err != nil {
		t.Errorf("a nil filter = %v, %v", ok, err)
	}
	tr, err := TransformOf(spec)
	if err != nil || tr != nil {
		t.Fatalf("TransformOf without a transform = %v, %v", tr, err)
	}
	if out, err := tr.Apply(context.Background(), NewInput(event(order))); err != nil || out.Body != nil || out.Headers != nil {
		t.Errorf("a nil transform = %+v, %v", out, err)
	}

	spec.Filter = `payload.total >`
	if _, err := FilterOf(spec); err == nil {
		t.Error("FilterOf of a bad filter: no error")
	}
	spec.Transform = &v1alpha1.TransformSpec{Body: `{"text": payload.order_id}`, Headers: []v1alpha1.TransformHeader{{Name: "X-Id", Expression: "id"}}}
	tr, err = TransformOf(spec)
	if err != nil {
		t.Fatal(err)
	}
	if tr.EstimatedCost() == 0 {
		t.Error("no estimated cost")
	}
}

func TestTransformApply(t *testing.T) {
	big := `{"s":"` + strings.Repeat("x", 600<<10) + `"}`
	cases := []struct {
		name    string
		body    string
		headers []v1alpha1.TransformHeader
		data    string
		// wantBody and wantType are the body and content type; wantHeaders the headers.
		wantBody, wantType string
		wantHeaders        http.Header
		// wantErr: the failing field and substrings of the error.
		wantErr []string
	}{
		{name: "slack", body: `{"text": "Order " + payload.order_id + " paid: " + string(payload.total) + " " + payload.currency}`, data: order,
			wantBody: `{"text":"Order ord_1 paid: 150 EUR"}`, wantType: ContentTypeJSON},
		{name: "keys sorted, nested values", body: `{"z": [1, 2.5, true, null], "a": {"b": payload.customer.name, "c": payload.price}, "m": payload.items[0]}`, data: order,
			wantBody: `{"a":{"b":"Zoë 🚀","c":9.5},"m":{"qty":1,"sku":"a","tags":["x","y"]},"z":[1,2.5,true,null]}`, wantType: ContentTypeJSON},
		{name: "the payload as it is", body: `payload.customer`, data: order, wantBody: `{"email":"z@example.com","name":"Zoë 🚀"}`, wantType: ContentTypeJSON},
		{name: "a list", body: `payload.items.map(i, i.sku)`, data: order, wantBody: `["a","gift-card"]`, wantType: ContentTypeJSON},
		{name: "a string is sent as is", body: `"order " + payload.order_id`, data: order, wantBody: `order ord_1`, wantType: ContentTypeText},
		{name: "bytes are sent as is", body: `b"\x00\x01"`, data: order, wantBody: "\x00\x01", wantType: ContentTypeBinary},
		{name: "escaping", body: `{"s": "a\"b\\c\n\u0001<>&\u2028é"}`, data: order, wantBody: `{"s":"a\"b\\c\n\u0001\u003c\u003e\u0026\u2028é"}`, wantType: ContentTypeJSON},
		{name: "numbers as encoding/json writes them", body: `[1e21, 1e-7, 0.000001, -0.0, 18446744073709551615u, -9223372036854775808]`, data: order,
			wantBody: `[1e+21,1e-7,0.000001,-0,18446744073709551615,-9223372036854775808]`, wantType: ContentTypeJSON},
		{name: "time and duration", body: `{"t": time, "d": duration("1m30s")}`, data: order, wantBody: `{"d":"90s","t":"2026-01-02T03:04:05Z"}`, wantType: ContentTypeJSON},
		{name: "int keys", body: `{1: "a", 2: "b"}`, data: order, wantBody: `{"1":"a","2":"b"}`, wantType: ContentTypeJSON},
		{name: "optional", body: `{"name": payload.?customer.?name, "phone": payload.?customer.?phone}`, data: order, wantBody: `{"name":"Zoë 🚀","phone":null}`, wantType: ContentTypeJSON},
		{name: "a non-JSON event", body: `{"text": raw, "json": payload != null}`, data: "plain text", wantBody: `{"json":false,"text":"plain text"}`, wantType: ContentTypeJSON},
		{name: "headers", body: `payload.customer`, headers: []v1alpha1.TransformHeader{{Name: "X-Order-Id", Expression: "payload.order_id"}, {Name: "x-total", Expression: "payload.total"}, {Name: "X-Paid", Expression: "payload.paid"}, {Name: "X-Absent", Expression: "null"}, {Name: "X-Maybe", Expression: "payload.?nothing"}}, data: order,
			wantBody: `{"email":"z@example.com","name":"Zoë 🚀"}`, wantType: ContentTypeJSON, wantHeaders: http.Header{"X-Order-Id": {"ord_1"}, "X-Total": {"150"}, "X-Paid": {"true"}}},
		{name: "headers only", headers: []v1alpha1.TransformHeader{{Name: "X-Type", Expression: "type"}}, data: order, wantHeaders: http.Header{"X-Type": {"order.created"}}},

		{name: "evaluation error", body: `{"text": payload.missing}`, data: order, wantErr: []string{FieldTransformBody, "1:17:", "no such key: missing"}},
		{name: "too large", body: `[payload.s, payload.s]`, data: big, wantErr: []string{FieldTransformBody, "larger than 1048576 bytes"}},
		{name: "too large string", body: `payload.s + payload.s`, data: big, wantErr: []string{FieldTransformBody, "larger than 1048576 bytes"}},
		{name: "NaN", body: `{"x": payload.price / 0.0 - payload.price / 0.0}`, data: order, wantErr: []string{FieldTransformBody, "NaN cannot be written as JSON"}},
		{name: "a type", body: `[type(1)]`, data: order, wantErr: []string{FieldTransformBody, "cannot be written as JSON"}},
		{name: "replace beyond the bound", body: `payload.s.replace("x", "xxxxxxxx")`, data: big, wantErr: []string{FieldTransformBody, "1:18:", "would be 4915200 bytes", "at most 4194304"}},
		{name: "doubling beyond the bound", body: `cel.bind(a, raw + raw, cel.bind(b, a + a, cel.bind(c, b + b, cel.bind(d, c + c, cel.bind(e, d + d, e + e)))))`, data: big, wantErr: []string{FieldTransformBody, "1:57:", "at most 4194304"}},
		{name: "building too much in all", body: `lists.range(100).map(i, raw + "x").size()`, data: big, wantErr: []string{FieldTransformBody, "1:29:", "built more than 33554432 bytes"}},
		{name: "a list beyond the bound", body: `cel.bind(a, lists.range(10000), cel.bind(b, a + a, cel.bind(c, b + b, cel.bind(d, c + c, cel.bind(e, d + d, cel.bind(f, e + e, cel.bind(g, f + f, g + g)))))))`,
			data: order, wantErr: []string{FieldTransformBody, "1:149:", "at most 1048576"}},
		{name: "join beyond the bound", body: `[payload.s, payload.s, payload.s, payload.s, payload.s, payload.s, payload.s, payload.s].join(",")`, data: big, wantErr: []string{FieldTransformBody, "at most 4194304"}},
		{name: "format beyond the bound", body: `"%s%s%s%s%s%s%s%s".format([payload.s, payload.s, payload.s, payload.s, payload.s, payload.s, payload.s, payload.s])`, data: big, wantErr: []string{FieldTransformBody, "at most 4194304"}},
		{name: "header with a new line", headers: []v1alpha1.TransformHeader{{Name: "X-A", Expression: `"a\nb"`}}, data: order, wantErr: []string{FieldTransformHeaders + ".X-A", "control character"}},
		{name: "header too long", headers: []v1alpha1.TransformHeader{{Name: "X-A", Expression: `payload.s`}}, data: big, wantErr: []string{FieldTransformHeaders + ".X-A", "at most 4096"}},
		{name: "header not a scalar", headers: []v1alpha1.TransformHeader{{Name: "X-A", Expression: `payload.items`}}, data: order, wantErr: []string{FieldTransformHeaders + ".X-A", "must be a string, a number, a bool or null"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := CompileTransform(tc.body, tc.headers)
			if err != nil {
				t.Fatal(err)
			}
			out, err := tr.Apply(context.Background(), NewInput(event(tc.data)))
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("= %q, want an error with %q", out.Body, tc.wantErr)
				}
				wantError(t, err, tc.wantErr[0], tc.wantErr[1:]...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(out.Body) != tc.wantBody || out.ContentType != tc.wantType {
				t.Errorf("body %q (%s), want %q (%s)", out.Body, out.ContentType, tc.wantBody, tc.wantType)
			}
			if tc.wantBody == "" && out.Body != nil {
				t.Errorf("without a body expression the body is %q, want nil (the event's)", out.Body)
			}
			if fmt.Sprint(out.Headers) != fmt.Sprint(tc.wantHeaders) {
				t.Errorf("headers %v, want %v", out.Headers, tc.wantHeaders)
			}
			if out.ContentType == ContentTypeJSON && !json.Valid(out.Body) {
				t.Errorf("not JSON: %s", out.Body)
			}
		})
	}
}

// The same value always gives the same bytes, whatever the order maps iterate in: a retry
// sends and signs what the first attempt did.
func TestTransformIsDeterministic(t *testing.T) {
	tr, err := CompileTransform(`{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": payload, "h": {"x": 1, "y": 2, "z": 3}}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	var first string
	for i := range 50 {
		out, err := tr.Apply(context.Background(), NewInput(event(order)))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = string(out.Body)
		} else if string(out.Body) != first {
			t.Fatalf("attempt %d: %s\nfirst: %s", i, out.Body, first)
		}
	}
}

func TestCompileTransformErrors(t *testing.T) {
	cases := []struct {
		name    string
		body    string
		headers []v1alpha1.TransformHeader
		want    []string // field, then substrings
	}{
		{"nothing", "", nil, []string{"spec.transform", "needs a body expression, headers, or both"}},
		{"bad body", `{"text": paylod.x}`, nil, []string{FieldTransformBody, "1:10:", "undeclared reference to 'paylod'"}},
		{"body a type", `int`, nil, []string{FieldTransformBody, "a body must be"}},
		{"too costly body", `payload.items.map(x, payload.items.map(y, [x, y]))`, nil, []string{FieldTransformBody, "may cost too much"}},
		{"reserved header", "", []v1alpha1.TransformHeader{{Name: "Webhook-Signature", Expression: `"x"`}}, []string{FieldTransformHeaders + ".Webhook-Signature", "the dispatcher owns this header"}},
		{"reserved header, any case", "", []v1alpha1.TransformHeader{{Name: "CONTENT-TYPE", Expression: `"x"`}}, []string{FieldTransformHeaders + ".CONTENT-TYPE", "the dispatcher owns this header"}},
		{"header not a token", "", []v1alpha1.TransformHeader{{Name: "X A", Expression: `"x"`}}, []string{FieldTransformHeaders + ".X A", "HTTP tokens"}},
		{"the same header twice", "", []v1alpha1.TransformHeader{{Name: "X-A", Expression: `"x"`}, {Name: "x-a", Expression: `"y"`}}, []string{FieldTransformHeaders + ".x-a", "the same header as X-A"}},
		{"header a list", "", []v1alpha1.TransformHeader{{Name: "X-A", Expression: `[1]`}}, []string{FieldTransformHeaders + ".X-A", "a header value must be a string"}},
		{"bad header", "", []v1alpha1.TransformHeader{{Name: "X-A", Expression: `payload.`}}, []string{FieldTransformHeaders + ".X-A", "1:9:", "Syntax error"}},
		{"header too long", "", []v1alpha1.TransformHeader{{Name: "X-A", Expression: `"` + strings.Repeat("x", MaxHeaderSourceLength) + `"`}}, []string{FieldTransformHeaders + ".X-A", "at most 1024"}},
		{"too many headers", "", manyHeaders(MaxTransformHeaders + 1), []string{FieldTransformHeaders, "at most 16"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := CompileTransform(tc.body, tc.headers)
			if err == nil {
				t.Fatalf("compiles, want an error with %q", tc.want)
			}
			wantError(t, err, tc.want[0], tc.want[1:]...)
		})
	}
}

func manyHeaders(n int) []v1alpha1.TransformHeader {
	h := []v1alpha1.TransformHeader{}
	for i := range n {
		h = append(h, v1alpha1.TransformHeader{Name: fmt.Sprintf("X-H%d", i), Expression: `"v"`})
	}
	return h
}

// The estimate refuses work proportional to the square of the event, not work proportional
// to it.
func TestCostEstimate(t *testing.T) {
	accepted := []string{
		`payload.items.all(i, i.qty > 0 && i.sku.size() < 100)`,
		`payload.items.map(i, {"sku": i.sku, "tags": i.tags.map(t, t.upperAscii())})`,
		`payload.items.filter(i, i.tags.exists(t, t == "x")).size() > 0`,
		`raw.matches("^[a-z]+$") && raw.contains("x") && raw.split(",").size() > 2`,
		`cel.bind(items, payload.items, items.exists(i, i.qty > 1))`,
	}
	for _, src := range accepted {
		p, err := compile(kindBody, "test", src, MaxSourceLength)
		if err != nil {
			t.Errorf("%s: %v", src, err)
			continue
		}
		t.Logf("%s: estimated %d", src, p.cost.Max)
	}
	refused := []string{
		`payload.items.exists(x, payload.items.exists(y, x == y))`,
		`payload.a.all(x, payload.b.all(y, x != y))`,
		`raw.split(",").exists(x, raw.split(",").exists(y, x == y))`,
		`payload.items.map(x, raw.contains(x.sku))`,
		`raw.replace("", raw)`,
	}
	for _, src := range refused {
		if _, err := compile(kindBody, "test", src, MaxSourceLength); err == nil || !strings.Contains(err.Error(), "may cost too much") {
			t.Errorf("%.60s: %v, want refused as too costly", src, err)
		}
	}
}

// The body is parsed at most once per event, however many expressions read it.
func TestInputParsesOnce(t *testing.T) {
	filters := []string{`payload.total > 100`, `payload.currency == "EUR"`, `has(payload.items)`, `raw.size() > 0`, `type == "order.created"`}
	in := NewInput(event(order))
	before := jsonParses.Load()
	var wg sync.WaitGroup
	for _, src := range filters {
		f, err := CompileFilter(src)
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			wg.Go(func() {
				if ok, err := f.Match(context.Background(), in); !ok || err != nil {
					t.Errorf("%s = %v, %v", src, ok, err)
				}
			})
		}
	}
	tr, err := CompileTransform(`payload.customer`, []v1alpha1.TransformHeader{{Name: "X-Id", Expression: "payload.order_id"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Apply(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if n := jsonParses.Load() - before; n != 1 {
		t.Errorf("the body was parsed %d times, want once", n)
	}
	if !in.IsJSON() {
		t.Error("IsJSON is false for a JSON body")
	}
}

// Compiling the same source twice compiles once.
func TestCompileCache(t *testing.T) {
	src := fmt.Sprintf(`payload.n == %d`, time.Now().UnixNano())
	a, err := CompileFilter(src)
	if err != nil {
		t.Fatal(err)
	}
	b, err := CompileFilter(src)
	if err != nil {
		t.Fatal(err)
	}
	if a.p != b.p {
		t.Error("the second compilation did not come from the cache")
	}
	// Errors are cached too, and stay errors.
	for range 2 {
		if _, err := CompileFilter(src + " &&"); err == nil {
			t.Error("a bad expression compiled")
		}
	}
}

// An iterating evaluation stops when its context ends (as it does after EvalTimeout).
func TestEvaluationStopsWithItsContext(t *testing.T) {
	f, err := CompileFilter(`payload.items.all(i, i >= 0)`)
	if err != nil {
		t.Fatal(err)
	}
	data := `{"items":[` + strings.Repeat("1,", 10000) + `1]}`
	ctx, cancel := context.WithCancel(context.Background())
	if ok, err := f.Match(ctx, NewInput(event(data))); !ok || err != nil {
		t.Fatalf("before the context ends: %v, %v", ok, err)
	}
	cancel()
	_, err = f.Match(ctx, NewInput(event(data)))
	wantError(t, err, FieldFilter, "interrupted", "context canceled")
}

// An evaluation never panics: a nil input is an error.
func TestEvaluationDoesNotPanic(t *testing.T) {
	f, err := CompileFilter(`payload.total > 1`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Match(context.Background(), nil)
	wantError(t, err, FieldFilter, "internal error")
	tr, err := CompileTransform(`payload`, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tr.Apply(context.Background(), nil)
	wantError(t, err, FieldTransformBody, "internal error")
}
