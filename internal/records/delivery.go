package records

import (
	"strconv"

	"github.com/nats-io/nats.go"
)

// IsOperatorHeader reports whether a header name is JetStream's (Nats-*) or the operator's
// (Whk-*): a producer may never set these on a delivery.
func IsOperatorHeader(k string) bool {
	return len(k) >= 4 && (hasPrefixFold(k, "Nats-") || hasPrefixFold(k, "Whk-"))
}

// StripOperatorHeaders deletes from h, the headers of an event as it was taken from an events
// stream, every operator header (Whk-*, in any case) its publisher set. The operator writes
// these on delivery messages only, in the deliveries stream, and NATS permissions cannot
// filter on headers: a producer allowed to publish its namespace's events can set any of them,
// and nothing read from an event may pass for a delivery's attempt count, id, test mark or
// replay pointer. An operational event (IsOpsType of its eventType; producers may not publish
// those) keeps HOpsEndpoint, which the operator sets on it. It reports how many headers it
// deleted.
func StripOperatorHeaders(h nats.Header, eventType string) int {
	ops := IsOpsType(eventType)
	n := 0
	for k := range h {
		if hasPrefixFold(k, "Whk-") && !(ops && k == HOpsEndpoint) {
			delete(h, k)
			n++
		}
	}
	return n
}

func hasPrefixFold(s, prefix string) bool {
	if len(s) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		p := prefix[i]
		if 'A' <= p && p <= 'Z' {
			p += 'a' - 'A'
		}
		if c != p {
			return false
		}
	}
	return true
}

// CopyEventHeaders copies the producer's headers of h into out: everything but JetStream's
// and the operator's own, which a producer could otherwise forge (a replay-of pointer, an
// attempt count). Values are shared, not copied: headers are never modified in place.
func CopyEventHeaders(out, h nats.Header) {
	for k, v := range h {
		if !IsOperatorHeader(k) {
			out[k] = v
		}
	}
}

// NewDelivery makes the delivery message of one event for one endpoint: the event's own
// headers (see CopyEventHeaders), the delivery's metadata, and the delivery id as JetStream's
// message id, so writing the same delivery twice keeps one. A held event, the replay of a dead
// letter and a scheduled retry all make their messages here.
func NewDelivery(subject string, eventHeader nats.Header, payload []byte, m DeliveryMeta) *nats.Msg {
	out := &nats.Msg{Subject: subject, Header: make(nats.Header, len(eventHeader)+12), Data: payload}
	CopyEventHeaders(out.Header, eventHeader)
	SetDeliveryMeta(out.Header, m)
	out.Header[HeaderMsgID] = []string{m.DeliveryID}
	return out
}

// headerPreamble starts every encoded header block.
const headerPreamble = "NATS/1.0\r\n"

// HeaderSize is how many bytes h takes on the wire.
func HeaderSize(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len(headerPreamble) + 2
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + 2 + len(v) + 2
		}
	}
	return n
}

// MsgSize is what msg counts against the server's maximum payload: headers and data.
func MsgSize(msg *nats.Msg) int64 {
	return int64(HeaderSize(msg.Header) + len(msg.Data))
}

// Fits reports whether msg can be published on a connection whose server accepts at most
// maxPayload bytes (0: no limit known).
func Fits(msg *nats.Msg, maxPayload int64) bool {
	return maxPayload <= 0 || MsgSize(msg) <= maxPayload
}

// TooLarge explains why a delivery does not fit.
func TooLarge(size, limit int64) string {
	return "the delivery (event payload and headers) is " + strconv.FormatInt(size, 10) +
		" bytes; the NATS server accepts at most " + strconv.FormatInt(limit, 10)
}
