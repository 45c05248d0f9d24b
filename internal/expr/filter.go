package expr

import (
	"context"
	"fmt"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// Filter is a compiled spec.filter. It is safe for concurrent use.
type Filter struct {
	p *program
}

// CompileFilter compiles a filter: an expression that must give a bool.
func CompileFilter(source string) (*Filter, error) {
	p, err := compile(kindFilter, FieldFilter, source, MaxSourceLength)
	if err != nil {
		return nil, err
	}
	return &Filter{p: p}, nil
}

// CompileFilterAt compiles a filter found at field (e.g. a WebhookErasure's
// spec.expression): its errors name that field.
func CompileFilterAt(field, source string) (*Filter, error) {
	p, err := compile(kindFilter, field, source, MaxSourceLength)
	if err != nil {
		return nil, err
	}
	return &Filter{p: p}, nil
}

// FilterOf compiles spec.filter; nil, nil when the endpoint has none (every event matches).
func FilterOf(spec *v1alpha1.WebhookEndpointSpec) (*Filter, error) {
	if spec == nil || spec.Filter == "" {
		return nil, nil
	}
	return CompileFilter(spec.Filter)
}

// Source is the filter's expression.
func (f *Filter) Source() string { return f.p.ast.Source().Content() }

// EstimatedCost is the largest cost the filter may have on an event of SizeBound bytes.
func (f *Filter) EstimatedCost() uint64 { return f.p.cost.Max }

// Match evaluates the filter on in: true when the endpoint gets the event. A nil Filter
// matches every event. An error (*Error) says why the filter could not decide, e.g. a field
// the event lacks; it is never a panic.
func (f *Filter) Match(ctx context.Context, in *Input) (bool, error) {
	if f == nil {
		return true, nil
	}
	v, err := f.p.eval(ctx, in)
	if err != nil {
		return false, err
	}
	b, ok := v.(types.Bool)
	if !ok {
		return false, &Error{Field: f.p.field, Msg: fmt.Sprintf("a filter must give a bool, this one gave %s on this event", typeName(v))}
	}
	return bool(b), nil
}

// eval evaluates p on in under the evaluation's bounds (meter.go), until ctx ends.
func (p *program) eval(ctx context.Context, in *Input) (v ref.Val, err error) {
	defer func() {
		if r := recover(); r != nil {
			v, err = nil, &Error{Field: p.field, Msg: fmt.Sprintf("internal error evaluating the expression: %v", r)}
		}
	}()
	if ctx == nil {
		ctx = context.Background()
	}
	release, err := acquire(ctx)
	if err != nil {
		return nil, &Error{Field: p.field, Msg: "the evaluation was interrupted: " + err.Error(), Limit: true}
	}
	defer release()
	st := newEvalState(ctx, in)
	out, _, evalErr := p.prg.Eval(st)
	if st.stop != nil {
		// A bound was reached: whatever the expression made of the error (|| and && absorb
		// one), the evaluation failed.
		e := p.evalError(st.stop)
		e.Limit = true
		return nil, e
	}
	if evalErr != nil {
		return nil, p.evalError(evalErr)
	}
	return out, nil
}

// typeName is the CEL name of v's type.
func typeName(v ref.Val) string {
	if v == nil {
		return "nothing"
	}
	return v.Type().TypeName()
}
