package expr

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// Content types of a transformed body.
const (
	ContentTypeJSON   = "application/json"
	ContentTypeText   = "text/plain; charset=utf-8"
	ContentTypeBinary = "application/octet-stream"
)

// Transform is a compiled spec.transform. It is safe for concurrent use.
type Transform struct {
	body    *program // nil: the event's body is sent unchanged
	headers []headerProgram
}

type headerProgram struct {
	name string // canonical
	p    *program
}

// Output is what a transformation makes of an event.
type Output struct {
	// Body is the request body; nil when the transformation has no body expression, and the
	// event's body and content type are sent unchanged.
	Body []byte
	// ContentType of Body: ContentTypeJSON, ContentTypeText or ContentTypeBinary.
	ContentType string
	// Headers to add to the request, in canonical form; a header whose expression gave null
	// is absent.
	Headers http.Header
}

// CompileTransform compiles a transformation: body is the body's expression ("" keeps the
// event's body), headers map header names to their values' expressions.
func CompileTransform(body string, headers map[string]string) (*Transform, error) {
	if body == "" && len(headers) == 0 {
		return nil, &Error{Field: "spec.transform", Msg: "a transformation needs a body expression, headers, or both"}
	}
	t := &Transform{}
	if body != "" {
		p, err := compile(kindBody, FieldTransformBody, body, MaxSourceLength)
		if err != nil {
			return nil, err
		}
		t.body = p
	}
	if len(headers) > MaxTransformHeaders {
		return nil, &Error{Field: FieldTransformHeaders, Msg: fmt.Sprintf("%d headers; at most %d are allowed", len(headers), MaxTransformHeaders)}
	}
	names := make([]string, 0, len(headers))
	for name := range headers {
		names = append(names, name)
	}
	slices.Sort(names)
	seen := map[string]string{}
	for _, name := range names {
		field := FieldTransformHeaders + "." + name
		if err := checkHeaderName(name); err != "" {
			return nil, &Error{Field: field, Msg: err}
		}
		canonical := http.CanonicalHeaderKey(name)
		if other, dup := seen[canonical]; dup {
			return nil, &Error{Field: field, Msg: fmt.Sprintf("the same header as %s (names are case-insensitive)", other)}
		}
		seen[canonical] = name
		p, err := compile(kindHeader, field, headers[name], MaxHeaderSourceLength)
		if err != nil {
			return nil, err
		}
		t.headers = append(t.headers, headerProgram{name: canonical, p: p})
	}
	return t, nil
}

// TransformOf compiles spec.transform; nil, nil when the endpoint has none (the event is
// sent as it is).
func TransformOf(spec *v1alpha1.WebhookEndpointSpec) (*Transform, error) {
	if spec == nil || spec.Transform == nil {
		return nil, nil
	}
	return CompileTransform(spec.Transform.Body, spec.Transform.Headers)
}

// EstimatedCost is the largest cost the transformation may have on an event of SizeBound
// bytes, its body and headers together.
func (t *Transform) EstimatedCost() uint64 {
	var sum uint64
	add := func(c uint64) {
		if sum+c < sum {
			sum = ^uint64(0)
		} else {
			sum += c
		}
	}
	if t.body != nil {
		add(t.body.cost.Max)
	}
	for _, h := range t.headers {
		add(h.p.cost.Max)
	}
	return sum
}

// Apply evaluates the transformation on in. A nil Transform gives an empty Output (send the
// event as it is). An error (*Error) names the expression that failed and why: an
// evaluation error, a body above MaxBodyBytes or that JSON cannot hold, a header value that
// is not valid; it is never a panic.
func (t *Transform) Apply(ctx context.Context, in *Input) (out *Output, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, &Error{Field: "spec.transform", Msg: fmt.Sprintf("internal error applying the transformation: %v", r)}
		}
	}()
	out = &Output{}
	if t == nil {
		return out, nil
	}
	if t.body != nil {
		v, err := t.body.eval(ctx, in)
		if err != nil {
			return nil, err
		}
		if out.Body, out.ContentType, err = encodeBody(v); err != nil {
			return nil, &Error{Field: t.body.field, Msg: err.Error()}
		}
	}
	for _, h := range t.headers {
		v, err := h.p.eval(ctx, in)
		if err != nil {
			return nil, err
		}
		s, ok, err := headerValue(v)
		if err != nil {
			return nil, &Error{Field: h.p.field, Msg: err.Error()}
		}
		if ok {
			if out.Headers == nil {
				out.Headers = make(http.Header, len(t.headers))
			}
			out.Headers[h.name] = []string{s}
		}
	}
	return out, nil
}

// reservedHeaders are the headers the dispatcher sets, which spec.headers and a
// transformation cannot set (besides every webhook-* header).
var reservedHeaders = []string{"content-type", "content-length", "host", "user-agent",
	"x-webhook-event-id", "x-webhook-delivery-attempt", "traceparent", "tracestate"}

// checkHeaderName says why name cannot be a transformation's header, or "".
func checkHeaderName(name string) string {
	if name == "" || len(name) > 128 {
		return "header names must be HTTP tokens of 1 to 128 characters"
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return "header names must be HTTP tokens of 1 to 128 characters"
		}
	}
	lower := strings.ToLower(name)
	if strings.HasPrefix(lower, "webhook-") || slices.Contains(reservedHeaders, lower) {
		return "the dispatcher owns this header (webhook-*, content-type, content-length, host, user-agent, x-webhook-event-id, x-webhook-delivery-attempt, traceparent, tracestate)"
	}
	return ""
}

func isTokenChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&*+-.^_`|~", c) >= 0
}

// headerValue is the header value of v: a string, a number or a bool as string() writes
// them; ok is false for null (no header).
func headerValue(v ref.Val) (s string, ok bool, err error) {
	switch x := v.(type) {
	case types.String:
		s = string(x)
	case types.Null:
		return "", false, nil
	case *types.Optional:
		if !x.HasValue() {
			return "", false, nil
		}
		return headerValue(x.GetValue())
	case types.Int, types.Uint, types.Double, types.Bool:
		str, isStr := x.ConvertToType(types.StringType).(types.String)
		if !isStr {
			return "", false, fmt.Errorf("cannot write %s as a header value", typeName(v))
		}
		s = string(str)
	default:
		return "", false, fmt.Errorf("a header value must be a string, a number, a bool or null, not %s", typeName(v))
	}
	if len(s) > MaxHeaderValueBytes {
		return "", false, fmt.Errorf("the header value is %d bytes; at most %d are allowed", len(s), MaxHeaderValueBytes)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return "", false, fmt.Errorf("the header value has a control character (0x%02x) at byte %d", c, i)
		}
	}
	return s, true, nil
}
