package expr

import (
	"fmt"
	"math/bits"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/functions"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/interpreter"
)

// Bounds of what one evaluation builds, checked before building it. They bound the memory
// of an evaluation whatever the expression: CEL's cost estimate counts building a string at a
// tenth of a unit per byte, too little to bound memory, and a string doubled again and again
// with cel.bind escapes it.
const (
	// MaxValueBytes bounds a string or bytes an expression builds (+, replace, join, format).
	MaxValueBytes = 4 << 20
	// MaxListLength bounds a list an expression builds (+, and so map and filter; flatten,
	// split).
	MaxListLength = 1 << 20
	// MaxBuiltBytes bounds what one evaluation builds in all: the bytes of the strings and
	// bytes above, listElementBytes per element of a list and mapEntryBytes per entry of a
	// map (literals, lists.range, flatten, slice, sort, split, a comprehension's result...).
	MaxBuiltBytes = 32 << 20
)

// need is what a call will cost, as its guard sees it from its arguments.
type need struct {
	// bytes are what its result takes, charged before the call.
	bytes int
	// cost is its work.
	cost int64
	// upTo, when set, bounds its result's bytes, which must fit in what the evaluation may
	// still build; the result's actual size is charged after the call (and bounded by
	// MaxValueBytes).
	upTo int64
}

// A guard checks a call's arguments (s is the evaluation's meter, nil outside one) and
// returns what the call will cost, or why it must not be made.
type guard func(s *evalState, a []ref.Val) (need, error)

// guards are the functions whose work or result can outgrow their arguments: every function
// of the environment that builds a string, a list or a map (the standard library's +,
// string and bytes; ext.Strings, ext.Encoders, ext.Lists), and those whose work goes through
// lists, maps or strings (membership, ext.Sets, ext.Math's greatest and least, searching a
// string). ext.Bindings builds nothing (cel.bind is a comprehension, metered per iteration);
// list and map literals are metered where they are (meterLiteral), comparisons by
// meteredEquality.
var guards = map[string]guard{
	operators.Add: func(_ *evalState, a []ref.Val) (need, error) {
		if _, ok := a[0].(traits.Lister); ok {
			n := listLen(a[0]) + listLen(a[1])
			if n > MaxListLength {
				return need{}, fmt.Errorf("the list would have %d elements; an expression builds lists of at most %d", n, MaxListLength)
			}
			// What is added: an accumulator grows in place.
			return need{bytes: listElementBytes * listLen(a[1]), cost: int64(listLen(a[1])) + 1}, nil
		}
		return bytesNeed(strLen(a[0]) + strLen(a[1]))
	},
	"replace": func(_ *evalState, a []ref.Val) (need, error) {
		s, _ := a[0].(types.String)
		old, _ := a[1].(types.String)
		repl, _ := a[2].(types.String)
		count := 0
		if old == "" {
			count = utf8.RuneCountInString(string(s)) + 1
		} else {
			count = strings.Count(string(s), string(old))
		}
		if len(a) == 4 {
			if limit, ok := a[3].(types.Int); ok && limit >= 0 && int64(count) > int64(limit) {
				count = int(limit)
			}
		}
		return bytesNeed(len(s) + count*(len(repl)-len(old)))
	},
	"join": func(_ *evalState, a []ref.Val) (need, error) {
		n, sep, elems := 0, 0, 0
		if len(a) == 2 {
			sep = strLen(a[1])
		}
		if l, ok := a[0].(traits.Lister); ok {
			for it := l.Iterator(); it.HasNext() == types.True; {
				n += strLen(it.Next()) + sep
				elems++
			}
		}
		nd, err := bytesNeed(n)
		nd.cost += int64(elems)
		return nd, err
	},
	"format": func(s *evalState, a []ref.Val) (need, error) {
		// A string argument is written as it is, any other value as text (a list's strings
		// quoted and escaped): at most its rendered size.
		n, w := int64(strLen(a[0])), weight{}
		if l, ok := a[1].(traits.Lister); ok {
			for it := l.Iterator(); it.HasNext() == types.True; {
				switch v := it.Next(); v.(type) {
				case types.String, types.Bytes:
					n += int64(strLen(v))
				default:
					vw := weigh(v, s.remaining()-w.nodes)
					w.nodes, w.text = w.nodes+vw.nodes, w.text+vw.text
				}
			}
		}
		return need{cost: w.nodes + n/10 + 1, upTo: n + w.rendered()}, nil
	},
	"strings.quote": func(_ *evalState, a []ref.Val) (need, error) {
		// Invalid bytes become U+FFFD (three bytes), quotes and control characters two.
		n := int64(strLen(a[0]))
		return need{cost: n/10 + 1, upTo: 3*n + 2}, nil
	},
	"json.encode": func(s *evalState, a []ref.Val) (need, error) {
		// The value is copied into protobuf's JSON values (about 128 bytes each) and written.
		w := weigh(a[0], s.remaining())
		return need{cost: w.nodes + w.text/10, upTo: 128*w.nodes + 8*w.text}, nil
	},
	"base64.encode": func(_ *evalState, a []ref.Val) (need, error) {
		return bytesNeed((strLen(a[0]) + 2) / 3 * 4)
	},
	"base64.decode": func(_ *evalState, a []ref.Val) (need, error) {
		return bytesNeed(strLen(a[0]) / 4 * 3)
	},
	"string": copyGuard,
	"bytes":  copyGuard,
	"lowerAscii": func(_ *evalState, a []ref.Val) (need, error) {
		return bytesNeed(strLen(a[0]))
	},
	"upperAscii": func(_ *evalState, a []ref.Val) (need, error) {
		return bytesNeed(strLen(a[0]))
	},
	// substring, charAt, indexOf and lastIndexOf go through the string as runes; indexOf and
	// lastIndexOf compare the substring at every place.
	"substring": runesGuard,
	"charAt":    runesGuard,
	"indexOf": func(_ *evalState, a []ref.Val) (need, error) {
		return need{cost: int64(strLen(a[0])) * int64(max(strLen(a[1]), 1)) / 10}, nil
	},
	"lastIndexOf": func(_ *evalState, a []ref.Val) (need, error) {
		return need{cost: int64(strLen(a[0])) * int64(max(strLen(a[1]), 1)) / 10}, nil
	},
	"contains":   scanGuard,
	"startsWith": scanGuard,
	"endsWith":   scanGuard,
	"trim":       scanGuard,
	"matches": func(_ *evalState, a []ref.Val) (need, error) {
		if p := strLen(a[1]); p > MaxPatternBytes {
			return need{}, fmt.Errorf("the regular expression is %d bytes; one computed when the expression runs is at most %d", p, MaxPatternBytes)
		}
		return need{cost: int64(strLen(a[0]))/10 + int64(strLen(a[1]))*10}, nil
	},
	"split": func(_ *evalState, a []ref.Val) (need, error) {
		s, _ := a[0].(types.String)
		sep, _ := a[1].(types.String)
		n := 0
		if sep == "" {
			n = utf8.RuneCountInString(string(s))
		} else {
			n = strings.Count(string(s), string(sep)) + 1
		}
		if len(a) == 3 {
			if limit, ok := a[2].(types.Int); ok && limit >= 0 && int64(n) > int64(limit) {
				n = int(limit)
			}
		}
		return listNeed(n, int64(len(s))/10)
	},
	"reverse": func(_ *evalState, a []ref.Val) (need, error) {
		if _, ok := a[0].(traits.Lister); ok {
			return listNeed(listLen(a[0]), 0)
		}
		nd, err := bytesNeed(strLen(a[0]))
		nd.cost += int64(strLen(a[0])) / 10
		return nd, err
	},
	"lists.range": func(_ *evalState, a []ref.Val) (need, error) {
		n, _ := a[0].(types.Int)
		if n > MaxRangeSize {
			return need{}, fmt.Errorf("lists.range(%d): an expression makes ranges of at most %d elements", n, MaxRangeSize)
		}
		return listNeed(int(max(n, 0)), 0)
	},
	"slice": func(_ *evalState, a []ref.Val) (need, error) {
		start, _ := a[1].(types.Int)
		end, _ := a[2].(types.Int)
		return listNeed(int(max(min(int64(end), int64(listLen(a[0])))-int64(start), 0)), 0)
	},
	"flatten": func(s *evalState, a []ref.Val) (need, error) {
		depth := int64(1)
		if len(a) == 2 {
			if d, ok := a[1].(types.Int); ok {
				depth = int64(d)
			}
		}
		n, walked := flattened(a[0], depth, min(s.remaining(), MaxListLength))
		if n > MaxListLength {
			return need{}, fmt.Errorf("the flattened list would have more than %d elements; an expression builds lists of at most %d", MaxListLength, MaxListLength)
		}
		return listNeed(int(n), walked)
	},
	"sort":                  sortGuard,
	"@sortByAssociatedKeys": sortGuard,
	"distinct": func(s *evalState, a []ref.Val) (need, error) {
		// Every element is compared with the ones kept before it.
		n := int64(listLen(a[0]))
		w := weigh(a[0], s.remaining())
		return listNeed(int(n), satMul(n, w.units()))
	},
	operators.In: func(s *evalState, a []ref.Val) (need, error) {
		n := int64(1)
		if _, ok := a[1].(traits.Lister); ok {
			n = int64(listLen(a[1]))
		}
		if !isContainer(a[0]) {
			return need{cost: n}, nil
		}
		// Each element is compared with the value, at most through all of it.
		return need{cost: satMul(n, weigh(a[0], s.remaining()/max(n, 1)+1).units())}, nil
	},
	"sets.contains":   setsGuard,
	"sets.equivalent": setsGuard,
	"sets.intersects": setsGuard,
	"math.@max":       listScanGuard,
	"math.@min":       listScanGuard,
}

// bytesNeed is a string or bytes of n bytes.
func bytesNeed(n int) (need, error) {
	if n > MaxValueBytes {
		return need{}, fmt.Errorf("the value would be %d bytes; an expression builds strings of at most %d", n, MaxValueBytes)
	}
	return need{bytes: n, cost: int64(n)/10 + 1}, nil
}

// listNeed is a list of n elements, built with work more units besides.
func listNeed(n int, work int64) (need, error) {
	if n > MaxListLength {
		return need{}, fmt.Errorf("the list would have %d elements; an expression builds lists of at most %d", n, MaxListLength)
	}
	return need{bytes: listElementBytes * n, cost: int64(n) + work + 1}, nil
}

// copyGuard is string() and bytes(): a copy of a string or bytes, or a number's text.
func copyGuard(_ *evalState, a []ref.Val) (need, error) {
	if len(a) == 1 {
		switch a[0].(type) {
		case types.String, types.Bytes:
			return bytesNeed(strLen(a[0]))
		}
	}
	return need{bytes: 32, cost: 1}, nil
}

// runesGuard is a function that reads a string as runes (four bytes each, for a moment).
func runesGuard(_ *evalState, a []ref.Val) (need, error) {
	n := strLen(a[0])
	if 4*n > MaxBuiltBytes {
		return need{}, fmt.Errorf("the string is %d bytes, too long to read as characters here", n)
	}
	return need{cost: int64(n)/10 + 1}, nil
}

// scanGuard is a function that goes through a string once.
func scanGuard(_ *evalState, a []ref.Val) (need, error) {
	return need{cost: int64(strLen(a[0]))/10 + 1}, nil
}

// listScanGuard is a function that goes through its list argument once (ext.Math's
// greatest and least).
func listScanGuard(_ *evalState, a []ref.Val) (need, error) {
	n := int64(1)
	for _, v := range a {
		n += int64(listLen(v))
	}
	return need{cost: n}, nil
}

// sortGuard is sort and sortBy: a new list of the same elements, n log n comparisons.
func sortGuard(_ *evalState, a []ref.Val) (need, error) {
	n := listLen(a[0])
	return listNeed(n, int64(n)*int64(bits.Len(uint(n))))
}

// setsGuard is ext.Sets: every element of one list compared with every element of the
// other, each comparison at most through the smaller one.
func setsGuard(s *evalState, a []ref.Val) (need, error) {
	na, nb := int64(listLen(a[0])), int64(listLen(a[1]))
	wa := weigh(a[0], s.remaining()/max(nb, 1)+1).units()
	wb := weigh(a[1], s.remaining()/max(na, 1)+1).units()
	return need{cost: satAdd(min(satMul(nb, wa), satMul(na, wb)), na+nb)}, nil
}

// flattened counts the elements of list flattened to depth, each list (at each depth) walked
// once, at most limit elements in all: the count (above limit when there are more) and the
// values walked.
func flattened(v ref.Val, depth, limit int64) (n, walked int64) {
	type key struct {
		l     ref.Val
		depth int64
	}
	seen := map[key]int64{}
	var count func(l traits.Lister, depth int64) int64
	count = func(l traits.Lister, depth int64) int64 {
		k := key{l, depth}
		memo := reflect.TypeOf(l).Kind() == reflect.Pointer
		if got, ok := seen[k]; ok && memo {
			return got
		}
		var n int64
		for it := l.Iterator(); it.HasNext() == types.True && walked <= limit && n <= limit; {
			e := it.Next()
			walked++
			if inner, ok := e.(traits.Lister); ok && depth > 0 {
				n = satAdd(n, count(inner, depth-1))
				continue
			}
			n++
		}
		if walked > limit {
			n = max(n, limit+1)
		}
		if memo {
			seen[k] = n
		}
		return n
	}
	if l, ok := v.(traits.Lister); ok {
		n = count(l, depth)
	}
	return n, walked
}

func strLen(v ref.Val) int {
	switch x := v.(type) {
	case types.String:
		return len(x)
	case types.Bytes:
		return len(x)
	}
	return 0
}

func listLen(v ref.Val) int {
	if l, ok := v.(traits.Lister); ok {
		if n, ok := l.Size().(types.Int); ok {
			return int(n)
		}
	}
	return 0
}

// meteredProgram returns the decorator that meters one compiled expression: each call of a
// guarded function checks and charges what it will cost before it is made, each comparison
// of lists or maps is charged its walk (meteredEquality), each list or map literal what it
// builds, and each iteration of a comprehension (loopSteps are the ids of their loop steps) a
// unit of work.
func meteredProgram(impls map[string]*functions.Overload, loopSteps map[int64]bool) interpreter.InterpretableDecoratorV2 {
	return func(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
		out := i
		if call, ok := i.(interpreter.InterpretableCall); ok {
			switch fn := call.Function(); {
			case fn == operators.Equals || fn == operators.NotEquals:
				args := call.Args()
				if len(args) == 2 {
					out = &meteredEquality{InterpretableCall: call, lhs: args[0], rhs: args[1], negate: fn == operators.NotEquals}
				}
			case guards[fn] != nil:
				impl := impls[call.OverloadID()]
				if impl == nil {
					impl = impls[fn]
				}
				if impl == nil {
					return nil, fmt.Errorf("no implementation of %s (%s) to guard", fn, call.OverloadID())
				}
				out = &guardedCall{InterpretableCall: call, guard: guards[fn], impl: impl}
			}
		} else if lit := meterLiteral(i); lit != nil {
			out = lit
		}
		if loopSteps[i.ID()] {
			out = &meteredStep{InterpretableV2: out}
		}
		return out, nil
	}
}

// guardedImpls are the implementations of the guarded functions, by overload id (and by
// name for a function called by name).
func guardedImpls(e *cel.Env) (map[string]*functions.Overload, error) {
	impls := map[string]*functions.Overload{}
	for name := range guards {
		fn := e.Functions()[name]
		if fn == nil {
			return nil, fmt.Errorf("no function %s to guard", name)
		}
		bindings, err := fn.Bindings()
		if err != nil {
			return nil, err
		}
		for _, b := range bindings {
			impls[b.Operator] = b
		}
	}
	return impls, nil
}

// guardedCall is a call whose cost is checked and charged before it is made.
type guardedCall struct {
	interpreter.InterpretableCall
	guard guard
	impl  *functions.Overload
}

// Eval implements interpreter.Interpretable.
func (c *guardedCall) Eval(vars interpreter.Activation) ref.Val {
	args := c.Args()
	vals := make([]ref.Val, len(args))
	for i, a := range args {
		vals[i] = a.Eval(vars)
	}
	return c.call(vars, vals)
}

// Exec implements interpreter.InterpretableV2.
func (c *guardedCall) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	args := c.Args()
	vals := make([]ref.Val, len(args))
	for i, a := range args {
		vals[i] = a.Exec(frame)
	}
	return c.call(frame, vals)
}

func (c *guardedCall) call(vars interpreter.Activation, vals []ref.Val) ref.Val {
	for _, v := range vals {
		if types.IsUnknownOrError(v) {
			return v
		}
	}
	s := stateOf(vars)
	n, err := c.guard(s, vals)
	if err != nil {
		if s != nil {
			return s.fail(c.ID(), err.Error())
		}
		return types.NewErrWithNodeID(c.ID(), "%s", err.Error())
	}
	if s != nil {
		if err := s.spend(c.ID(), n.bytes, n.cost); err != nil {
			return err
		}
		if n.upTo > int64(s.room()) {
			return s.fail(c.ID(), fmt.Sprintf("the value could be up to %d bytes, more than the %d bytes the expression may still build on this event", n.upTo, s.room()))
		}
	}
	impl := c.impl
	if impl.OperandTrait != 0 && !vals[0].Type().HasTrait(impl.OperandTrait) {
		return types.NewErrWithNodeID(c.ID(), "no such overload: %s", c.Function())
	}
	var out ref.Val
	switch {
	case len(vals) == 1 && impl.Unary != nil:
		out = impl.Unary(vals[0])
	case len(vals) == 2 && impl.Binary != nil:
		out = impl.Binary(vals[0], vals[1])
	case impl.Function != nil:
		out = impl.Function(vals...)
	default:
		return types.NewErrWithNodeID(c.ID(), "no such overload: %s", c.Function())
	}
	if n.upTo > 0 && s != nil && !types.IsUnknownOrError(out) {
		size := strLen(out)
		if size > MaxValueBytes {
			return s.fail(c.ID(), fmt.Sprintf("the value is %d bytes; an expression builds strings of at most %d", size, MaxValueBytes))
		}
		if err := s.spend(c.ID(), size, 0); err != nil {
			return err
		}
	}
	return types.LabelErrNode(c.ID(), out)
}

// meteredEquality is == or !=: a comparison of two lists or maps goes through them, and is
// charged that walk first; any other comparison is as cheap as CEL's.
type meteredEquality struct {
	interpreter.InterpretableCall
	lhs, rhs interpreter.InterpretableV2
	negate   bool
}

// Exec implements interpreter.InterpretableV2.
func (e *meteredEquality) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	return e.compare(frame, e.lhs.Exec(frame), e.rhs.Exec(frame))
}

// Eval implements interpreter.Interpretable.
func (e *meteredEquality) Eval(vars interpreter.Activation) ref.Val {
	return e.compare(vars, e.lhs.Eval(vars), e.rhs.Eval(vars))
}

func (e *meteredEquality) compare(vars interpreter.Activation, l, r ref.Val) ref.Val {
	if types.IsUnknownOrError(l) {
		return l
	}
	if types.IsUnknownOrError(r) {
		return r
	}
	if isContainer(l) && isContainer(r) {
		// Walking the smaller one whole and the other as far: what the comparison may do.
		s := stateOf(vars)
		wr := weigh(r, s.remaining())
		cost := wr.units() + weigh(l, wr.nodes+1).units()
		if s != nil {
			if err := s.spend(e.ID(), 0, cost); err != nil {
				return err
			}
		}
	}
	eq := types.Equal(l, r)
	if e.negate {
		return types.Bool(eq != types.True)
	}
	return eq
}
