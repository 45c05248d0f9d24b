package records

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Headers of a delivery-log message that repeat what health counts read of its record, so the
// fold of the log reads headers only (a consumer with HeadersOnly) and decodes no JSON.
const (
	// HOutcome is "<endpoint> <state> <attempt> <unix nanoseconds> <status code> <reason>
	// <dead-letter reason>", "-" standing for an empty reason.
	HOutcome = "Whk-Outcome"
	// HOutcomeError is the error of a failed outcome (bounded to MaxOutcomeError, one line).
	HOutcomeError = "Whk-Outcome-Error"
	// HOutcomeIDs names a dead letter's delivery and event: "<delivery id> <event type>
	// <event id, quoted>" (what the announcement of dead letters samples).
	HOutcomeIDs = "Whk-Outcome-Ids"
)

// MaxOutcomeError bounds the error an outcome carries (what a status shows of the last failure).
const MaxOutcomeError = 512

// Outcome is what health counts read of one delivery-log record.
type Outcome struct {
	Endpoint string
	// DeliveryID, EventID and EventType are set for dead letters only (and by OutcomeOf).
	DeliveryID       string
	EventID          string
	EventType        string
	State            string
	Attempt          int
	Time             time.Time
	StatusCode       int
	Reason           string
	DeadLetterReason string
	Error            string
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func undash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

// outcomeValues are rec's values of HOutcome, HOutcomeError (empty: none) and HOutcomeIDs
// (empty: none), without the index LogBatch puts before the latter two.
func (rec *LogRecord) outcomeValues() (outcome, errText, ids string) {
	b := make([]byte, 0, 96)
	b = append(b, rec.Endpoint...)
	b = append(b, ' ')
	b = append(b, rec.State...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(rec.Attempt), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, rec.Time.UnixNano(), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(rec.Response.StatusCode), 10)
	b = append(b, ' ')
	b = append(b, dash(rec.Reason)...)
	b = append(b, ' ')
	b = append(b, dash(rec.DeadLetterReason)...)
	if rec.State != StateSucceeded && rec.Response.Error != "" {
		errText = oneLine(Bound(rec.Response.Error, MaxOutcomeError))
	}
	if rec.State == StateDeadLetter {
		ids = dash(oneLine(rec.DeliveryID)) + " " + dash(oneLine(rec.EventType)) + " " + strconv.Quote(Bound(rec.EventID, MaxEventIDLength))
	}
	return string(b), errText, ids
}

// oneLine replaces control characters, which a header value cannot hold.
func oneLine(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

// ReadOutcomes reads the outcomes of a delivery-log message's records from its headers, in
// order; nil for a message without them (written before they existed: OutcomeOf reads its
// record instead).
func ReadOutcomes(h nats.Header) []Outcome {
	vals := h[HOutcome]
	if len(vals) == 0 {
		return nil
	}
	out := make([]Outcome, 0, len(vals))
	for _, v := range vals {
		f := strings.Fields(v)
		if len(f) != 7 {
			return nil
		}
		attempt, err1 := strconv.Atoi(f[2])
		ns, err2 := strconv.ParseInt(f[3], 10, 64)
		code, err3 := strconv.Atoi(f[4])
		if err1 != nil || err2 != nil || err3 != nil || f[0] == "" {
			return nil
		}
		out = append(out, Outcome{Endpoint: f[0], State: f[1], Attempt: attempt, Time: time.Unix(0, ns).UTC(), StatusCode: code,
			Reason: undash(f[5]), DeadLetterReason: undash(f[6])})
	}
	indexed := func(v string) (int, string, bool) {
		is, rest, ok := strings.Cut(v, " ")
		i, err := strconv.Atoi(is)
		return i, rest, ok && err == nil && i >= 0 && i < len(out)
	}
	for _, v := range h[HOutcomeError] {
		if i, text, ok := indexed(v); ok {
			out[i].Error = text
		}
	}
	for _, v := range h[HOutcomeIDs] {
		if i, ids, ok := indexed(v); ok {
			if parts := strings.SplitN(ids, " ", 3); len(parts) == 3 {
				out[i].DeliveryID, out[i].EventType = undash(parts[0]), undash(parts[1])
				out[i].EventID, _ = strconv.Unquote(parts[2])
			}
		}
	}
	return out
}

// OutcomeOf reads the outcome of a delivery-log record.
func OutcomeOf(rec *LogRecord) Outcome {
	return Outcome{Endpoint: rec.Endpoint, DeliveryID: rec.DeliveryID, EventID: rec.EventID, EventType: rec.EventType, State: rec.State,
		Attempt: rec.Attempt, Time: rec.Time, StatusCode: rec.Response.StatusCode, Reason: rec.Reason, DeadLetterReason: rec.DeadLetterReason,
		Error: rec.Response.Error}
}
