package expr

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"time"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/interpreter"
)

// Runtime bounds of one evaluation. Every evaluation (a filter, a transformation's body and
// headers, a WebhookErasure's expression, kubectl webhooks eval) runs under all of them, and
// one that reaches any of them stops at once with an *Error whose Limit is set:
//
//   - MaxBuiltBytes: what it builds (strings, bytes, lists, maps), charged before it is built;
//   - MaxEvalCost: the work it does, one unit per iteration of a comprehension and, for the
//     functions whose work grows with their arguments, about one per element and one per
//     ten bytes they go through;
//   - EvalTimeout: a deadline, read every checkEvery units of work;
//   - the caller's context, read at the same moments.
//
// At most evalSlots evaluations run at once in a process, so that the memory all of them
// may build is bounded too (evaluations never wait on anything but the CPU).
const (
	// MaxEvalCost bounds the work of one evaluation, in units of about one operation (CEL's
	// estimate counts the same way). A pass over the half a million elements a 1 MiB event
	// can hold costs half a million; the bound is twenty such passes, a fraction of a second.
	MaxEvalCost = 10_000_000
	// MaxRangeSize bounds lists.range(n).
	MaxRangeSize = 10_000
	// MaxPatternBytes bounds a regular expression computed at run time (matches with a
	// pattern that is not a constant).
	MaxPatternBytes = 4096
	// checkEvery is how many units of work run between two readings of the clock and of the
	// context.
	checkEvery = 64
	// listElementBytes is what one element of a list an expression builds is charged: its
	// slot and the boxed value it usually holds; listBytes what a list literal takes besides.
	listElementBytes = 24
	listBytes        = 64
	// mapEntryBytes is what one entry of a map literal is charged, mapBytes what the map
	// takes besides (Go's smallest map holds eight entries).
	mapEntryBytes = 64
	mapBytes      = 320
)

// budgetVar resolves, in an evaluation's activation, to its evalState. CEL identifiers cannot
// start with @, so no expression can name it.
const budgetVar = "@budget"

// evalState is one evaluation's activation: the event's variables and the evaluation's meter.
type evalState struct {
	*Input
	ctx      context.Context
	deadline time.Time
	// built and cost are what the evaluation built and did so far.
	built int
	cost  int64
	// next is the cost at which the clock and the context are read again.
	next int64
	// stop is the limit the evaluation reached: once set, every metered node returns it, so
	// the evaluation ends as fast as its iterations can be skipped.
	stop *types.Err
}

func newEvalState(ctx context.Context, in *Input) *evalState {
	return &evalState{Input: in, ctx: ctx, deadline: time.Now().Add(EvalTimeout), next: checkEvery}
}

// ResolveName implements interpreter.Activation.
func (s *evalState) ResolveName(name string) (any, bool) {
	if name == budgetVar {
		return s, true
	}
	return s.Input.ResolveName(name)
}

// stateOf is the meter of the evaluation vars belongs to; nil outside an evaluation (the
// constant folding of compilation).
func stateOf(vars interpreter.Activation) *evalState {
	v, ok := vars.ResolveName(budgetVar)
	if !ok {
		return nil
	}
	s, _ := v.(*evalState)
	return s
}

// spend charges bytes built and cost units of work to the evaluation of vars at node id; an
// error value once a bound is reached.
func spend(vars interpreter.Activation, id int64, bytes int, cost int64) ref.Val {
	if s := stateOf(vars); s != nil {
		if err := s.spend(id, bytes, cost); err != nil {
			return err
		}
	}
	return nil
}

func (s *evalState) spend(id int64, bytes int, cost int64) *types.Err {
	if s.stop != nil {
		return s.stop
	}
	s.built += bytes
	s.cost += cost
	switch {
	case s.built > MaxBuiltBytes:
		return s.fail(id, fmt.Sprintf("the expression built more than %d bytes of strings, lists and maps on this event", MaxBuiltBytes))
	case s.cost > MaxEvalCost:
		return s.fail(id, fmt.Sprintf("the expression did more than %d units of work on this event (iterations, and the work of functions on lists, maps and strings)", MaxEvalCost))
	case s.cost >= s.next:
		s.next = s.cost + checkEvery
		if err := s.ctx.Err(); err != nil {
			return s.fail(id, "the evaluation was interrupted: "+err.Error())
		}
		if time.Now().After(s.deadline) {
			return s.fail(id, fmt.Sprintf("the evaluation took longer than %s on this event (the expression does too much work for it)", EvalTimeout))
		}
	}
	return nil
}

// fail stops the evaluation with msg.
func (s *evalState) fail(id int64, msg string) *types.Err {
	s.stop = types.NewErrWithNodeID(id, "%s", msg).(*types.Err)
	return s.stop
}

// remaining is the work the evaluation may still do (all of it outside an evaluation).
func (s *evalState) remaining() int64 {
	if s == nil {
		return MaxEvalCost
	}
	return max(MaxEvalCost-s.cost, 0)
}

// room is what the evaluation may still build.
func (s *evalState) room() int {
	if s == nil {
		return MaxBuiltBytes
	}
	return max(MaxBuiltBytes-s.built, 0)
}

// evalSlots are the evaluations that may run at once in this process.
var evalSlots = make(chan struct{}, max(2, runtime.GOMAXPROCS(0)))

// acquire waits for an evaluation slot; release gives it back.
func acquire(ctx context.Context) (release func(), err error) {
	select {
	case evalSlots <- struct{}{}:
	default:
		select {
		case evalSlots <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return func() { <-evalSlots }, nil
}

// meteredStep is a comprehension's loop step: each iteration costs a unit, and once the
// evaluation reached a bound an iteration no longer evaluates anything.
type meteredStep struct {
	interpreter.InterpretableV2
}

// Exec implements interpreter.InterpretableV2.
func (m *meteredStep) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	if err := spend(frame, m.ID(), 0, 1); err != nil {
		return err
	}
	return m.InterpretableV2.Exec(frame)
}

// Eval implements interpreter.Interpretable.
func (m *meteredStep) Eval(vars interpreter.Activation) ref.Val {
	if err := spend(vars, m.ID(), 0, 1); err != nil {
		return err
	}
	return m.InterpretableV2.Eval(vars)
}

// meteredLiteral is a list or map literal whose elements are not all constants: what it
// builds is charged before it is built.
type meteredLiteral struct {
	interpreter.InterpretableV2
	bytes int
	cost  int64
}

// Exec implements interpreter.InterpretableV2.
func (m *meteredLiteral) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	if err := spend(frame, m.ID(), m.bytes, m.cost); err != nil {
		return err
	}
	return m.InterpretableV2.Exec(frame)
}

// Eval implements interpreter.Interpretable.
func (m *meteredLiteral) Eval(vars interpreter.Activation) ref.Val {
	if err := spend(vars, m.ID(), m.bytes, m.cost); err != nil {
		return err
	}
	return m.InterpretableV2.Eval(vars)
}

// meterLiteral returns the metered form of a list or map literal, or nil when i is not one
// or its elements are all constants (it is then built once, when the expression is compiled).
func meterLiteral(i interpreter.InterpretableV2) interpreter.InterpretableV2 {
	c, ok := i.(interpreter.InterpretableConstructor)
	if !ok {
		return nil
	}
	vals := c.InitVals()
	constant := true
	for _, v := range vals {
		if _, ok := v.(interpreter.InterpretableConst); !ok {
			constant = false
			break
		}
	}
	if constant {
		return nil
	}
	switch c.Type() {
	case types.ListType:
		return &meteredLiteral{InterpretableV2: i, bytes: listBytes + listElementBytes*len(vals), cost: int64(len(vals)) + 1}
	case types.MapType:
		n := len(vals) / 2
		return &meteredLiteral{InterpretableV2: i, bytes: mapBytes + mapEntryBytes*n, cost: int64(n) + 1}
	}
	return nil
}

// weight is what a walk through a value found: its values (the value, and the elements, keys
// and values of its lists and maps, recursively) and the bytes of its strings and bytes.
type weight struct {
	nodes, text int64
}

// units is the work of comparing or searching through the value.
func (w weight) units() int64 { return satAdd(w.nodes, w.text/16) }

// rendered bounds the bytes of the value written as text (JSON or format's %s): a string's
// bytes escaped, and every other value or separator in at most 64 bytes.
func (w weight) rendered() int64 { return satAdd(satMul(8, w.text), satMul(64, w.nodes)) }

// satMul multiplies non-negative numbers without overflowing.
func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// weigh is what a comparison, a search or an encoding of v goes through: every value of it,
// the elements of a list shared by others counted each time they are reached (a list of two
// copies of a list of two copies... is a few values in memory and exponentially many to go
// through). Each list or map is walked once, and the walk stops once it found more than
// limit values.
func weigh(v ref.Val, limit int64) weight {
	w := weigher{limit: limit}
	return w.weigh(v, 0)
}

// weigher weighs values, remembering the lists and maps it weighed.
type weigher struct {
	limit  int64
	walked int64
	seen   map[ref.Val]weight
}

func (w *weigher) weigh(v ref.Val, depth int) weight {
	switch x := v.(type) {
	case types.String:
		return weight{1, int64(len(x))}
	case types.Bytes:
		return weight{1, int64(len(x))}
	case *types.Optional:
		if !x.HasValue() {
			return weight{1, 0}
		}
		in := w.weigh(x.GetValue(), depth+1)
		return weight{satAdd(in.nodes, 1), in.text}
	case traits.Mapper, traits.Lister:
	default:
		return weight{1, 0}
	}
	memo := reflect.TypeOf(v).Kind() == reflect.Pointer
	if memo {
		if got, ok := w.seen[v]; ok {
			return got
		}
	}
	total := weight{1, 0}
	add := func(e ref.Val) {
		in := w.weigh(e, depth+1)
		total = weight{satAdd(total.nodes, in.nodes), satAdd(total.text, in.text)}
	}
	w.walked++
	over := func() bool { return w.walked > w.limit || total.nodes > w.limit || depth > maxDepth }
	if !over() {
		switch x := v.(type) {
		case traits.Mapper:
			for it := x.Iterator(); it.HasNext() == types.True && !over(); {
				k := it.Next()
				w.walked++
				add(k)
				if val, found := x.Find(k); found {
					add(val)
				}
			}
		case traits.Lister:
			for it := x.Iterator(); it.HasNext() == types.True && !over(); {
				w.walked++
				add(it.Next())
			}
		}
	}
	if over() {
		total.nodes = max(total.nodes, satAdd(w.limit, 1))
	}
	if memo {
		if w.seen == nil {
			w.seen = map[ref.Val]weight{}
		}
		w.seen[v] = total
	}
	return total
}

// satAdd adds without overflowing.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// isContainer reports whether v is a list or a map (whose comparison goes through them).
func isContainer(v ref.Val) bool {
	switch v.(type) {
	case traits.Lister, traits.Mapper, *types.Optional:
		return true
	}
	return false
}
