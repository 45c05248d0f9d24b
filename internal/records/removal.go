package records

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// Why a record no longer holds its payload.
const (
	// PayloadExpired: the endpoint's payload retention passed (spec.payloadRetention, or its
	// namespace's WebhookQuota).
	PayloadExpired = "expired"
	// PayloadErased: a WebhookErasure selected its event.
	PayloadErased = "erased"
)

// Headers of a message that replaces a stored one without its payload. JetStream cannot
// change a stored message: the replacement is published, then the original deleted.
const (
	// HPayloadRemoved says why (PayloadExpired, PayloadErased).
	HPayloadRemoved = "Whk-Payload-Removed"
	// HRewriteOf is the stream sequence of the message a delivery-log message replaces. The
	// fold of the log into health counts passes over such a message: the original was
	// counted (the replacement is written only once it was), so counts never change because
	// a payload was removed.
	HRewriteOf = "Whk-Rewrite-Of"
)

// PayloadRemovedReason says in words who removed a payload for why (PayloadExpired,
// PayloadErased).
func PayloadRemovedReason(why string) string {
	switch why {
	case PayloadExpired:
		return "the endpoint's payload retention passed"
	case PayloadErased:
		return "a WebhookErasure selected its event"
	}
	return why
}

// HasPayload reports whether rec still holds a payload: request headers as sent, or a
// response body.
func (rec *LogRecord) HasPayload() bool {
	return len(rec.RequestHeaders) > 0 || rec.Response.Body != ""
}

// RemovePayload drops rec's payload, saying why; its outcome, attempt, times, latency,
// status code and error stay.
func (rec *LogRecord) RemovePayload(why string) {
	rec.RequestHeaders = nil
	rec.Response.Body = ""
	rec.Response.Truncated = false
	rec.PayloadRemoved = why
}

// RewriteID is the message id of the replacement of the message stored at seq in stream, so
// that writing it again (an erasure or a sweep resumed after a crash, within the stream's
// de-duplication window) keeps one.
func RewriteID(stream string, seq uint64) string {
	return "rw:" + stream + ":" + strconv.FormatUint(seq, 10)
}

// RewriteLog is the replacement of the delivery-log message at seq in stream (subject, data)
// in which the records remove selects lose their payload (RemovePayload with why), and how
// many did; nil and 0 when none of those has a payload left. Every record and its outcome
// headers stay, so the log reads as before.
func RewriteLog(stream string, seq uint64, subject string, data []byte, remove func(*LogRecord) bool, why string) (*nats.Msg, int) {
	recs := LogRecords(data)
	n := 0
	for i := range recs {
		if recs[i].HasPayload() && remove(&recs[i]) {
			recs[i].RemovePayload(why)
			n++
		}
	}
	if n == 0 {
		return nil, 0
	}
	entries := make([]LogEntry, len(recs))
	for i := range recs {
		entries[i] = EncodeLog(&recs[i], nil)
	}
	msg := LogBatch(subject, entries)
	msg.Header.Set(HeaderMsgID, RewriteID(stream, seq))
	msg.Header.Set(HRewriteOf, strconv.FormatUint(seq, 10))
	msg.Header.Set(HPayloadRemoved, why)
	return msg, n
}

// IsRewrite reports whether a delivery-log message replaces an earlier one (RewriteLog).
func IsRewrite(h nats.Header) bool { return h.Get(HRewriteOf) != "" }

// DeadLetterHasPayload reports whether a dead-letter message still holds its payload.
func DeadLetterHasPayload(h nats.Header) bool { return h.Get(HPayloadRemoved) == "" }

// RewriteDeadLetter is the replacement of a dead-letter message (its subject and headers)
// without its payload: no body, no event headers, no body of the last response; its reason,
// message, attempts and last status code stay, with PayloadRemoved saying why and when.
// The replacement's message id names the original's place (RewriteID).
func RewriteDeadLetter(stream string, seq uint64, subject string, h nats.Header, why string, at time.Time) (*nats.Msg, error) {
	dl, err := ParseDeadLetter(h)
	if err != nil {
		return nil, err
	}
	dl.Headers = nil
	if dl.LastResponse != nil {
		r := *dl.LastResponse
		r.Body, r.Truncated = "", false
		dl.LastResponse = &r
	}
	dl.PayloadRemoved = why
	t := at.UTC()
	dl.PayloadRemovedAt = &t
	b, err := json.Marshal(dl)
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subject)
	msg.Header.Set(HDeadLetter, string(b))
	msg.Header.Set(HeaderMsgID, RewriteID(stream, seq))
	msg.Header.Set(HPayloadRemoved, why)
	if dl.RetainFrom != nil {
		msg.Header.Set(HRetainFrom, dl.RetainFrom.UTC().Format(time.RFC3339Nano))
	}
	return msg, nil
}
