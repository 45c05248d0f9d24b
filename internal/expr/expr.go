// Package expr compiles and evaluates the CEL expressions of a WebhookEndpoint: its filter
// (spec.filter: does the endpoint get this event?) and its transformation (spec.transform:
// which body and extra headers are sent).
//
// The controller compiles both on every reconcile to report a bad expression on the
// endpoint; the dispatcher compiles them once per configuration and evaluates them per
// event. Both go through one cache keyed by the source, so an expression shared by many
// endpoints is compiled once.
//
// Every expression sees the same variables (see Event): payload, raw, type, id, time,
// headers and ns (the namespace). Compilation refuses an expression that does not parse or
// type-check, that gives the wrong type, or whose estimated cost on the largest event may
// exceed CostLimit (e.g. a comprehension nested in another over the payload). An evaluation
// that iterates stops after EvalTimeout or when its context ends; a transformation's body is
// at most MaxBodyBytes. Errors are values (*Error) that point at the expression's line and
// column; evaluation never panics.
package expr

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/functions"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
)

// Names of the variables every expression sees.
const (
	// VarPayload is the event's body parsed as JSON (null when the body is not JSON).
	VarPayload = "payload"
	// VarRaw is the event's body as a string.
	VarRaw = "raw"
	// VarType is the event type, e.g. order.created.
	VarType = "type"
	// VarID is the event id (webhook-id).
	VarID = "id"
	// VarTime is the event's time, a timestamp.
	VarTime = "time"
	// VarHeaders are the producer's headers: lower-case names, first value.
	VarHeaders = "headers"
	// VarNamespace is the namespace the event was published in (namespace is a reserved
	// word of CEL).
	VarNamespace = "ns"
)

// Limits of expressions and of what they produce.
//
// The cost of an expression is bounded before it runs: at compile time CEL estimates its
// worst case on an event of SizeBound bytes, and an expression above CostLimit is refused.
// The estimate grows with the size of what the expression iterates over, so an expression
// that does work proportional to the event is accepted, and one that iterates over the
// payload inside another iteration over it (work proportional to the square of the event) is
// not. The estimate does not see everything (lists the expression builds itself, cel.bind
// variables, lists sharing elements), so every evaluation is also metered at run time (see
// meter.go): what it builds (MaxValueBytes, MaxListLength, MaxBuiltBytes), the work it does
// (MaxEvalCost), a deadline (EvalTimeout) and its context; lists.range makes at most
// MaxRangeSize elements (a constant above it is refused at compile time).
//
// CEL's own runtime cost tracking (cel.CostLimit) is not used: in cel-go v0.29 to v0.31 it
// keeps a record per comprehension iteration and searches those records linearly, so a pass
// over a 20,000-element list takes a second instead of 8 ms, and its limit would be reached
// only after tens of seconds (BenchmarkIteration shows both). The meter costs a unit per
// iteration and a check per call of the functions that build or go through lists, maps and
// strings (BenchmarkFilter and BenchmarkTransform measure it per event).
const (
	// MaxSourceLength bounds a filter and a transformation's body expression (as the schema
	// does).
	MaxSourceLength = 4096
	// MaxHeaderSourceLength bounds the expression of one transformation header.
	MaxHeaderSourceLength = 1024
	// MaxTransformHeaders bounds the headers a transformation sets.
	MaxTransformHeaders = 16
	// CostLimit is the largest estimated cost of an expression on an event of SizeBound
	// bytes, in CEL's cost units (about one per operation, more for work proportional to a
	// string's or list's size): about a hundred per byte of the event. A filter on a few
	// fields is estimated at tens of units, a pass over the payload's lists at millions to
	// tens of millions, one pass nested in another over the payload at trillions.
	CostLimit = 100_000_000
	// SizeBound is the size, in bytes, of the largest event the cost estimate assumes: no
	// string, list or map taken from an event is larger.
	SizeBound = 1 << 20
	// EvalTimeout stops an evaluation that runs longer than this.
	EvalTimeout = time.Second
	// MaxBodyBytes bounds a transformation's body.
	MaxBodyBytes = 1 << 20
	// MaxHeaderValueBytes bounds the value of one transformation header (as spec.headers).
	MaxHeaderValueBytes = 4096
)

// Error is a problem with one expression: it does not compile, is too costly, or failed on
// an event. Its message names the field and, when known, the line and column.
type Error struct {
	// Field is the expression's place in the endpoint, e.g. spec.filter,
	// spec.transform.body or spec.transform.headers.X-Order-Id.
	Field string
	// Line (1-based) and Column (1-based, in characters) locate the problem; 0 when unknown.
	Line, Column int
	// Msg says what is wrong.
	Msg string
	// Report is CEL's report of compilation errors, with the offending line and a caret
	// under the column, for a terminal; empty for other errors.
	Report string
	// Limit is set when an evaluation was stopped by one of its bounds (what it builds, its
	// work, its deadline, its context) rather than failing on the event's content.
	Limit bool
}

// IsLimit reports whether err is an evaluation stopped by one of its bounds (Error.Limit).
func IsLimit(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Limit
}

// Error is one line: field, line:column, message.
func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s: %d:%d: %s", e.Field, e.Line, e.Column, e.Msg)
	}
	return e.Field + ": " + e.Msg
}

// Fields of an endpoint's expressions, as errors name them.
const (
	FieldFilter           = "spec.filter"
	FieldTransformBody    = "spec.transform.body"
	FieldTransformHeaders = "spec.transform.headers"
)

// env is the one CEL environment of every expression.
var env = sync.OnceValues(func() (*celEnv, error) {
	e, err := cel.NewEnv(
		cel.Variable(VarPayload, cel.DynType),
		cel.Variable(VarRaw, cel.StringType),
		cel.Variable(VarType, cel.StringType),
		cel.Variable(VarID, cel.StringType),
		cel.Variable(VarTime, cel.TimestampType),
		cel.Variable(VarHeaders, cel.MapType(cel.StringType, cel.StringType)),
		cel.Variable(VarNamespace, cel.StringType),
		cel.CrossTypeNumericComparisons(true),
		cel.DefaultUTCTimeZone(true),
		cel.OptionalTypes(),
		ext.Strings(),
		ext.Encoders(),
		ext.Math(),
		ext.Lists(ext.ListsMaxRangeSize(MaxRangeSize)),
		ext.Sets(),
		ext.Bindings(),
		cel.ParserExpressionSizeLimit(MaxSourceLength),
	)
	if err != nil {
		return nil, err
	}
	impls, err := guardedImpls(e)
	if err != nil {
		return nil, err
	}
	return &celEnv{e, impls}, nil
})

// celEnv is the CEL environment and the implementations of the functions the meter guards.
type celEnv struct {
	*cel.Env
	impls map[string]*functions.Overload
}

// kind is what an expression must produce.
type kind int

const (
	kindFilter kind = iota // a bool
	kindBody               // anything JSON can hold, a string or bytes
	kindHeader             // a string, number, bool or null
)

// program is one compiled expression.
type program struct {
	field string
	ast   *cel.Ast
	prg   cel.Program
	// Cost is the estimated cost range on an event of SizeBound bytes.
	cost checker.CostEstimate
}

// loopSteps are the ids of the loop steps of ast's comprehensions (all, exists, map, filter,
// cel.bind, ...): the meter charges each of their evaluations.
func loopSteps(ast *cel.Ast) map[int64]bool {
	steps := map[int64]bool{}
	celast.PostOrderVisit(ast.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		if e.Kind() == celast.ComprehensionKind {
			steps[e.AsComprehension().LoopStep().ID()] = true
		}
	}))
	return steps
}

// rangeTooLarge says where ast calls lists.range with a constant above MaxRangeSize, or nil.
func rangeTooLarge(field string, ast *cel.Ast) *Error {
	var found *Error
	celast.PostOrderVisit(ast.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		if found != nil || e.Kind() != celast.CallKind || e.AsCall().FunctionName() != "lists.range" || len(e.AsCall().Args()) != 1 {
			return
		}
		arg := e.AsCall().Args()[0]
		if arg.Kind() != celast.LiteralKind {
			return
		}
		if n, ok := arg.AsLiteral().(types.Int); ok && n > MaxRangeSize {
			line, col := location(ast.NativeRep().SourceInfo().GetStartLocation(e.ID()))
			found = &Error{Field: field, Line: line, Column: col,
				Msg: fmt.Sprintf("lists.range(%d): an expression makes ranges of at most %d elements", n, MaxRangeSize)}
		}
	}))
	return found
}

// cacheKey identifies a compilation: the same source compiled for another field or kind
// gives other errors.
type cacheKey struct {
	kind   kind
	field  string
	source string
}

type cacheEntry struct {
	p   *program
	err error
}

// maxCacheEntries bounds the cache; when full, an arbitrary half is dropped.
const maxCacheEntries = 4096

var cache = struct {
	sync.Mutex
	m map[cacheKey]cacheEntry
}{m: map[cacheKey]cacheEntry{}}

// compile returns the compiled expression, from the cache when it was compiled before.
func compile(k kind, field, source string, maxLen int) (*program, error) {
	key := cacheKey{k, field, source}
	cache.Lock()
	e, ok := cache.m[key]
	cache.Unlock()
	if ok {
		return e.p, e.err
	}
	p, err := compileUncached(k, field, source, maxLen)
	cache.Lock()
	defer cache.Unlock()
	if len(cache.m) >= maxCacheEntries {
		n := 0
		for k := range cache.m {
			delete(cache.m, k)
			if n++; n >= maxCacheEntries/2 {
				break
			}
		}
	}
	cache.m[key] = cacheEntry{p, err}
	return p, err
}

func compileUncached(k kind, field, source string, maxLen int) (*program, error) {
	if strings.TrimSpace(source) == "" {
		return nil, &Error{Field: field, Msg: "the expression is empty"}
	}
	if n := len([]rune(source)); n > maxLen {
		return nil, &Error{Field: field, Msg: fmt.Sprintf("the expression is %d characters long; at most %d are allowed", n, maxLen)}
	}
	e, err := env()
	if err != nil {
		return nil, &Error{Field: field, Msg: "the CEL environment: " + err.Error()}
	}
	ast, iss := e.Compile(source)
	if iss.Err() != nil {
		return nil, issuesError(field, iss)
	}
	if err := checkOutput(k, ast.OutputType()); err != "" {
		return nil, &Error{Field: field, Line: 1, Column: 1, Msg: err}
	}
	if err := rangeTooLarge(field, ast); err != nil {
		return nil, err
	}
	cost, err := e.EstimateCost(ast, sizeEstimator{})
	if err != nil {
		return nil, &Error{Field: field, Msg: "estimating its cost: " + err.Error()}
	}
	if cost.Max > CostLimit {
		return nil, &Error{Field: field, Msg: fmt.Sprintf(
			"the expression may cost too much: its estimated worst case on a %d KiB event is %s, above the limit of %d (do not iterate over the payload inside another iteration over it)",
			SizeBound>>10, costString(cost.Max), CostLimit)}
	}
	prg, err := e.Program(ast,
		cel.CustomDecoratorV2(meteredProgram(e.impls, loopSteps(ast))),
		cel.EvalOptions(cel.OptOptimize),
	)
	if err != nil {
		return nil, &Error{Field: field, Msg: err.Error()}
	}
	return &program{field: field, ast: ast, prg: prg, cost: cost}, nil
}

// costString writes an estimate, which saturates at the largest uint64.
func costString(c uint64) string {
	if c == ^uint64(0) {
		return "unbounded"
	}
	return fmt.Sprint(c)
}

// checkOutput says why an expression of type t cannot serve as k, or "".
func checkOutput(k kind, t *cel.Type) string {
	if t == nil || t.Kind() == types.DynKind || t.Kind() == types.AnyKind || t.Kind() == types.ErrorKind {
		return ""
	}
	if k != kindFilter && t.Kind() == types.OpaqueKind && t.TypeName() == "optional_type" {
		if len(t.Parameters()) == 1 {
			return checkOutput(k, t.Parameters()[0]) // an optional of a valid type: none is null
		}
		return ""
	}
	switch k {
	case kindFilter:
		if t.Kind() != types.BoolKind {
			return fmt.Sprintf("a filter must give a bool (true: deliver), this one gives %s", t)
		}
	case kindHeader:
		switch t.Kind() {
		case types.StringKind, types.IntKind, types.UintKind, types.DoubleKind, types.BoolKind, types.NullTypeKind:
		default:
			return fmt.Sprintf("a header value must be a string, a number, a bool or null, this one gives %s", t)
		}
	case kindBody:
		switch t.Kind() {
		case types.TypeKind, types.OpaqueKind, types.StructKind:
			return fmt.Sprintf("a body must be a map, a list, a string, bytes or a JSON value, this one gives %s", t)
		}
	}
	return ""
}

// issuesError turns CEL's compilation issues into an Error located at the first one.
func issuesError(field string, iss *cel.Issues) *Error {
	errs := iss.Errors()
	e := &Error{Field: field, Report: strings.TrimSpace(iss.String())}
	if len(errs) == 0 {
		e.Msg = iss.Err().Error()
		return e
	}
	first := errs[0]
	e.Msg = cleanMessage(first.Message)
	if n := len(errs) - 1; n == 1 {
		e.Msg += " (and 1 more error)"
	} else if n > 1 {
		e.Msg += fmt.Sprintf(" (and %d more errors)", n)
	}
	if loc := first.Location; loc != nil && loc.Line() > 0 {
		e.Line, e.Column = loc.Line(), loc.Column()+1
	}
	return e
}

// cleanMessage drops what CEL adds for its own containers, which users do not have, and
// names the variable to use for the namespace.
func cleanMessage(m string) string {
	m = strings.TrimSuffix(m, " (in container '')")
	if m == "reserved identifier: namespace" {
		m += " (the event's namespace is ns)"
	}
	return m
}

// evalError turns an evaluation error into an Error located at the node that failed.
func (p *program) evalError(err error) *Error {
	e := &Error{Field: p.field}
	e.Msg = cleanMessage(err.Error())
	var celErr *types.Err
	if errors.As(err, &celErr) && celErr.NodeID() != 0 {
		e.Line, e.Column = location(p.ast.NativeRep().SourceInfo().GetStartLocation(celErr.NodeID()))
	}
	return e
}

func location(loc common.Location) (int, int) {
	if loc == nil || loc.Line() <= 0 {
		return 0, 0
	}
	return loc.Line(), loc.Column() + 1
}

// sizeEstimator bounds the size of every string, list and map the estimate does not know.
// None taken from an event is larger than the event, SizeBound bytes. Those inside the
// elements of another list or map (x.tags in payload.items.map(x, x.tags...)) are together
// no larger than the event either: as the estimate multiplies the outer list's size by the
// inner one's, it assumes nestedSizeBound for the inner one, so that an iteration over the
// elements' own lists stays linear in the event's size, as it is, while an iteration over
// the payload nested in another over the payload does not.
type sizeEstimator struct{}

// nestedSizeBound is the size assumed for strings, lists and maps inside an element of an
// event's list or map.
const nestedSizeBound = 1

// computedSizeBound is the size assumed for a value computed by a function whose result's
// size CEL does not estimate.
const computedSizeBound = 64

func (sizeEstimator) EstimateSize(n checker.AstNode) *checker.SizeEstimate {
	path := n.Path()
	if len(path) > 1 && slices.ContainsFunc(path[1:], func(p string) bool { return p == "@items" || p == "@keys" || p == "@values" }) {
		return &checker.SizeEstimate{Min: 0, Max: nestedSizeBound}
	}
	if len(path) == 0 {
		// A value computed by a function CEL does not know the size of (string(x), a
		// cel.bind variable): assume it is small; what it builds is bounded at run time.
		return &checker.SizeEstimate{Min: 0, Max: computedSizeBound}
	}
	if t := n.Type(); t != nil && (t.Kind() == types.StringKind || t.Kind() == types.BytesKind) {
		return &checker.SizeEstimate{Min: 0, Max: SizeBound}
	}
	// A list or map of a JSON document has at most one element per two bytes ("1,").
	return &checker.SizeEstimate{Min: 0, Max: SizeBound / 2}
}

func (sizeEstimator) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}
