package records

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// MaxEventIDLength bounds an event id (it is sent as the webhook-id header).
const MaxEventIDLength = 256

// InvalidEvent says why an event cannot be delivered as published, or "". Everything a
// producer supplies that becomes part of a request is checked here, at routing time, so a
// request the dispatcher could not build never counts against the receiver: the event id
// (the webhook-id header), the event type (a header), and the producer's headers that are
// forwarded (names must be HTTP tokens, values must hold no control characters).
func InvalidEvent(eventID, eventType string, h nats.Header) string {
	if len(eventID) > MaxEventIDLength {
		return fmt.Sprintf("the event id is %d characters; at most %d are allowed", len(eventID), MaxEventIDLength)
	}
	for i := 0; i < len(eventID); i++ {
		if c := eventID[i]; c <= ' ' || c > '~' {
			return "the event id must be printable ASCII without spaces"
		}
	}
	if i := invalidValueAt(eventType); i >= 0 {
		return fmt.Sprintf("the event type %s holds a control character at byte %d", strconv.Quote(Bound(eventType, 64)), i)
	}
	for k, vs := range h {
		if IsOperatorHeader(k) {
			continue
		}
		if !validToken(k) {
			return fmt.Sprintf("the header name %s is not an HTTP token", strconv.Quote(Bound(k, 64)))
		}
		for _, v := range vs {
			if i := invalidValueAt(v); i >= 0 {
				return fmt.Sprintf("the value of header %s holds a control character at byte %d", k, i)
			}
		}
	}
	return ""
}

// invalidValueAt is the index of the first byte an HTTP header value may not hold, or -1.
func invalidValueAt(v string) int {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return i
		}
	}
	return -1
}

// validToken reports whether k is an HTTP token (RFC 9110), as a header name must be.
func validToken(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '!' || c == '#' || c == '$' || c == '%' || c == '&' || c == '\'' || c == '*' ||
			c == '+' || c == '-' || c == '.' || c == '^' || c == '_' || c == '`' || c == '|' || c == '~':
		default:
			return false
		}
	}
	return true
}
