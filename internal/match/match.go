// Package match matches event types against endpoint event-type patterns.
//
// Patterns follow NATS subject token rules: dot-separated tokens, where "*" matches exactly
// one token and a final ">" matches one or more tokens ("order.*", "order.>", ">"). Other
// tokens are letters, digits, '_', ':' and '-', compared exactly (case-sensitive). Event types
// are literal dot-separated tokens ("order.created").
//
// Index holds many patterns in a token trie, so finding the patterns that match an event type
// costs about the same with ten thousand literal patterns as with ten.
package match

import (
	"strings"
	"sync"
)

// Valid reports whether pattern is a valid event-type pattern. It is the rule the CRD's CEL
// validation enforces: ^((\*|[A-Za-z0-9_:-]+)\.)*(\*|>|[A-Za-z0-9_:-]+)$
func Valid(pattern string) bool {
	if pattern == "" {
		return false
	}
	for {
		tok, rest, more := strings.Cut(pattern, ".")
		switch tok {
		case "*":
		case ">":
			if more {
				return false
			}
		default:
			if !literalToken(tok) {
				return false
			}
		}
		if !more {
			return true
		}
		pattern = rest
	}
}

func literalToken(tok string) bool {
	if tok == "" {
		return false
	}
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// ValidEventType reports whether eventType can be matched: one or more non-empty
// dot-separated tokens, none of them a wildcard ("*" or ">"), as in a NATS subject one can
// publish to. Tokens may hold characters patterns cannot name; only wildcards match those.
func ValidEventType(eventType string) bool {
	if eventType == "" {
		return false
	}
	for {
		tok, rest, more := strings.Cut(eventType, ".")
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
		if !more {
			return true
		}
		eventType = rest
	}
}

// Match reports whether eventType matches pattern. An invalid pattern or event type matches
// nothing.
func Match(pattern, eventType string) bool {
	if !Valid(pattern) || !ValidEventType(eventType) {
		return false
	}
	for {
		ptok, prest, pmore := strings.Cut(pattern, ".")
		if ptok == ">" {
			return true // eventType has at least one token left
		}
		etok, erest, emore := strings.Cut(eventType, ".")
		if ptok != "*" && ptok != etok {
			return false
		}
		if !pmore || !emore {
			return pmore == emore
		}
		pattern, eventType = prest, erest
	}
}

// Index maps patterns to values and finds, for an event type, every value whose pattern
// matches. Build it with Add, then share it: Lookup may be called concurrently by any number
// of goroutines without locks, as long as no Add runs at the same time (build a new Index on
// a configuration change and swap it in, e.g. with atomic.Pointer). The zero Index is not
// usable; call NewIndex.
type Index[V comparable] struct {
	root node

	ids   map[V]int32 // value -> id
	vals  []V         // id -> value
	count []int32     // id -> number of distinct patterns
	pairs map[pair]struct{}

	// seen is a pool of per-lookup sets, used only when a value with several patterns
	// matches, to append it once.
	seen sync.Pool
}

type pair struct {
	pattern string
	id      int32
}

// node is a trie node: the tokens consumed so far lead here.
type node struct {
	lit  map[string]*node // next token literal
	star *node            // next token "*"
	end  []int32          // values of patterns that end here
	rest []int32          // values of patterns whose next, final, token is ">"
}

type seenSet struct {
	gen   uint32
	stamp []uint32 // id -> gen at which it was appended
}

// NewIndex returns an empty Index.
func NewIndex[V comparable]() *Index[V] {
	return &Index[V]{ids: map[V]int32{}, pairs: map[pair]struct{}{}}
}

// Add maps pattern to v. Adding the same pattern and value again changes nothing. An invalid
// pattern (see Valid) is ignored: it matches nothing, as with Match.
func (ix *Index[V]) Add(pattern string, v V) {
	if !Valid(pattern) {
		return
	}
	id, ok := ix.ids[v]
	if !ok {
		id = int32(len(ix.vals))
		ix.ids[v] = id
		ix.vals = append(ix.vals, v)
		ix.count = append(ix.count, 0)
	}
	if _, dup := ix.pairs[pair{pattern, id}]; dup {
		return
	}
	ix.pairs[pair{pattern, id}] = struct{}{}
	ix.count[id]++

	n := &ix.root
	for {
		tok, rest, more := strings.Cut(pattern, ".")
		switch {
		case tok == ">":
			n.rest = append(n.rest, id)
			return
		case tok == "*":
			if n.star == nil {
				n.star = &node{}
			}
			n = n.star
		default:
			c := n.lit[tok]
			if c == nil {
				if n.lit == nil {
					n.lit = map[string]*node{}
				}
				c = &node{}
				n.lit[tok] = c
			}
			n = c
		}
		if !more {
			n.end = append(n.end, id)
			return
		}
		pattern = rest
	}
}

// Len returns the number of distinct (pattern, value) pairs added.
func (ix *Index[V]) Len() int { return len(ix.pairs) }

// Lookup appends to dst each value with a pattern that matches eventType, once, even when
// several of its patterns match (values already in dst before the call are not considered),
// and returns the extended slice. It does not allocate when dst has enough capacity. An
// invalid event type (see ValidEventType) matches nothing.
func (ix *Index[V]) Lookup(eventType string, dst []V) []V {
	if !ValidEventType(eventType) {
		return dst
	}
	w := walker[V]{ix: ix, dst: dst}
	w.walk(&ix.root, eventType)
	if w.seen != nil {
		ix.seen.Put(w.seen)
	}
	return w.dst
}

type walker[V comparable] struct {
	ix   *Index[V]
	dst  []V
	seen *seenSet
}

// walk visits every trie path that matches eventType (the tokens not consumed yet, at least
// one) from n.
func (w *walker[V]) walk(n *node, eventType string) {
	w.emit(n.rest)
	tok, rest, more := strings.Cut(eventType, ".")
	if c := n.lit[tok]; c != nil {
		if more {
			w.walk(c, rest)
		} else {
			w.emit(c.end)
		}
	}
	if c := n.star; c != nil {
		if more {
			w.walk(c, rest)
		} else {
			w.emit(c.end)
		}
	}
}

func (w *walker[V]) emit(ids []int32) {
	for _, id := range ids {
		if w.ix.count[id] > 1 {
			if w.seen == nil {
				w.seen = w.ix.getSeen()
			}
			if w.seen.stamp[id] == w.seen.gen {
				continue
			}
			w.seen.stamp[id] = w.seen.gen
		}
		w.dst = append(w.dst, w.ix.vals[id])
	}
}

func (ix *Index[V]) getSeen() *seenSet {
	s, _ := ix.seen.Get().(*seenSet)
	if s == nil {
		s = &seenSet{}
	}
	if len(s.stamp) < len(ix.vals) {
		s.stamp = make([]uint32, len(ix.vals))
		s.gen = 0
	}
	s.gen++
	if s.gen == 0 { // wrapped: forget every stamp
		clear(s.stamp)
		s.gen = 1
	}
	return s
}
