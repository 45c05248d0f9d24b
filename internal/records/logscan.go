package records

import (
	"encoding/json"
	"time"
	"unicode/utf8"
)

// stateKeys are the members of a record a LogState has; responseKeys those of its response.
var (
	stateKeys    = []string{"deliveryId", "state", "attempt", "time", "latencyMs", "latencyUs", "reason", "response", "nextAttemptAt"}
	responseKeys = []string{"statusCode", "error"}
)

// scanState reads the members of a LogState from line, one JSON object, passing over every
// other member (the request headers, the response body) without decoding it. It returns false
// when line holds anything it does not expect (a member of the state spelled in another case,
// a null, a number that is not an integer, a string encoding/json would decode differently, an
// object that does not end): encoding/json decides those. A member passed over is not
// checked beyond finding where it ends.
func scanState(line []byte, st *LogState) bool {
	*st = LogState{}
	s := scanner{b: line}
	return s.object(stateKeys, func(key string) (ok bool) {
		switch key {
		case "deliveryId":
			st.DeliveryID, ok = s.string()
		case "state":
			st.State, ok = s.string()
		case "attempt":
			var n int64
			n, ok = s.int()
			st.Attempt = int(n)
		case "time":
			ok = s.time(&st.Time)
		case "latencyMs":
			st.LatencyMS, ok = s.int()
		case "latencyUs":
			st.LatencyUS, ok = s.int()
		case "reason":
			st.Reason, ok = s.string()
		case "response":
			ok = s.object(responseKeys, func(key string) (ok bool) {
				if key == "statusCode" {
					var n int64
					n, ok = s.int()
					st.Response.StatusCode = int(n)
				} else {
					st.Response.Error, ok = s.string()
				}
				return ok
			})
		case "nextAttemptAt":
			var t time.Time
			ok = s.time(&t)
			st.NextAttemptAt = &t
		}
		return ok
	}) && s.end()
}

// object reads an object: read reads the value of each member named in names (and reports
// whether it could); every other member is passed over. False when a member is one of names in
// another case (encoding/json would take it for that one) or the object is not well formed.
func (s *scanner) object(names []string, read func(name string) bool) bool {
	if !s.take('{') {
		return false
	}
	if s.take('}') {
		return true
	}
	for {
		key, ok := s.plainString()
		if !ok || !s.take(':') {
			return false
		}
		if name, known := exactly(key, names); known {
			ok = read(name)
		} else if anyFold(key, names...) {
			return false
		} else {
			ok = s.skip(0)
		}
		if !ok {
			return false
		}
		if s.take(',') {
			continue
		}
		return s.take('}')
	}
}

// exactly returns the one of names that key is.
func exactly(key []byte, names []string) (string, bool) {
	for _, n := range names {
		if string(key) == n {
			return n, true
		}
	}
	return "", false
}

// scanner reads JSON tokens from b, passing over white space before each.
type scanner struct {
	b []byte
	i int
}

// maxSkipDepth bounds the nesting of a member passed over.
const maxSkipDepth = 64

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

// take consumes c, the next byte that is not white space, and reports whether it was there.
func (s *scanner) take(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether nothing but white space is left.
func (s *scanner) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// stringToken returns the next token, a string with its quotes, and whether it holds an
// escape or a byte beyond ASCII.
func (s *scanner) stringToken() (tok []byte, special, ok bool) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false, false
	}
	start := s.i
	for j := s.i + 1; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			return s.b[start:s.i], special, true
		case c == '\\':
			special = true
			j++ // the escaped byte; encoding/json checks the escape when it decodes
		case c < 0x20:
			return nil, false, false // not JSON
		case c >= utf8.RuneSelf:
			special = true
		}
	}
	return nil, false, false
}

// plainString returns the next token, a string without escapes or bytes beyond ASCII (a
// member's name as the log's writers write it).
func (s *scanner) plainString() ([]byte, bool) {
	tok, special, ok := s.stringToken()
	if !ok || special {
		return nil, false
	}
	return tok[1 : len(tok)-1], true
}

// anyFold reports whether key is one of names in another case (encoding/json would take it
// for that name).
func anyFold(key []byte, names ...string) bool {
	for _, n := range names {
		if len(n) != len(key) {
			continue
		}
		same := true
		for i := range len(n) {
			a, b := n[i], key[i]
			if a|0x20 != b|0x20 {
				same = false
				break
			}
		}
		if same {
			return true
		}
	}
	return false
}

// string returns the next token, a string, decoded as encoding/json decodes it.
func (s *scanner) string() (string, bool) {
	tok, special, ok := s.stringToken()
	if !ok {
		return "", false
	}
	if !special {
		return string(tok[1 : len(tok)-1]), true
	}
	var v string
	return v, json.Unmarshal(tok, &v) == nil
}

// int returns the next token, an integer (no fraction, no exponent).
func (s *scanner) int() (int64, bool) {
	s.ws()
	j := s.i
	neg := j < len(s.b) && s.b[j] == '-'
	if neg {
		j++
	}
	var n int64
	digits := 0
	for ; j < len(s.b) && s.b[j] >= '0' && s.b[j] <= '9'; j++ {
		if digits++; digits > 18 || (digits > 1 && n == 0) {
			return 0, false // beyond what is read here without overflow, or a leading zero
		}
		n = n*10 + int64(s.b[j]-'0')
	}
	if digits == 0 || (j < len(s.b) && (s.b[j] == '.' || s.b[j] == 'e' || s.b[j] == 'E')) {
		return 0, false
	}
	s.i = j
	if neg {
		n = -n
	}
	return n, true
}

// time reads the next token, a time as time.Time's JSON form.
func (s *scanner) time(t *time.Time) bool {
	tok, _, ok := s.stringToken()
	return ok && t.UnmarshalJSON(tok) == nil
}

// skip passes over the next value, of any kind, at nesting depth.
func (s *scanner) skip(depth int) bool {
	s.ws()
	if s.i >= len(s.b) || depth > maxSkipDepth {
		return false
	}
	switch c := s.b[s.i]; c {
	case '"':
		_, _, ok := s.stringToken()
		return ok
	case '{', '[':
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		s.i++
		if s.take(closing) {
			return true
		}
		for {
			if c == '{' {
				if _, _, ok := s.stringToken(); !ok || !s.take(':') {
					return false
				}
			}
			if !s.skip(depth + 1) {
				return false
			}
			if s.take(',') {
				continue
			}
			return s.take(closing)
		}
	default:
		// A number or a literal: up to the next delimiter.
		j := s.i
		for j < len(s.b) && !delimiter(s.b[j]) {
			j++
		}
		if j == s.i {
			return false
		}
		s.i = j
		return true
	}
}

func delimiter(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}
