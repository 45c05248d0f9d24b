package expr

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// errTooLarge is a body above MaxBodyBytes.
var errTooLarge = fmt.Errorf("the body is larger than %d bytes", MaxBodyBytes)

// maxDepth bounds the nesting of a JSON body (encoding/json reads at most 10,000 levels).
const maxDepth = 10000

// encodeBody is the request body of a transformation's value: a string or bytes as they
// are, anything else as JSON.
func encodeBody(v ref.Val) ([]byte, string, error) {
	switch x := v.(type) {
	case types.String:
		if len(x) > MaxBodyBytes {
			return nil, "", errTooLarge
		}
		return []byte(x), ContentTypeText, nil
	case types.Bytes:
		if len(x) > MaxBodyBytes {
			return nil, "", errTooLarge
		}
		return []byte(x), ContentTypeBinary, nil
	}
	e := jsonEncoder{buf: make([]byte, 0, 512)}
	if err := e.value(v, 0); err != nil {
		return nil, "", err
	}
	return e.buf, ContentTypeJSON, nil
}

// jsonEncoder writes CEL values as JSON, at most MaxBodyBytes of it. Map keys are sorted,
// so the same value always gives the same bytes.
type jsonEncoder struct {
	buf []byte
}

func (e *jsonEncoder) value(v ref.Val, depth int) error {
	if len(e.buf) > MaxBodyBytes {
		return errTooLarge
	}
	if depth > maxDepth {
		return fmt.Errorf("the body nests deeper than %d levels", maxDepth)
	}
	switch x := v.(type) {
	case types.Null:
		e.buf = append(e.buf, "null"...)
	case types.Bool:
		e.buf = strconv.AppendBool(e.buf, bool(x))
	case types.Int:
		e.buf = strconv.AppendInt(e.buf, int64(x), 10)
	case types.Uint:
		e.buf = strconv.AppendUint(e.buf, uint64(x), 10)
	case types.Double:
		return e.double(float64(x))
	case types.String:
		return e.string(string(x))
	case types.Bytes:
		// As protobuf's JSON mapping writes bytes.
		return e.string(base64.StdEncoding.EncodeToString(x))
	case types.Timestamp:
		return e.string(x.Time.UTC().Format(time.RFC3339Nano))
	case types.Duration:
		return e.string(strconv.FormatFloat(x.Duration.Seconds(), 'f', -1, 64) + "s")
	case *types.Optional:
		if !x.HasValue() {
			e.buf = append(e.buf, "null"...)
			return nil
		}
		return e.value(x.GetValue(), depth+1)
	case *types.Err:
		return x
	case traits.Mapper:
		return e.object(x, depth)
	case traits.Lister:
		return e.array(x, depth)
	default:
		return fmt.Errorf("a %s cannot be written as JSON", typeName(v))
	}
	return nil
}

func (e *jsonEncoder) array(l traits.Lister, depth int) error {
	n, ok := l.Size().(types.Int)
	if !ok {
		return errors.New("a list of unknown size")
	}
	e.buf = append(e.buf, '[')
	for i := types.Int(0); i < n; i++ {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		if err := e.value(l.Get(i), depth+1); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, ']')
	return nil
}

func (e *jsonEncoder) object(m traits.Mapper, depth int) error {
	type entry struct {
		name string
		key  ref.Val
	}
	var entries []entry
	for it := m.Iterator(); it.HasNext() == types.True; {
		k := it.Next()
		var name string
		switch x := k.(type) {
		case types.String:
			name = string(x)
		case types.Int, types.Uint, types.Bool:
			name = fmt.Sprint(x.Value())
		default:
			return fmt.Errorf("a map key of type %s cannot be a JSON object's key", typeName(k))
		}
		entries = append(entries, entry{name, k})
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })
	e.buf = append(e.buf, '{')
	for i, en := range entries {
		if i > 0 {
			e.buf = append(e.buf, ',')
		}
		if err := e.string(en.name); err != nil {
			return err
		}
		e.buf = append(e.buf, ':')
		if err := e.value(m.Get(en.key), depth+1); err != nil {
			return err
		}
	}
	e.buf = append(e.buf, '}')
	return nil
}

// double writes f as encoding/json does.
func (e *jsonEncoder) double(f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("%v cannot be written as JSON", f)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	e.buf = strconv.AppendFloat(e.buf, f, format, -1, 64)
	if format == 'e' {
		// 1e-07 becomes 1e-7, as encoding/json writes it.
		if n := len(e.buf); n >= 4 && e.buf[n-4] == 'e' && e.buf[n-3] == '-' && e.buf[n-2] == '0' {
			e.buf[n-2] = e.buf[n-1]
			e.buf = e.buf[:n-1]
		}
	}
	return nil
}

// string writes s as a JSON string, as encoding/json does (invalid UTF-8 becomes U+FFFD).
func (e *jsonEncoder) string(s string) error {
	if len(e.buf)+len(s) > MaxBodyBytes {
		return errTooLarge
	}
	e.buf = records.AppendJSONString(e.buf, s)
	return nil
}
