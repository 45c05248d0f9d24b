package match

import (
	"slices"
	"testing"
)

func TestCoversAndOverlap(t *testing.T) {
	for _, tc := range []struct {
		p, q           string
		covers, overlp bool
	}{
		{">", "a", true, true},
		{">", "a.b.>", true, true},
		{"a.>", "a", false, false},
		{"a.>", "a.b", true, true},
		{"a.>", "a.*.c", true, true},
		{"a.*", "a.b", true, true},
		{"a.b", "a.*", false, true},
		{"a.*", "*.b", false, true},
		{"a.*", "b.*", false, false},
		{"a.*", "a.*.c", false, false},
		{"a.*.>", "a.b.c", true, true},
		{"a.b", "a.b", true, true},
		{"a.b", "a.c", false, false},
		{"*", "a.b", false, false},
		{"*.>", "a", false, false},
	} {
		if got := Covers(tc.p, tc.q); got != tc.covers {
			t.Errorf("Covers(%q, %q) = %v", tc.p, tc.q, got)
		}
		if got := Overlap(tc.p, tc.q); got != tc.overlp {
			t.Errorf("Overlap(%q, %q) = %v", tc.p, tc.q, got)
		}
		if got := Overlap(tc.q, tc.p); got != tc.overlp {
			t.Errorf("Overlap(%q, %q) = %v", tc.q, tc.p, got)
		}
	}
}

func TestDisjoint(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
		ok   bool
	}{
		{[]string{"order.created", "order.*", "order.created"}, []string{"order.*"}, true},
		{[]string{"order.refund.*", "order.created", "invoice.>"}, []string{"invoice.>", "order.created", "order.refund.*"}, true},
		{[]string{">", "a.b"}, []string{">"}, true},
		{[]string{"order.*", "*.created"}, nil, false},
	} {
		got, ok := Disjoint(tc.in)
		if ok != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("Disjoint(%v) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// Every event type matched by the patterns is matched by exactly one of the disjoint set.
func FuzzDisjointMatchesTheSame(f *testing.F) {
	f.Add("order.*", "order.created", "a.>", "order.created")
	f.Add("*.x", "a.*", ">", "a.x")
	f.Fuzz(func(t *testing.T, p1, p2, p3, ev string) {
		ps := []string{}
		for _, p := range []string{p1, p2, p3} {
			if Valid(p) {
				ps = append(ps, p)
			}
		}
		if len(ps) == 0 || !ValidEventType(ev) {
			return
		}
		out, ok := Disjoint(ps)
		if !ok {
			return
		}
		want := false
		for _, p := range ps {
			want = want || Match(p, ev)
		}
		n := 0
		for _, p := range out {
			if Match(p, ev) {
				n++
			}
		}
		if want && n != 1 || !want && n != 0 {
			t.Fatalf("%v -> %v: %q matched by %d", ps, out, ev, n)
		}
	})
}
