package deliveries

import (
	"strings"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
)

// Where names the stream whose message gave an entry its state.
type Where int

// The sources of entries.
const (
	FromLog Where = iota
	FromDeliveries
	FromRetries
	FromEvents
)

// Entry is one delivery and where it stands or, in the attempts view, one attempt.
type Entry struct {
	// ID is the delivery id (whdl_...).
	ID       string
	Endpoint string
	// Status is records.StatePending, StateAttempting, StateFailed (a retry is due at
	// NextAttemptAt), StateSucceeded or StateDeadLetter.
	Status    string
	EventID   string
	EventType string
	// EventSeq is the event's sequence in the events stream, when known.
	EventSeq uint64
	// Attempts already completed.
	Attempts int
	// Attempt is the attempt's number, in the attempts view.
	Attempt int
	// Time the delivery reached this status (when the message saying so was stored).
	Time          time.Time
	CreatedAt     *time.Time
	LastAttemptAt *time.Time
	NextAttemptAt *time.Time
	// LastResponse of the last attempt: status code, body (2 KB) or error.
	LastResponse *records.Response
	LatencyMS    *int64
	// LatencyUS is the same in microseconds; nil for records written before it existed.
	LatencyUS *int64
	Test      bool
	// Reason of the last failure (status_code, timeout, ...).
	Reason           string
	DeadLetterReason string
	ReplayOfID       string
	// HeldReason says why a pending delivery waits (its endpoint's hold), if it does.
	HeldReason string
	// RequestHeaders as sent (attempts view and the log's records), secrets redacted.
	RequestHeaders map[string]string
	// History is the attempts a live delivery's message carries.
	History []records.Attempt
	// PayloadRemoved says why the record no longer has its payload.
	PayloadRemoved string
	// From and Seq locate the message that gave the entry its state.
	From Where
	Seq  uint64
	// Cursor continues the page after this entry.
	Cursor Cursor
}

// TraceID is the W3C trace id of the entry's last attempt, when its request carried one.
func (e *Entry) TraceID() string {
	tp := e.RequestHeaders["traceparent"]
	if tp == "" {
		tp = e.RequestHeaders["Traceparent"]
	}
	parts := strings.Split(tp, "-")
	if len(parts) == 4 && len(parts[1]) == 32 {
		return parts[1]
	}
	return ""
}

// setLatency sets the entry's latency: whole milliseconds, and microseconds when the record
// has them.
func (e *Entry) setLatency(ms, us int64) {
	e.LatencyMS = &ms
	e.LatencyUS = nil
	if us > 0 {
		e.LatencyUS = &us
	}
}

// entryOfRecord is a delivery-log record as an entry.
func entryOfRecord(rec records.LogRecord, m *streamread.Msg, attemptsView bool) Entry {
	e := Entry{
		ID:               rec.DeliveryID,
		Endpoint:         rec.Endpoint,
		Status:           rec.State,
		EventID:          rec.EventID,
		EventType:        rec.EventType,
		EventSeq:         rec.EventSeq,
		Attempts:         rec.Attempt,
		Time:             m.Time.UTC(),
		NextAttemptAt:    rec.NextAttemptAt,
		Reason:           rec.Reason,
		DeadLetterReason: rec.DeadLetterReason,
		ReplayOfID:       rec.ReplayOf,
		Test:             rec.Test,
		RequestHeaders:   rec.RequestHeaders,
		PayloadRemoved:   rec.PayloadRemoved,
		From:             FromLog,
		Seq:              m.Seq,
	}
	if attemptsView {
		e.Attempt = rec.Attempt
	}
	if !rec.Time.IsZero() {
		t := rec.Time.UTC()
		e.LastAttemptAt = &t
	}
	if rec.Attempt > 0 {
		e.setLatency(rec.LatencyMS, rec.LatencyUS)
	}
	if rec.Response != (records.Response{}) {
		resp := rec.Response
		e.LastResponse = &resp
	}
	return e
}

// entryOfDelivery is a message of the deliveries stream (a delivery or a scheduled retry) as
// an entry in state.
func entryOfDelivery(m *streamread.Msg, state string, where Where) Entry {
	meta := records.ParseDeliveryMeta(m.Header)
	e := Entry{
		ID:         meta.DeliveryID,
		Endpoint:   meta.Endpoint,
		Status:     state,
		EventID:    meta.EventID,
		EventType:  meta.EventType,
		EventSeq:   meta.EventSeq,
		Attempts:   meta.Attempts,
		Time:       m.Time.UTC(),
		ReplayOfID: meta.ReplayOf,
		Test:       meta.Test,
		History:    meta.History,
		From:       where,
		Seq:        m.Seq,
	}
	if !meta.Created.IsZero() {
		t := meta.Created.UTC()
		e.CreatedAt = &t
	}
	if n := len(meta.History); n > 0 {
		last := meta.History[n-1]
		t := last.Time.UTC()
		e.LastAttemptAt = &t
		e.setLatency(last.LatencyMS, last.LatencyUS)
		e.Reason = last.Reason
		e.LastResponse = &records.Response{StatusCode: last.StatusCode, Error: last.Error}
		if e.Attempts < n {
			e.Attempts = n
		}
	}
	if at, ok := scheduledAt(m.Header.Get("Nats-Schedule")); ok {
		e.NextAttemptAt = &at
	}
	return e
}

// inFlight completes an in-flight delivery's entry with its newest logged attempt: a failed
// attempt whose retry is still ahead makes the delivery failed (retried in place), otherwise
// it is attempting, with the attempts made so far.
func inFlight(e *Entry, rec *records.LogRecord, now time.Time) {
	if rec == nil || rec.Attempt < e.Attempts {
		return
	}
	e.Attempts = rec.Attempt
	t := rec.Time.UTC()
	e.LastAttemptAt = &t
	e.setLatency(rec.LatencyMS, rec.LatencyUS)
	resp := rec.Response
	e.LastResponse = &resp
	e.Reason = rec.Reason
	e.RequestHeaders = rec.RequestHeaders
	if rec.State == records.StateFailed && rec.NextAttemptAt != nil && rec.NextAttemptAt.After(now) {
		e.Status = records.StateFailed
		next := rec.NextAttemptAt.UTC()
		e.NextAttemptAt = &next
	}
}

// scheduledAt reads a one-shot message schedule ("@at <RFC 3339 time>").
func scheduledAt(v string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(v), "@at ")
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(rest))
	if err != nil {
		return time.Time{}, false
	}
	return t.UTC(), true
}
