package expr

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// Event is an event as the dispatcher reads it from a message: a worker fills it from the
// published event (namespace and type from the subject, id and time as it already parses
// them, the message's headers and data), a worker from a delivery's headers. Nothing is
// copied or parsed until an expression asks for it.
type Event struct {
	// ID is the event id (Nats-Msg-Id, or the one derived from the stream sequence).
	ID string
	// Type is the event type, e.g. order.created.
	Type string
	// Namespace is the namespace the event was published in.
	Namespace string
	// Time is the event's time.
	Time time.Time
	// Headers are the message's headers (a nats.Header converts without a copy). Names
	// starting with Nats- (JetStream's) or Whk- (the operator's) are not shown to expressions.
	Headers map[string][]string
	// Data is the event's body.
	Data []byte
}

// DeliveryEvent is the event a delivery message carries (a worker's view): its id, type,
// namespace (where it was published, DeliveryMeta.Origin) and time from the delivery's headers (records.ParseDeliveryMeta), the producer's
// headers and the event's body as they were copied into the delivery.
func DeliveryEvent(meta records.DeliveryMeta, headers map[string][]string, data []byte) *Event {
	return &Event{ID: meta.EventID, Type: meta.EventType, Namespace: meta.Origin(), Time: meta.EventTime, Headers: headers, Data: data}
}

// Input is one event's variables. It parses the body as JSON at most once, the first time an
// expression reads payload, however many expressions of however many endpoints evaluate it;
// raw and headers are also built once, on first use. An Input is safe for concurrent use.
type Input struct {
	ev *Event

	payloadOnce sync.Once
	payload     ref.Val
	isJSON      bool

	rawOnce sync.Once
	raw     ref.Val

	headersOnce sync.Once
	headers     ref.Val
}

// NewInput returns the variables of ev, which must not change while they are in use.
func NewInput(ev *Event) *Input {
	return &Input{ev: ev}
}

// Event is the event the variables are read from.
func (in *Input) Event() *Event { return in.ev }

// IsJSON reports whether the event's body is JSON (otherwise payload is null).
func (in *Input) IsJSON() bool {
	in.parse()
	return in.isJSON
}

// ResolveName implements interpreter.Activation.
func (in *Input) ResolveName(name string) (any, bool) {
	switch name {
	case VarPayload:
		in.parse()
		return in.payload, true
	case VarRaw:
		in.rawOnce.Do(func() { in.raw = types.String(bodyString(in.ev.Data)) })
		return in.raw, true
	case VarType:
		return types.String(in.ev.Type), true
	case VarID:
		return types.String(in.ev.ID), true
	case VarNamespace:
		return types.String(in.ev.Namespace), true
	case VarTime:
		return types.Timestamp{Time: in.ev.Time}, true
	case VarHeaders:
		in.headersOnce.Do(func() { in.headers = types.NewStringStringMap(types.DefaultTypeAdapter, visibleHeaders(in.ev.Headers)) })
		return in.headers, true
	}
	return nil, false
}

// Parent implements interpreter.Activation.
func (in *Input) Parent() interpreter.Activation { return nil }

// parse reads the body as JSON once. A body that is empty or not JSON gives a null payload.
func (in *Input) parse() {
	in.payloadOnce.Do(func() {
		jsonParses.Add(1)
		in.payload = types.NullValue
		if !json.Valid(in.ev.Data) { // also false for an empty body
			return
		}
		dec := json.NewDecoder(bytes.NewReader(in.ev.Data))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return
		}
		in.payload, in.isJSON = jsonAdapter{}.NativeToValue(v), true
	})
}

// jsonParses counts the bodies parsed, for tests.
var jsonParses atomic.Int64

// bodyString is the body as a CEL string: valid UTF-8, invalid bytes replaced by U+FFFD.
func bodyString(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// visibleHeaders are the producer's headers: lower-case names, first value, without
// JetStream's (Nats-*) and the operator's (Whk-*).
func visibleHeaders(h map[string][]string) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) == 0 {
			continue
		}
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "nats-") || strings.HasPrefix(lk, "whk-") {
			continue
		}
		if _, dup := out[lk]; dup && k != lk {
			continue // the same name twice in different cases: the lower-case one wins
		}
		out[lk] = v[0]
	}
	return out
}

// jsonAdapter turns decoded JSON (maps, lists, json.Number, strings, bools, nil) into CEL
// values, lazily: a map or list converts its elements when they are read. Integral numbers
// become int (or uint above int64), others double, as in Kubernetes' CEL.
type jsonAdapter struct{}

// NativeToValue implements types.Adapter.
func (a jsonAdapter) NativeToValue(v any) ref.Val {
	switch x := v.(type) {
	case map[string]any:
		return types.NewStringInterfaceMap(a, x)
	case []any:
		return types.NewDynamicList(a, x)
	case json.Number:
		return number(x)
	}
	return types.DefaultTypeAdapter.NativeToValue(v)
}

func number(n json.Number) ref.Val {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return types.Int(i)
		}
		if u, err := strconv.ParseUint(s, 10, 64); err == nil {
			return types.Uint(u)
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		// Out of double's range: json.Number already checked the syntax.
		return types.NewErr("number %s is out of range", s)
	}
	return types.Double(f)
}
