package records

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// DeliveryMeta is what a delivery message's headers say about it.
type DeliveryMeta struct {
	DeliveryID string
	EventID    string
	EventType  string
	EventTime  time.Time
	EventSeq   uint64
	// EventNamespace is the namespace whose events stream the event was published to when it
	// is not the delivery's (Namespace): an event of a source namespace
	// (spec.sourceNamespaces). Empty for the namespace's own events. EventSeq counts in that
	// namespace's stream.
	EventNamespace string
	Namespace      string
	Endpoint       string
	Created        time.Time
	// Attempts already made before this message was delivered.
	Attempts int
	History  []Attempt
	ReplayOf string
	// Test marks a one-shot test delivery (HTest).
	Test bool
	// Redelivered says the delivery was delivered before (it, or a message it was copied from:
	// a held event, a scheduled retry): an outcome of it may have been logged already
	// (HRedelivered).
	Redelivered bool
	// RetainFrom is when the payload's retention counts from, when it was stored before this
	// delivery (HRetainFrom): a replay of a dead letter carries the original's, and so does
	// every message and dead letter written of it. Zero: from when each is stored.
	RetainFrom time.Time
}

// ParseDeliveryMeta reads a delivery message's headers. Missing or damaged values are left
// zero; the caller decides whether that makes the delivery invalid.
func ParseDeliveryMeta(h nats.Header) DeliveryMeta {
	m := DeliveryMeta{
		DeliveryID:     h.Get(HDeliveryID),
		EventID:        h.Get(HEventID),
		EventType:      h.Get(HEventType),
		EventNamespace: h.Get(HEventNamespace),
		Namespace:      h.Get(HNamespace),
		Endpoint:       h.Get(HEndpoint),
		ReplayOf:       h.Get(HReplayOf),
		History:        DecodeHistory(h.Get(HHistory)),
		Test:           h.Get(HTest) == "true",
		Redelivered:    h.Get(HRedelivered) == "true",
	}
	m.EventTime, _ = time.Parse(time.RFC3339Nano, h.Get(HEventTime))
	m.Created, _ = time.Parse(time.RFC3339Nano, h.Get(HCreated))
	m.EventSeq, _ = strconv.ParseUint(h.Get(HEventSeq), 10, 64)
	m.Attempts, _ = strconv.Atoi(h.Get(HAttempts))
	m.RetainFrom, _ = time.Parse(time.RFC3339Nano, h.Get(HRetainFrom))
	return m
}

// SetDeliveryMeta writes m into h.
func SetDeliveryMeta(h nats.Header, m DeliveryMeta) {
	h.Set(HDeliveryID, m.DeliveryID)
	h.Set(HEventID, m.EventID)
	h.Set(HEventType, m.EventType)
	if !m.EventTime.IsZero() {
		h.Set(HEventTime, m.EventTime.UTC().Format(time.RFC3339Nano))
	}
	if m.EventSeq > 0 {
		h.Set(HEventSeq, strconv.FormatUint(m.EventSeq, 10))
	}
	if m.EventNamespace != "" {
		h.Set(HEventNamespace, m.EventNamespace)
	}
	h.Set(HNamespace, m.Namespace)
	h.Set(HEndpoint, m.Endpoint)
	if !m.Created.IsZero() {
		h.Set(HCreated, m.Created.UTC().Format(time.RFC3339Nano))
	}
	h.Set(HAttempts, strconv.Itoa(m.Attempts))
	if len(m.History) > 0 {
		h.Set(HHistory, EncodeHistory(m.History))
	} else {
		h.Del(HHistory)
	}
	if m.ReplayOf != "" {
		h.Set(HReplayOf, m.ReplayOf)
	}
	if m.Test {
		h.Set(HTest, "true")
	}
	if m.Redelivered {
		h.Set(HRedelivered, "true")
	}
	if !m.RetainFrom.IsZero() {
		h.Set(HRetainFrom, m.RetainFrom.UTC().Format(time.RFC3339Nano))
	}
}

// RetainFrom is when the payload of a stored dead letter or delivery (headers h, stored at
// stored) counts its retention from: its HRetainFrom when that is earlier, else when it was
// stored.
func RetainFrom(h nats.Header, stored time.Time) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, h.Get(HRetainFrom)); err == nil && t.Before(stored) {
		return t
	}
	return stored
}

// EventHeaders are the headers of the event as published: everything that is neither
// JetStream's (Nats-*) nor the operator's (Whk-*).
func EventHeaders(h nats.Header) map[string][]string {
	out := nats.Header{}
	CopyEventHeaders(out, h)
	if len(out) == 0 {
		return nil
	}
	return out
}

// NewDeadLetter builds the dead letter of a delivery message (its headers and payload). What
// a receiver supplied (the last response, every attempt's error) and the message are bounded,
// with URLs redacted. A message without a delivery id gets one from Identify.
func NewDeadLetter(h nats.Header, reason, message string, lastResponse *Response, now time.Time) DeadLetter {
	m := ParseDeliveryMeta(h)
	if lastResponse != nil {
		r := lastResponse.Bounded()
		lastResponse = &r
	}
	attempts := m.History
	for i := range attempts {
		attempts[i].Error = Bound(RedactURLs(attempts[i].Error), MaxHistoryError)
	}
	var retainFrom *time.Time
	if !m.RetainFrom.IsZero() {
		t := m.RetainFrom.UTC()
		retainFrom = &t
	}
	return DeadLetter{
		DeliveryID:     m.DeliveryID,
		EventID:        m.EventID,
		EventType:      m.EventType,
		EventTime:      m.EventTime,
		EventSeq:       m.EventSeq,
		EventNamespace: m.EventNamespace,
		Namespace:      m.Namespace,
		Endpoint:       m.Endpoint,
		Reason:         reason,
		Message:        Bound(RedactURLs(message), MaxMessageText),
		Attempts:       attempts,
		LastResponse:   lastResponse,
		Headers:        EventHeaders(h),
		CreatedAt:      m.Created,
		DeadLetteredAt: now.UTC(),
		ReplayOf:       m.ReplayOf,
		RetainFrom:     retainFrom,
	}
}

// MaxHistoryError bounds one attempt's error in a delivery's history.
const MaxHistoryError = 256

// DeliveryIDAt is the delivery id of a message that carries none (not written by a
// dispatcher, or damaged), named after where it is stored, so every writer of its dead
// letter (the dispatcher, the controller's drain after a deletion) names it alike and
// JetStream keeps one. For an event a dispatcher cannot deliver, stream and seq are the
// event's.
func DeliveryIDAt(stream string, seq uint64, endpoint string) string {
	return hashID("stored", stream, strconv.FormatUint(seq, 10), endpoint)
}

// Identify gives dl what its delivery message did not say: the namespace and endpoint whose
// consumer it came from, and a delivery id from where it is stored (see DeliveryIDAt).
func (dl *DeadLetter) Identify(stream string, seq uint64, namespace, endpoint string) {
	if dl.Namespace == "" {
		dl.Namespace = namespace
	}
	if dl.Endpoint == "" {
		dl.Endpoint = endpoint
	}
	if dl.DeliveryID == "" {
		dl.DeliveryID = DeliveryIDAt(stream, seq, endpoint)
	}
}

// DeadLetterMessage is the dead-letter message of dl: the payload as body, the record in the
// HDeadLetter header, and a message id so that writing it twice keeps one. It fits
// maxPayload (0: no limit): when the record and the payload do not, the producer's headers
// and the attempt history are shortened, then the payload is cut and marked
// PayloadTruncated.
func DeadLetterMessage(subject string, dl DeadLetter, payload []byte, maxPayload int64) *nats.Msg {
	msg := deadLetterMsg(subject, dl, payload)
	if Fits(msg, maxPayload) {
		return msg
	}
	// Shorten what the record repeats of the event; keep the last attempts.
	if n := len(dl.Attempts); n > maxKeptAttempts {
		dl.Attempts = dl.Attempts[n-maxKeptAttempts:]
	}
	if len(dl.Headers) > 0 {
		short := make(map[string][]string, len(dl.Headers))
		for k, vs := range dl.Headers {
			if len(short) >= maxKeptHeaders {
				break
			}
			short[Bound(k, 128)] = []string{Bound(vs[0], MaxHeaderValue)}
		}
		dl.Headers = short
	}
	dl.PayloadTruncated = true
	msg = deadLetterMsg(subject, dl, nil)
	room := maxPayload - MsgSize(msg)
	switch {
	case room <= 0:
		msg.Data = nil
	case int64(len(payload)) > room:
		msg.Data = payload[:room]
	default:
		msg.Data = payload
	}
	return msg
}

// How much of a too-large dead letter's record is kept.
const (
	maxKeptAttempts = 32
	maxKeptHeaders  = 32
)

func deadLetterMsg(subject string, dl DeadLetter, payload []byte) *nats.Msg {
	msg := nats.NewMsg(subject)
	b, _ := json.Marshal(dl)
	msg.Header.Set(HDeadLetter, string(b))
	msg.Header.Set(HeaderMsgID, "dlq:"+dl.DeliveryID)
	if dl.RetainFrom != nil {
		// Read by the retention sweep without decoding the record.
		msg.Header.Set(HRetainFrom, dl.RetainFrom.UTC().Format(time.RFC3339Nano))
	}
	if ct := firstHeader(dl.Headers, HeaderContentType); ct != "" {
		msg.Header.Set(HeaderContentType, ct)
	}
	msg.Data = payload
	return msg
}

// ParseDeadLetter reads a dead-letter message.
func ParseDeadLetter(h nats.Header) (DeadLetter, error) {
	var dl DeadLetter
	err := json.Unmarshal([]byte(h.Get(HDeadLetter)), &dl)
	return dl, err
}

func firstHeader(h map[string][]string, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}
