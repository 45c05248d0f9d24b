package expr

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
)

// typicalEvent is a 1 KB order event.
var typicalEvent = func() []byte {
	var items []string
	for i := range 6 {
		items = append(items, fmt.Sprintf(`{"sku":"sku-%04d","name":"Item number %d","qty":%d,"price":%d.99,"tags":["a","b"]}`, i, i, i+1, 10+i))
	}
	b := []byte(`{"order_id":"ord_2001","total":142.5,"currency":"EUR","status":"paid","created_at":"2026-11-30T10:00:00Z",` +
		`"customer":{"id":"cus_42","name":"Zoë Example","email":"zoe@example.com","country":"PT"},` +
		`"shipping":{"method":"express","address":{"line1":"Rua Example 1","city":"Lisboa","zip":"1000-001"}},` +
		`"items":[` + strings.Join(items, ",") + `]}`)
	return b
}()

func benchEvent() *Event {
	e := event(string(typicalEvent))
	return e
}

// benchEval runs eval on a fresh event (the first expression to read payload parses the
// body) and on one whose body is already parsed (the next ones).
func benchEval(b *testing.B, eval func(in *Input) error) {
	b.Run("parse+eval", func(b *testing.B) {
		b.SetBytes(int64(len(typicalEvent)))
		b.ReportAllocs()
		for b.Loop() {
			if err := eval(NewInput(benchEvent())); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("eval", func(b *testing.B) {
		in := NewInput(benchEvent())
		b.ReportAllocs()
		for b.Loop() {
			if err := eval(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// matching is a filter's evaluation that must be true.
func matching(f *Filter) func(in *Input) error {
	return func(in *Input) error {
		ok, err := f.Match(context.Background(), in)
		if err == nil && !ok {
			err = fmt.Errorf("%s did not match", f.Source())
		}
		return err
	}
}

// BenchmarkFilter is the cost of a filter per delivery on a 1 KB event, with the body's parse
// and without, and of one that iterates over the event's items.
func BenchmarkFilter(b *testing.B) {
	f, err := CompileFilter(`payload.total > 100.0 && payload.currency == "EUR" && headers["x-region"] == "eu"`)
	if err != nil {
		b.Fatal(err)
	}
	benchEval(b, matching(f))
	b.Run("iterating", func(b *testing.B) {
		f, err := CompileFilter(`payload.items.exists(i, i.sku == "sku-0005" && i.qty > 1)`)
		if err != nil {
			b.Fatal(err)
		}
		benchEval(b, matching(f))
	})
}

// BenchmarkTransform is the cost of a Slack-shaped transformation with a header per delivery
// on a 1 KB event, with the body's parse and without.
func BenchmarkTransform(b *testing.B) {
	tr, err := CompileTransform(`{"text": "Order " + payload.order_id + " paid: " + string(payload.total) + " " + payload.currency,
		"blocks": payload.items.map(i, {"type": "section", "text": i.name + " x" + string(i.qty)})}`,
		map[string]string{"X-Order-Id": "payload.order_id"})
	if err != nil {
		b.Fatal(err)
	}
	benchEval(b, func(in *Input) error {
		_, err := tr.Apply(context.Background(), in)
		return err
	})
}

// BenchmarkIteration shows why CEL's runtime cost tracking (cel.CostLimit) is not used: a
// pass over a 20,000-element list, with it and without it.
func BenchmarkIteration(b *testing.B) {
	data := []byte(`{"items":[` + strings.Repeat(`{"sku":"x","qty":1},`, 19999) + `{"sku":"x","qty":1}]}`)
	const src = `payload.items.exists(i, i.qty < 0)`
	for _, tc := range []struct {
		name string
		opts []cel.ProgramOption
	}{
		{"without cost tracking", nil},
		{"with cel.CostLimit", []cel.ProgramOption{cel.CostLimit(1 << 40)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e, err := env()
			if err != nil {
				b.Fatal(err)
			}
			ast, iss := e.Compile(src)
			if iss.Err() != nil {
				b.Fatal(iss.Err())
			}
			prg, err := e.Program(ast, tc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			in := NewInput(&Event{Data: data})
			in.IsJSON()
			for b.Loop() {
				if _, _, err := prg.Eval(&evalState{Input: in}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
