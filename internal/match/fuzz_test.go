package match

import (
	"slices"
	"strings"
	"testing"
)

// refMatch is a deliberately simple reference: split both on '.', then match token by token,
// recursively. Validity comes from the CRD's CEL rule itself.
func refMatch(pattern, eventType string) bool {
	if !celRule.MatchString(pattern) || eventType == "" {
		return false
	}
	ets := strings.Split(eventType, ".")
	for _, tok := range ets {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
	}
	return refTokens(strings.Split(pattern, "."), ets)
}

func refTokens(p, e []string) bool {
	switch {
	case len(p) == 0:
		return len(e) == 0
	case p[0] == ">":
		return len(e) >= 1
	case len(e) == 0:
		return false
	case p[0] == "*" || p[0] == e[0]:
		return refTokens(p[1:], e[1:])
	}
	return false
}

// FuzzMatch compares Valid with the CEL rule, and Match and Index.Lookup with refMatch.
// patterns holds several patterns separated by newlines; each gets the value of its position
// modulo 4, so values have several patterns.
func FuzzMatch(f *testing.F) {
	f.Add("order.created\norder.*\norder.>\n>", "order.created")
	f.Add("*.created\na.*.c.>\n*", "a.b.c.d")
	f.Add("order..created\norder.cr*\n>.x", "order.created")
	f.Add("order.>", "order")
	f.Add("a.b\na.b\na.*\n*.b", "a.b")
	f.Add("x", "x.")
	f.Add("*.*", "a.*")
	f.Add("Order_v2:x-y.*", "Order_v2:x-y.ünïcode")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, patterns, eventType string) {
		ps := strings.Split(patterns, "\n")
		ix := NewIndex[int]()
		var want []int
		for i, p := range ps {
			if Valid(p) != celRule.MatchString(p) {
				t.Fatalf("Valid(%q) = %v, CEL rule says %v", p, Valid(p), !Valid(p))
			}
			m, ref := Match(p, eventType), refMatch(p, eventType)
			if m != ref {
				t.Fatalf("Match(%q, %q) = %v, reference %v", p, eventType, m, ref)
			}
			ix.Add(p, i%4)
			if ref && !slices.Contains(want, i%4) {
				want = append(want, i%4)
			}
		}
		got := ix.Lookup(eventType, nil)
		if hasDup(got) || !sameSet(got, want) {
			t.Fatalf("Lookup(%q) = %v, reference %v; patterns %q", eventType, got, want, ps)
		}
	})
}
