package v1alpha1_test

import (
	"encoding/json"
	"testing"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// A Decimal reads a JSON number or, as objects stored before factor became a number hold it,
// a quoted one; it always writes a number; anything else is an error, never a zero.
func TestDecimalJSON(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    float64
		written string
	}{
		{`2`, 2, `2`}, {`1.5`, 1.5, `1.5`}, {`"1.5"`, 1.5, `1.5`}, {`"2"`, 2, `2`}, {`10.0`, 10, `10`},
	} {
		var b v1alpha1.BackoffSpec
		if err := json.Unmarshal([]byte(`{"factor":`+tc.in+`}`), &b); err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if f, err := b.Factor.Float64(); err != nil || f != tc.want {
			t.Errorf("%s reads %v (%v), want %v", tc.in, f, err, tc.want)
		}
		out, err := json.Marshal(b)
		if err != nil || string(out) != `{"factor":`+tc.written+`}` {
			t.Errorf("%s writes %s (%v), want factor %s", tc.in, out, err, tc.written)
		}
	}
	for _, bad := range []string{`"two"`, `true`, `"NaN"`, `"Inf"`, `{}`} {
		var b v1alpha1.BackoffSpec
		if err := json.Unmarshal([]byte(`{"factor":`+bad+`}`), &b); err == nil {
			t.Errorf("%s read as %q, want an error", bad, b.Factor)
		}
	}
	if out, err := json.Marshal(v1alpha1.BackoffSpec{}); err != nil || string(out) != `{}` {
		t.Errorf("an unset factor writes %s (%v), want it omitted", out, err)
	}
	if _, err := json.Marshal(v1alpha1.BackoffSpec{Factor: "x"}); err == nil {
		t.Error("a factor that is no number was written")
	}
}
