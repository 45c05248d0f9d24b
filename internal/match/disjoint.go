package match

import (
	"slices"
	"strings"
)

// Covers reports whether every event type that pattern q matches is also matched by p.
func Covers(p, q string) bool {
	pt, qt := strings.Split(p, "."), strings.Split(q, ".")
	for i, tok := range pt {
		if tok == ">" {
			return len(qt) > i
		}
		if i >= len(qt) || qt[i] == ">" {
			return false
		}
		if tok != "*" && (qt[i] == "*" || qt[i] != tok) {
			return false
		}
	}
	return len(pt) == len(qt)
}

// Overlap reports whether some event type matches both patterns.
func Overlap(p, q string) bool {
	pt, qt := strings.Split(p, "."), strings.Split(q, ".")
	for i := 0; i < len(pt) && i < len(qt); i++ {
		if pt[i] == ">" || qt[i] == ">" {
			return true
		}
		if pt[i] != "*" && qt[i] != "*" && pt[i] != qt[i] {
			return false
		}
	}
	return len(pt) == len(qt)
}

// Disjoint returns patterns that match exactly the event types the given valid patterns match
// and no two of which overlap (JetStream refuses overlapping filters on one consumer): each
// pattern another one covers is dropped. ok is false when patterns overlap without one covering
// the other ("order.*" and "*.created"), which no disjoint set of patterns can express.
func Disjoint(patterns []string) (out []string, ok bool) {
	ps := slices.Clone(patterns)
	slices.Sort(ps)
	ps = slices.Compact(ps)
	for i, q := range ps {
		covered := false
		for j, p := range ps {
			if i != j && Covers(p, q) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, q)
		}
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if Overlap(out[i], out[j]) {
				return nil, false
			}
		}
	}
	return out, true
}
