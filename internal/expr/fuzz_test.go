package expr

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
)

// FuzzEval compiles any source as a filter and as a transformation and evaluates what
// compiles on any body: nothing panics, every error is an *Error, and a body is bounded and,
// when JSON, valid JSON.
func FuzzEval(f *testing.F) {
	for _, seed := range []struct{ src, data string }{
		{`payload.total > 100 && payload.currency == "EUR"`, order},
		{`{"text": "Order " + payload.order_id + " paid"}`, order},
		{`has(payload.total)`, "not json"},
		{`payload.items.map(i, {"sku": i.sku, "n": i.qty * 2})`, order},
		{`raw.replace("a", "bb").split("b").join("-")`, "abcabc\xff"},
		{`"%s:%d".format([payload.order_id, payload.total])`, order},
		{`headers["x-region"] + id + ns + type + string(time)`, ""},
		{`payload.?customer.?name.orValue("—")`, `{"customer":{"name":"Zoë"}}`},
		{`[1, 2.5, "x", b"y", null, true, duration("1s")]`, `[]`},
		{`payload[0] / payload[1]`, `[1, 0]`},
		{`payload.n == 1e400`, `{"n": 1e400}`},
	} {
		f.Add(seed.src, []byte(seed.data))
	}
	f.Fuzz(func(t *testing.T, src string, data []byte) {
		in := NewInput(event(string(data)))
		ctx := context.Background()
		if flt, err := CompileFilter(src); err != nil {
			isError(t, err)
		} else if _, err := flt.Match(ctx, in); err != nil {
			isError(t, err)
		}
		tr, err := CompileTransform(src, map[string]string{"X-Out": src})
		if err != nil {
			isError(t, err)
			return
		}
		out, err := tr.Apply(ctx, in)
		if err != nil {
			isError(t, err)
			return
		}
		if len(out.Body) > MaxBodyBytes {
			t.Fatalf("body of %d bytes", len(out.Body))
		}
		if out.ContentType == ContentTypeJSON && !json.Valid(out.Body) {
			t.Fatalf("invalid JSON body %q", out.Body)
		}
		if v := out.Headers.Get("X-Out"); len(v) > MaxHeaderValueBytes {
			t.Fatalf("header of %d bytes", len(v))
		}
	})
}

func isError(t *testing.T, err error) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Field == "" || e.Msg == "" {
		t.Fatalf("error %v (%T) is not a complete *expr.Error", err, err)
	}
}
