package match

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// celRule is the CRD's CEL validation of an event-type pattern (RE2, as CEL's matches()).
var celRule = regexp.MustCompile(`^((\*|[A-Za-z0-9_:-]+)\.)*(\*|>|[A-Za-z0-9_:-]+)$`)

func TestValid(t *testing.T) {
	cases := []struct {
		pattern string
		want    bool
	}{
		{"order.created", true},
		{"order", true},
		{"order.*", true},
		{"order.>", true},
		{"*", true},
		{">", true},
		{"*.created", true},
		{"*.*.*", true},
		{"a.*.>", true},
		{"Order_v2:x-y.Created", true},
		{"0.1.2", true},
		{"", false},
		{".", false},
		{"order.", false},
		{".order", false},
		{"order..created", false},
		{"order.>.x", false},
		{">.x", false},
		{">>", false},
		{"order.cr*", false},
		{"order.**", false},
		{"ord>er", false},
		{"order created", false},
		{"order.created\n", false},
		{"order/created", false},
		{"ordér", false},
		{"a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p", true},
	}
	for _, tc := range cases {
		if got := Valid(tc.pattern); got != tc.want {
			t.Errorf("Valid(%q) = %v, want %v", tc.pattern, got, tc.want)
		}
		if cel := celRule.MatchString(tc.pattern); cel != tc.want {
			t.Errorf("the CEL rule says %v for %q; the table is wrong", cel, tc.pattern)
		}
	}
}

func TestValidEventType(t *testing.T) {
	for s, want := range map[string]bool{
		"order.created": true, "order": true, "a.b.c": true, "order.créé": true, "x$y": true,
		"": false, ".": false, "a.": false, ".a": false, "a..b": false, "a.*": false, "a.>": false, "*": false, ">": false,
		"a.*b": true, "a.b>": true,
	} {
		if got := ValidEventType(s); got != want {
			t.Errorf("ValidEventType(%q) = %v, want %v", s, got, want)
		}
	}
}

var matchCases = []struct {
	pattern, eventType string
	want               bool
}{
	{"order.created", "order.created", true},
	{"order.created", "order.updated", false},
	{"order.created", "order", false},
	{"order.created", "order.created.v2", false},
	{"order.created", "Order.created", false},
	{"order", "order", true},
	{"order", "order.created", false},
	{"order.*", "order.created", true},
	{"order.*", "order", false},
	{"order.*", "order.created.v2", false},
	{"order.*", "invoice.created", false},
	{"*.created", "order.created", true},
	{"*.created", "order.updated", false},
	{"*", "order", true},
	{"*", "order.created", false},
	{"*.*", "order.created", true},
	{"order.>", "order.created", true},
	{"order.>", "order.created.v2.x", true},
	{"order.>", "order", false},
	{"order.>", "orders.created", false},
	{">", "order", true},
	{">", "order.created.v2", true},
	{"*.>", "order", false},
	{"*.>", "order.created", true},
	{"a.*.c.>", "a.b.c.d", true},
	{"a.*.c.>", "a.b.c", false},
	{"a.*.c.>", "a.b.x.d", false},
	{"order.*", "order.créé", true},
	{"order.>", "order.x$y", true},
	// Invalid patterns and event types match nothing.
	{"order..created", "order..created", false},
	{"order.cr*", "order.created", false},
	{"", "", false},
	{">", "", false},
	{"*", "*", false},
	{"order.*", "order.*", false},
	{"order.>", "order.>", false},
	{"order.>", "order..x", false},
	{"order.*", "order.", false},
}

func TestMatch(t *testing.T) {
	for _, tc := range matchCases {
		if got := Match(tc.pattern, tc.eventType); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.pattern, tc.eventType, got, tc.want)
		}
		if ref := refMatch(tc.pattern, tc.eventType); ref != tc.want {
			t.Errorf("the reference says %v for (%q, %q); the table is wrong", ref, tc.pattern, tc.eventType)
		}
	}
}

func TestIndexLookup(t *testing.T) {
	ix := NewIndex[string]()
	for _, a := range []struct{ pattern, endpoint string }{
		{"order.created", "orders-created"},
		{"order.*", "orders-any"},
		{"order.>", "orders-deep"},
		{">", "firehose"},
		{"*.created", "all-created"},
		{"invoice.paid", "invoices"},
		// One endpoint with several patterns that can all match the same event type.
		{"order.created", "multi"},
		{"order.*", "multi"},
		{"*.created", "multi"},
		{">", "multi"},
		// Added twice.
		{"invoice.paid", "invoices"},
		// Invalid: ignored.
		{"order..created", "broken"},
		{"order.cr*", "broken"},
	} {
		ix.Add(a.pattern, a.endpoint)
	}
	if got, want := ix.Len(), 10; got != want {
		t.Errorf("Len = %d, want %d", got, want)
	}
	cases := []struct {
		eventType string
		want      []string
	}{
		{"order.created", []string{"orders-created", "orders-any", "orders-deep", "firehose", "all-created", "multi"}},
		{"order.updated", []string{"orders-any", "orders-deep", "firehose", "multi"}},
		{"order.created.v2", []string{"orders-deep", "firehose", "multi"}},
		{"order", []string{"firehose", "multi"}},
		{"invoice.paid", []string{"invoices", "firehose", "multi"}},
		{"invoice.created", []string{"firehose", "all-created", "multi"}},
		{"user", []string{"firehose", "multi"}},
		{"", nil},
		{"order..created", nil},
		{"order.*", nil},
	}
	for _, tc := range cases {
		got := ix.Lookup(tc.eventType, nil)
		if !sameSet(got, tc.want) {
			t.Errorf("Lookup(%q) = %q, want %q (any order)", tc.eventType, got, tc.want)
		}
		if hasDup(got) {
			t.Errorf("Lookup(%q) = %q has duplicates", tc.eventType, got)
		}
	}
}

func TestLookupAppendsToDst(t *testing.T) {
	ix := NewIndex[int]()
	ix.Add("a.*", 1)
	ix.Add("a.b", 1)
	ix.Add("a.>", 2)
	dst := []int{1, 7}
	got := ix.Lookup("a.b", dst)
	slices.Sort(got[2:])
	if !slices.Equal(got, []int{1, 7, 1, 2}) {
		t.Fatalf("Lookup = %v, want [1 7] followed by 1 and 2", got)
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	ix := NewIndex[int]()
	for i := range 1000 {
		ix.Add(fmt.Sprintf("svc%d.created", i), i)
		ix.Add(fmt.Sprintf("svc%d.*", i), i) // several patterns per value: the dedup path
	}
	ix.Add(">", -1)
	ix.Add("*.created", -1)
	dst := make([]int, 0, 16)
	ix.Lookup("svc7.created", dst) // warm the pool
	allocs := testing.AllocsPerRun(1000, func() {
		dst = ix.Lookup("svc7.created", dst[:0])
	})
	if allocs != 0 && !raceEnabled {
		t.Errorf("Lookup: %v allocations, want 0", allocs)
	}
	if !sameSet(dst, []int{7, -1}) {
		t.Errorf("Lookup = %v", dst)
	}
}

func TestIndexConcurrentLookups(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ix := NewIndex[int]()
	var patterns []string
	for i := range 500 {
		p := randPattern(rng)
		patterns = append(patterns, p)
		ix.Add(p, i%97)
	}
	types := make([]string, 200)
	wants := make([][]int, len(types))
	for i := range types {
		types[i] = randEventType(rng)
		wants[i] = ix.Lookup(types[i], nil)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for g := range 8 {
		wg.Go(func() {
			var dst []int
			for n := range 5000 {
				i := (n*7 + g) % len(types)
				dst = ix.Lookup(types[i], dst[:0])
				if !slices.Equal(dst, wants[i]) {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("Lookup(%q) = %v, want %v", types[i], dst, wants[i]))
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatal(failures[0])
	}
}

// Many generations of the dedup set, including a wrap of its counter, stay correct.
func TestSeenSetWraps(t *testing.T) {
	ix := NewIndex[int]()
	ix.Add("a.*", 1)
	ix.Add("a.b", 1)
	s := ix.getSeen()
	s.gen = ^uint32(0) - 2
	ix.seen.Put(s)
	for range 10 {
		if got := ix.Lookup("a.b", nil); !slices.Equal(got, []int{1}) {
			t.Fatalf("Lookup = %v, want [1]", got)
		}
	}
}

// Property: Index agrees with Match over random patterns and event types.
func TestIndexAgreesWithMatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 7))
	for round := range 200 {
		ix := NewIndex[int]()
		type added struct {
			pattern string
			v       int
		}
		var all []added
		for range 1 + rng.IntN(60) {
			a := added{randPattern(rng), rng.IntN(15)}
			all = append(all, a)
			ix.Add(a.pattern, a.v)
		}
		for range 50 {
			et := randEventType(rng)
			var want []int
			for _, a := range all {
				if Match(a.pattern, et) && !slices.Contains(want, a.v) {
					want = append(want, a.v)
				}
			}
			got := ix.Lookup(et, nil)
			if hasDup(got) || !sameSet(got, want) {
				t.Fatalf("round %d: Lookup(%q) = %v, Match says %v; patterns %v", round, et, got, want, all)
			}
		}
	}
}

func randPattern(rng *rand.Rand) string {
	toks := []string{"a", "b", "c", "*", "*", "order", "created"}
	n := 1 + rng.IntN(4)
	parts := make([]string, n)
	for i := range parts {
		parts[i] = toks[rng.IntN(len(toks))]
	}
	if rng.IntN(4) == 0 {
		parts[n-1] = ">"
	}
	return strings.Join(parts, ".")
}

func randEventType(rng *rand.Rand) string {
	toks := []string{"a", "b", "c", "d", "order", "created"}
	n := 1 + rng.IntN(5)
	parts := make([]string, n)
	for i := range parts {
		parts[i] = toks[rng.IntN(len(toks))]
	}
	return strings.Join(parts, ".")
}

func sameSet[V comparable](got, want []V) bool {
	if len(got) != len(want) {
		return false
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

func hasDup[V comparable](s []V) bool {
	seen := map[V]bool{}
	for _, v := range s {
		if seen[v] {
			return true
		}
		seen[v] = true
	}
	return false
}

// benchIndex builds n patterns the way a namespace with many endpoints might: mostly literal
// event types, some "service.*" and "service.>" filters, and a few firehoses.
func benchIndex(n int) (*Index[int], []string) {
	ix := NewIndex[int]()
	var types []string
	for i := range n {
		svc, ent := i/10, i%10
		switch i % 20 {
		case 0:
			ix.Add(fmt.Sprintf("svc%d.*", svc), i)
		case 1:
			ix.Add(fmt.Sprintf("svc%d.>", svc), i)
		default:
			et := fmt.Sprintf("svc%d.entity%d.created", svc, ent)
			ix.Add(et, i)
			types = append(types, et)
		}
	}
	ix.Add(">", -1)
	ix.Add("*.*.created", -2)
	return ix, types
}

func benchmarkLookup(b *testing.B, n int) {
	ix, types := benchIndex(n)
	dst := make([]int, 0, 16)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		dst = ix.Lookup(types[i%len(types)], dst[:0])
		i++
	}
	if len(dst) < 3 {
		b.Fatalf("Lookup found %v", dst)
	}
}

func BenchmarkLookup1000(b *testing.B)  { benchmarkLookup(b, 1000) }
func BenchmarkLookup10000(b *testing.B) { benchmarkLookup(b, 10000) }

// BenchmarkLinearMatch1000 is the naive alternative (Match against every pattern), for scale.
func BenchmarkLinearMatch1000(b *testing.B) {
	var patterns []string
	for i := range 1000 {
		patterns = append(patterns, fmt.Sprintf("svc%d.entity%d.created", i/10, i%10))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		et := patterns[i%len(patterns)]
		n := 0
		for _, p := range patterns {
			if Match(p, et) {
				n++
			}
		}
		i++
	}
}

func BenchmarkMatch(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if !Match("order.*.v2.>", "order.created.v2.eu.west") {
			b.Fatal("no match")
		}
	}
}
