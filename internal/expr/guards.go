package expr

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/functions"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/overloads"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/interpreter"
)

// Bounds of the values an expression builds, checked before building them.
const (
	// MaxValueBytes bounds a string or bytes an expression builds (+, replace, join, format).
	MaxValueBytes = 4 << 20
	// MaxListLength bounds a list an expression builds with + (and so map and filter).
	MaxListLength = 1 << 20
)

// guardAdd wraps every + of a program so that it checks the size of a concatenation before
// making it: the standard library's + is one binding for all types, which guardSizes cannot
// redefine.
func guardAdd(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
	if call, ok := i.(interpreter.InterpretableCall); ok && call.Function() == operators.Add && len(call.Args()) == 2 {
		return &boundedAdd{InterpretableCall: call}, nil
	}
	return i, nil
}

// boundedAdd is a + that refuses to build a string, bytes or list above its bound.
type boundedAdd struct {
	interpreter.InterpretableCall
}

// Eval implements interpreter.Interpretable.
func (a *boundedAdd) Eval(vars interpreter.Activation) ref.Val {
	args := a.Args()
	return a.add(args[0].Eval(vars), args[1].Eval(vars))
}

// Exec implements interpreter.InterpretableV2.
func (a *boundedAdd) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	args := a.Args()
	return a.add(args[0].Exec(frame), args[1].Exec(frame))
}

func (a *boundedAdd) add(l, r ref.Val) ref.Val {
	if types.IsUnknownOrError(l) {
		return l
	}
	if types.IsUnknownOrError(r) {
		return r
	}
	if err := checkBytes(strLen(l) + strLen(r)); err != nil {
		return types.LabelErrNode(a.ID(), err)
	}
	if n := listLen(l) + listLen(r); n > MaxListLength {
		return types.NewErrWithNodeID(a.ID(), "the list would have %d elements; an expression builds lists of at most %d", n, MaxListLength)
	}
	if adder, ok := l.(traits.Adder); ok && l.Type().HasTrait(traits.AdderType) {
		return types.LabelErrNode(a.ID(), adder.Add(r))
	}
	return types.NewErrWithNodeID(a.ID(), "no such overload: %s", operators.Add)
}

func listLen(v ref.Val) int {
	if l, ok := v.(traits.Lister); ok {
		if n, ok := l.Size().(types.Int); ok {
			return int(n)
		}
	}
	return 0
}

// sizeGuard says why a call with args would build a value above its bound, or nil.
type sizeGuard func(args []ref.Val) ref.Val

// sizeGuards are the functions whose result can outgrow their arguments, by overload id.
var sizeGuards = map[string]sizeGuard{
	"string_replace_string_string":     replaceGuard,
	"string_replace_string_string_int": replaceGuard,
	"list_join":                        joinGuard,
	"list_join_string":                 joinGuard,
	"string_format": func(a []ref.Val) ref.Val {
		n := strLen(a[0])
		if l, ok := a[1].(traits.Lister); ok {
			for it := l.Iterator(); it.HasNext() == types.True; {
				n += strLen(it.Next()) + 32 // numbers, bools and the like are short
			}
		}
		return checkBytes(n)
	},
}

func checkBytes(n int) ref.Val {
	if n > MaxValueBytes {
		return types.NewErr("the value would be %d bytes; an expression builds strings of at most %d", n, MaxValueBytes)
	}
	return nil
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

// replaceGuard computes the size of s.replace(old, new) before replacing.
func replaceGuard(a []ref.Val) ref.Val {
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
}

func joinGuard(a []ref.Val) ref.Val {
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
}

// guardSizes redefines the functions of sizeGuards in e, with the same signatures, so that
// they check their result's size before building it.
func guardSizes(e *cel.Env) (*cel.Env, error) {
	var opts []cel.EnvOption
	for name, fn := range e.Functions() {
		bindings, err := fn.Bindings()
		if err != nil {
			return nil, err
		}
		impls := map[string]*functions.Overload{}
		for _, b := range bindings {
			impls[b.Operator] = b
		}
		var fopts []cel.FunctionOpt
		for _, o := range fn.OverloadDecls() {
			guard, ok := sizeGuards[o.ID()]
			impl := impls[o.ID()]
			if !ok || impl == nil {
				continue
			}
			bind := cel.FunctionBinding(guarded(impl, guard))
			if o.IsMemberFunction() {
				fopts = append(fopts, cel.MemberOverload(o.ID(), o.ArgTypes(), o.ResultType(), bind))
			} else {
				fopts = append(fopts, cel.Overload(o.ID(), o.ArgTypes(), o.ResultType(), bind))
			}
		}
		if len(fopts) > 0 {
			opts = append(opts, cel.Function(name, fopts...))
		}
	}
	if len(opts) != len(guardedFunctions) {
		return nil, fmt.Errorf("guarded %d functions, want %d: %v", len(opts), len(guardedFunctions), guardedFunctions)
	}
	return e.Extend(opts...)
}

// guardedFunctions are the functions sizeGuards' overloads belong to.
var guardedFunctions = []string{"replace", "join", "format"}

// guarded calls impl after guard allowed it.
func guarded(impl *functions.Overload, guard sizeGuard) functions.FunctionOp {
	return func(args ...ref.Val) ref.Val {
		if err := guard(args); err != nil {
			return err
		}
		switch {
		case len(args) == 1 && impl.Unary != nil:
			return impl.Unary(args[0])
		case len(args) == 2 && impl.Binary != nil:
			return impl.Binary(args[0], args[1])
		case impl.Function != nil:
			return impl.Function(args...)
		}
		return types.NewErr("no implementation of %s", impl.Operator)
	}
}

// growthCost estimates the cost of string and bytes concatenations at one unit per byte of
// their result, instead of CEL's tenth, so that the estimate also bounds what they copy.
func growthCost(estimator checker.CostEstimator, overloadID string, args []checker.AstNode) *checker.CallEstimate {
	switch overloadID {
	case overloads.AddString, overloads.AddBytes:
	default:
		return nil
	}
	if len(args) != 2 {
		return nil
	}
	size := argSize(estimator, args[0]).Add(argSize(estimator, args[1]))
	return &checker.CallEstimate{CostEstimate: size.AsCost().Add(checker.CostEstimate{Min: 1, Max: 1}), ResultSize: &size}
}

func argSize(estimator checker.CostEstimator, n checker.AstNode) checker.SizeEstimate {
	if s := n.ComputedSize(); s != nil {
		return *s
	}
	if s := estimator.EstimateSize(n); s != nil {
		return *s
	}
	return checker.SizeEstimate{Min: 0, Max: SizeBound}
}
