package expr

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// repeat joins n copies of s with ", ".
func repeat(s string, n int) string {
	return strings.TrimSuffix(strings.Repeat(s+", ", n), ", ")
}

// nestedPairs is a value of 2^depth leaves in depth lists: each level a pair of the one
// below it, so that it takes almost no memory and a walk through it never ends.
func nestedPairs(depth int, body string) string {
	var b strings.Builder
	b.WriteString("cel.bind(x0, [raw, raw], ")
	for i := 1; i <= depth; i++ {
		fmt.Fprintf(&b, "cel.bind(x%d, [x%d, x%d], ", i, i-1, i-1)
	}
	b.WriteString(body)
	b.WriteString(strings.Repeat(")", depth+1))
	return b.String()
}

// The expression of issue 30 (ninety-nine lists of a million elements, which passed the cost
// estimate and built 2.4 GB) and its variants (lists, maps, nested lists, strings, work
// without building) are refused when compiled or stopped when evaluated with a clear error,
// whether they are filters, transformations or an erasure's expression, and an evaluation
// that is stopped did not build more than its bound.
func TestEvaluationBounds(t *testing.T) {
	cases := []struct {
		name, src, data string
		// compile is set when compiling refuses the expression.
		compile bool
		want    []string
		// builds is set when the evaluation builds what it is stopped for (and allocates
		// little else): what it allocated is checked too.
		builds bool
	}{
		{name: "issue 30", src: `size([` + repeat("lists.range(1000000)", 99) + `]) > 0`, data: order, compile: true,
			want: []string{"1:18:", "lists.range(1000000): an expression makes ranges of at most 10000 elements"}},
		{name: "lists within the range bound", src: `size([` + repeat("lists.range(10000)", 180) + `]) > 0`, data: order,
			want: []string{"built more than 33554432 bytes"}, builds: true},
		{name: "the error is not absorbed by ||", src: `size([` + repeat("lists.range(10000)", 180) + `]) > 0 || true`, data: order,
			want: []string{"built more than 33554432 bytes"}, builds: true},
		{name: "a map literal", src: `size({` + func() string {
			var parts []string
			for i := range 150 {
				parts = append(parts, fmt.Sprintf("%d: lists.range(10000)", i))
			}
			return strings.Join(parts, ", ")
		}() + `}) > 0`, data: order, want: []string{"built more than 33554432 bytes"}, builds: true},
		{name: "nested lists", src: `size([` + repeat("["+repeat("lists.range(10000)", 12)+"]", 15) + `]) > 0`, data: order,
			want: []string{"built more than 33554432 bytes"}, builds: true},
		{name: "a list per iteration", src: `lists.range(5000).map(i, lists.range(10000)).size() > 0`, data: order,
			want: []string{"built more than 33554432 bytes"}, builds: true},
		{name: "maps per iteration", src: `cel.bind(r, lists.range(1000), r.map(i, r.map(j, {"i": i, "j": j}))).size() > 0`, data: order,
			want: []string{"built more than 33554432 bytes"}, builds: true},
		{name: "strings", src: `cel.bind(s, lists.range(200).map(i, "0123456789").join(""), lists.range(10000).map(i, s + s)).size() > 0`, data: order,
			want: []string{"built more than 33554432 bytes"}, builds: true},
		{name: "strings through join", src: `cel.bind(s, lists.range(200).map(i, "0123456789").join(""), lists.range(10000).map(i, [s, s].join(""))).size() > 0`, data: order,
			want: []string{"built more than 33554432 bytes"}, builds: true},
		{name: "work without building", src: `cel.bind(l, lists.range(10000), l.all(i, sets.contains(l, l)))`, data: order,
			want: []string{"did more than 10000000 units of work"}},
		{name: "comparing shared lists", src: nestedPairs(60, `x60 == x60`), data: order,
			want: []string{"did more than 10000000 units of work"}},
		{name: "searching shared lists", src: nestedPairs(60, `x60 in [x60]`), data: order,
			want: []string{"did more than 10000000 units of work"}},
		{name: "encoding shared lists", src: nestedPairs(60, `json.encode(x60) != ""`), data: order,
			want: []string{"did more than 10000000 units of work"}},
		{name: "formatting shared lists", src: nestedPairs(60, `"%s".format([x60]) != ""`), data: order,
			want: []string{"did more than 10000000 units of work"}},
		{name: "flattening shared lists", src: nestedPairs(60, `x60.flatten(60).size() > 0`), data: order,
			want: []string{"would have more than 1048576 elements"}},
		{name: "distinct shared lists", src: nestedPairs(60, `[x60, x60].distinct().size() > 0`), data: order,
			want: []string{"did more than 10000000 units of work"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.src) > MaxSourceLength {
				t.Fatalf("the expression is %d characters, above %d", len(tc.src), MaxSourceLength)
			}
			// As a filter, an erasure's expression and a transformation's body and header.
			eval := []struct {
				field string
				run   func() error
			}{
				{FieldFilter, func() error {
					f, err := CompileFilter(tc.src)
					if err != nil {
						return err
					}
					_, err = f.Match(context.Background(), NewInput(event(tc.data)))
					return err
				}},
				{"spec.expression", func() error {
					f, err := CompileFilterAt("spec.expression", tc.src)
					if err != nil {
						return err
					}
					_, err = f.Match(context.Background(), NewInput(event(tc.data)))
					return err
				}},
				{FieldTransformBody, func() error {
					tr, err := CompileTransform(tc.src, nil)
					if err != nil {
						return err
					}
					_, err = tr.Apply(context.Background(), NewInput(event(tc.data)))
					return err
				}},
			}
			if len(tc.src) <= MaxHeaderSourceLength {
				eval = append(eval, struct {
					field string
					run   func() error
				}{FieldTransformHeaders + ".X-A", func() error {
					tr, err := CompileTransform("", []v1alpha1.TransformHeader{{Name: "X-A", Expression: tc.src}})
					if err != nil {
						return err
					}
					_, err = tr.Apply(context.Background(), NewInput(event(tc.data)))
					return err
				}})
			}
			for _, e := range eval {
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				err := e.run()
				runtime.ReadMemStats(&after)
				if err == nil {
					t.Fatalf("%s: no error", e.field)
				}
				got := wantError(t, err, e.field, tc.want...)
				if !tc.compile && !got.Limit {
					t.Errorf("%s: %v is not a limit error", e.field, err)
				}
				if tc.compile && got.Limit {
					t.Errorf("%s: %v: a compilation error is not a limit", e.field, err)
				}
				// What the evaluation allocated: its bound, and what CEL allocates besides
				// (the parsed event, its interpreter's frames).
				if n := after.TotalAlloc - before.TotalAlloc; tc.builds && n > 2*MaxBuiltBytes {
					t.Errorf("%s: the evaluation allocated %d bytes, above twice its bound of %d", e.field, n, MaxBuiltBytes)
				}
			}
		})
	}
}

// What the bounds leave alone: an expression within them gives its result.
func TestEvaluationWithinBounds(t *testing.T) {
	items := `{"items":[` + repeat(`{"sku":"x","qty":1}`, 20000) + `]}`
	cases := []struct{ name, src, data string }{
		{"a pass over twenty thousand items", `payload.items.all(i, i.qty == 1) && payload.items.exists(i, i.sku == "x")`, items},
		{"a range at its bound", `lists.range(10000).size() == 10000`, order},
		{"building a list of the items", `payload.items.map(i, {"sku": i.sku}).size() == 20000`, items},
		{"comparing lists", `payload.items == payload.items && [1, [2, 3]] != [1, [2, 4]]`, items},
		{"shared lists of a few levels", nestedPairs(8, `x8 == x8 && json.encode(x8).size() > 0 && x8.flatten(8).size() == 512`), `"ab"`},
		{"sets", `sets.contains(lists.range(1000), lists.range(100)) && sets.intersects([1], [1, 2])`, order},
		{"strings", `raw.size() > 0 && raw.indexOf("currency") > 0 && raw.split(",").size() > 3 && raw.upperAscii().contains("EUR")`, order},
		{"encoders", `base64.decode(base64.encode(bytes(raw))) == bytes(raw) && strings.quote("a") == "\"a\""`, order},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := CompileFilter(tc.src)
			if err != nil {
				t.Fatal(err)
			}
			ok, err := f.Match(context.Background(), NewInput(event(tc.data)))
			if err != nil || !ok {
				t.Fatalf("= %v, %v; want true", ok, err)
			}
		})
	}
}

// Iterations that build nothing are stopped too: by their work or, on a slow machine, the
// deadline, whichever comes first.
func TestIterationsAreBounded(t *testing.T) {
	f, err := CompileFilter(`cel.bind(l, lists.range(10000), l.all(i, l.all(j, i + j >= 0)))`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Match(context.Background(), NewInput(event(order)))
	e := wantError(t, err, FieldFilter)
	if !e.Limit || !strings.Contains(e.Msg, "did more than 10000000 units of work") && !strings.Contains(e.Msg, "took longer than 1s") {
		t.Errorf("%v: want the work or the deadline bound", err)
	}
}

// lists.range with an argument that is not a constant cannot pass the cost estimate (its
// size is unknown); should one get through, its guard still refuses a range above the bound.
func TestRangeGuard(t *testing.T) {
	if _, err := guards["lists.range"](nil, []ref.Val{types.Int(MaxRangeSize + 1)}); err == nil || !strings.Contains(err.Error(), "at most 10000") {
		t.Errorf("lists.range(%d): %v, want refused", MaxRangeSize+1, err)
	}
	if n, err := guards["lists.range"](nil, []ref.Val{types.Int(MaxRangeSize)}); err != nil || n.bytes != listElementBytes*MaxRangeSize {
		t.Errorf("lists.range(%d): %+v, %v, want its elements charged", MaxRangeSize, n, err)
	}
}
