package expr

import (
	"fmt"
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
	// MaxListLength bounds a list an expression builds with + (and so with map and filter).
	MaxListLength = 1 << 20
	// MaxBuiltBytes bounds what one evaluation builds in all: the bytes of the strings and
	// bytes above, and 16 bytes per element added to a list.
	MaxBuiltBytes = 32 << 20
)

// budgetVar resolves, in an evaluation's activation, to its evalState. CEL identifiers cannot
// start with @, so no expression can name it.
const budgetVar = "@budget"

// evalState is one evaluation's activation: the event's variables and what it has built.
type evalState struct {
	*Input
	built int
}

// ResolveName implements interpreter.Activation.
func (s *evalState) ResolveName(name string) (any, bool) {
	if name == budgetVar {
		return s, true
	}
	return s.Input.ResolveName(name)
}

// charge counts n bytes built by the evaluation of vars; an error once it built too much.
func charge(vars interpreter.Activation, id int64, n int) ref.Val {
	v, ok := vars.ResolveName(budgetVar)
	if !ok {
		return nil
	}
	s, ok := v.(*evalState)
	if !ok {
		return nil
	}
	s.built += n
	if s.built > MaxBuiltBytes {
		return types.NewErrWithNodeID(id, "the expression built more than %d bytes of strings and lists on this event", MaxBuiltBytes)
	}
	return nil
}

// sizeGuard checks a call's arguments and returns the bytes its result will take, or an
// error if it would be too large.
type sizeGuard func(args []ref.Val) (int, error)

// sizeGuards are the functions whose result can outgrow their arguments.
var sizeGuards = map[string]sizeGuard{
	operators.Add: func(a []ref.Val) (int, error) {
		if _, ok := a[0].(traits.Lister); ok {
			n := listLen(a[0]) + listLen(a[1])
			if n > MaxListLength {
				return 0, fmt.Errorf("the list would have %d elements; an expression builds lists of at most %d", n, MaxListLength)
			}
			return 16 * listLen(a[1]), nil // what is added: an accumulator grows in place
		}
		return checkBytes(strLen(a[0]) + strLen(a[1]))
	},
	"replace": func(a []ref.Val) (int, error) {
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
		return checkBytes(len(s) + count*(len(repl)-len(old)))
	},
	"join": func(a []ref.Val) (int, error) {
		n, sep := 0, 0
		if len(a) == 2 {
			sep = strLen(a[1])
		}
		if l, ok := a[0].(traits.Lister); ok {
			for it := l.Iterator(); it.HasNext() == types.True; {
				n += strLen(it.Next()) + sep
			}
		}
		return checkBytes(n)
	},
	"format": func(a []ref.Val) (int, error) {
		n := strLen(a[0])
		if l, ok := a[1].(traits.Lister); ok {
			for it := l.Iterator(); it.HasNext() == types.True; {
				n += strLen(it.Next()) + 32 // numbers, bools and the like are short
			}
		}
		return checkBytes(n)
	},
}

func checkBytes(n int) (int, error) {
	if n > MaxValueBytes {
		return 0, fmt.Errorf("the value would be %d bytes; an expression builds strings of at most %d", n, MaxValueBytes)
	}
	return n, nil
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

// guardCalls returns a decorator that replaces each call of sizeGuards' functions with one
// that checks the size of its result, and charges it to the evaluation, before making it.
func guardCalls(e *cel.Env) (interpreter.InterpretableDecoratorV2, error) {
	impls := map[string]*functions.Overload{}
	for name := range sizeGuards {
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
	return func(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
		call, ok := i.(interpreter.InterpretableCall)
		if !ok {
			return i, nil
		}
		guard, ok := sizeGuards[call.Function()]
		if !ok {
			return i, nil
		}
		impl := impls[call.OverloadID()]
		if impl == nil {
			impl = impls[call.Function()]
		}
		if impl == nil {
			return nil, fmt.Errorf("no implementation of %s (%s) to guard", call.Function(), call.OverloadID())
		}
		return &guardedCall{InterpretableCall: call, guard: guard, impl: impl}, nil
	}, nil
}

// guardedCall is a call whose result's size is checked before it is built.
type guardedCall struct {
	interpreter.InterpretableCall
	guard sizeGuard
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
	n, err := c.guard(vals)
	if err != nil {
		return types.NewErrWithNodeID(c.ID(), "%s", err.Error())
	}
	if err := charge(vars, c.ID(), n); err != nil {
		return err
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
	return types.LabelErrNode(c.ID(), out)
}
