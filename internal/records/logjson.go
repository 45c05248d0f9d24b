package records

import (
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendJSON appends rec encoded exactly as encoding/json would encode it, without reflection:
// the dispatcher writes one record per attempt, so this is on the delivery path.
func (rec *LogRecord) AppendJSON(b []byte) []byte {
	b = append(b, `{"deliveryId":`...)
	b = appendString(b, rec.DeliveryID)
	b = append(b, `,"eventId":`...)
	b = appendString(b, rec.EventID)
	b = append(b, `,"eventType":`...)
	b = appendString(b, rec.EventType)
	if rec.EventSeq != 0 {
		b = append(b, `,"eventSeq":`...)
		b = strconv.AppendUint(b, rec.EventSeq, 10)
	}
	if rec.EventNamespace != "" {
		b = append(b, `,"eventNamespace":`...)
		b = appendString(b, rec.EventNamespace)
	}
	b = append(b, `,"namespace":`...)
	b = appendString(b, rec.Namespace)
	b = append(b, `,"endpoint":`...)
	b = appendString(b, rec.Endpoint)
	b = append(b, `,"state":`...)
	b = appendString(b, rec.State)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(rec.Attempt), 10)
	b = append(b, `,"time":`...)
	b = appendTime(b, rec.Time)
	b = append(b, `,"latencyMs":`...)
	b = strconv.AppendInt(b, rec.LatencyMS, 10)
	if rec.LatencyUS != 0 {
		b = append(b, `,"latencyUs":`...)
		b = strconv.AppendInt(b, rec.LatencyUS, 10)
	}
	if rec.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, rec.Reason)
	}
	if len(rec.RequestHeaders) > 0 {
		b = append(b, `,"requestHeaders":{`...)
		keys := make([]string, 0, len(rec.RequestHeaders))
		for k := range rec.RequestHeaders {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendString(b, rec.RequestHeaders[k])
		}
		b = append(b, '}')
	}
	b = append(b, `,"response":{`...)
	first := true
	field := func(name string) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":`...)
	}
	if rec.Response.StatusCode != 0 {
		field("statusCode")
		b = strconv.AppendInt(b, int64(rec.Response.StatusCode), 10)
	}
	if rec.Response.Body != "" {
		field("body")
		b = appendString(b, rec.Response.Body)
	}
	if rec.Response.Truncated {
		field("truncated")
		b = append(b, "true"...)
	}
	if rec.Response.Error != "" {
		field("error")
		b = appendString(b, rec.Response.Error)
	}
	b = append(b, '}')
	if rec.NextAttemptAt != nil {
		b = append(b, `,"nextAttemptAt":`...)
		b = appendTime(b, *rec.NextAttemptAt)
	}
	if rec.ReplayOf != "" {
		b = append(b, `,"replayOf":`...)
		b = appendString(b, rec.ReplayOf)
	}
	if rec.DeadLetterReason != "" {
		b = append(b, `,"deadLetterReason":`...)
		b = appendString(b, rec.DeadLetterReason)
	}
	if rec.Test {
		b = append(b, `,"test":true`...)
	}
	if rec.PayloadRemoved != "" {
		b = append(b, `,"payloadRemoved":`...)
		b = appendString(b, rec.PayloadRemoved)
	}
	return append(b, '}')
}

func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as a JSON string the way encoding/json does (HTML-safe
// escaping, invalid UTF-8 replaced, U+2028 and U+2029 escaped).
func AppendJSONString(b []byte, s string) []byte { return appendString(b, s) }

// appendString appends s as a JSON string the way encoding/json does (HTML-safe escaping,
// invalid UTF-8 replaced, U+2028 and U+2029 escaped).
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
