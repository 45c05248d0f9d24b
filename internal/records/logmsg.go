package records

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// MsgID is the JetStream message id of rec's delivery-log message. It names the outcome, not
// the write, so a record written again after a crash (the delivery was redelivered and came
// to the same outcome) is a duplicate the stream drops, and a fold over the log counts each
// outcome once: one success per delivery, one dead letter per delivery, one failure per
// attempt number.
func (rec *LogRecord) MsgID() string {
	switch rec.State {
	case StateSucceeded:
		return rec.DeliveryID + ":ok"
	case StateDeadLetter:
		return rec.DeliveryID + ":dl"
	}
	return rec.DeliveryID + ":" + strconv.Itoa(rec.Attempt) + ":" + rec.State
}

// Bound cuts every string a receiver or the endpoint's configuration supplied to rec (the
// response body and error, request header values) and redacts URLs in its error.
func (rec *LogRecord) Bound() {
	rec.Response = rec.Response.Bounded()
	for k, v := range rec.RequestHeaders {
		if len(v) > MaxHeaderValue {
			rec.RequestHeaders[k] = Bound(v, MaxHeaderValue)
		}
	}
}

// LogMessage is the delivery-log message of rec alone on subject: the record, bounded,
// encoded into buf (which it may reuse; nil is fine), with MsgID as JetStream's message id.
func LogMessage(subject string, rec *LogRecord, buf []byte) *nats.Msg {
	return LogBatch(subject, []LogEntry{EncodeLog(rec, buf)})
}

// LogEntry is a delivery-log record encoded for a message (EncodeLog): its JSON and what
// the message's outcome headers say of it.
type LogEntry struct {
	JSON                  []byte
	MsgID                 string
	outcome, errText, ids string
}

// EncodeLog bounds rec and encodes it into buf (which it may reuse; nil is fine).
func EncodeLog(rec *LogRecord, buf []byte) LogEntry {
	rec.Bound()
	e := LogEntry{JSON: rec.AppendJSON(buf[:0]), MsgID: rec.MsgID()}
	e.outcome, e.errText, e.ids = rec.outcomeValues()
	return e
}

// LogBatch is one delivery-log message on subject (one endpoint's) holding entries, in order,
// one JSON record per line (LogRecords reads them), with one outcome header value per
// record. Its message id is the record's id for one record; for several, it names them all,
// so writing the same batch again after an unanswered write keeps one. Records of a batch
// are those only one write can produce (see the dispatcher): a record written again after a
// crash is written alone, with its own id, which the stream de-duplicates.
func LogBatch(subject string, entries []LogEntry) *nats.Msg {
	h := nats.Header{}
	n := 0
	for _, e := range entries {
		n += len(e.JSON) + 1
	}
	data := make([]byte, 0, n)
	ids := make([]string, 0, len(entries))
	for i, e := range entries {
		if i > 0 {
			data = append(data, '\n')
		}
		data = append(data, e.JSON...)
		h[HOutcome] = append(h[HOutcome], e.outcome)
		if e.errText != "" {
			h[HOutcomeError] = append(h[HOutcomeError], strconv.Itoa(i)+" "+e.errText)
		}
		if e.ids != "" {
			h[HOutcomeIDs] = append(h[HOutcomeIDs], strconv.Itoa(i)+" "+e.ids)
		}
		ids = append(ids, e.MsgID)
	}
	if len(entries) == 1 {
		h[HeaderMsgID] = []string{entries[0].MsgID}
	} else {
		h[HeaderMsgID] = []string{"batch:" + hashID(ids...)}
	}
	return &nats.Msg{Subject: subject, Header: h, Data: data}
}

// LogRecords reads the records of one delivery-log message: one per line (a message written
// by a dispatcher may hold several; one written before batches holds one). A line that is not
// a record is passed over.
func LogRecords(data []byte) []LogRecord {
	out := make([]LogRecord, 0, 1)
	eachLine(data, func(line []byte) {
		var rec LogRecord
		if json.Unmarshal(line, &rec) == nil {
			out = append(out, rec)
		}
	})
	return out
}

// LogState is what a delivery-log record says of its delivery's state after the attempt: the
// fields of a LogRecord that a reader of outcomes needs (the dispatcher's index of decided
// deliveries), without the request headers and the response body, whose decoding is most of
// a whole record's cost.
type LogState struct {
	DeliveryID    string     `json:"deliveryId"`
	State         string     `json:"state"`
	Attempt       int        `json:"attempt"`
	Time          time.Time  `json:"time"`
	LatencyMS     int64      `json:"latencyMs"`
	LatencyUS     int64      `json:"latencyUs,omitempty"`
	Reason        string     `json:"reason,omitempty"`
	Response      StateError `json:"response"`
	NextAttemptAt *time.Time `json:"nextAttemptAt,omitempty"`
}

// StateError is the part of a Response a LogState keeps.
type StateError struct {
	StatusCode int    `json:"statusCode,omitempty"`
	Error      string `json:"error,omitempty"`
}

// LogStates reads the states of the records of one delivery-log message, as LogRecords reads
// the records. The dispatcher reads one for every delivery it takes back from its queue (see
// its decided index), so a line is scanned for the state's fields and the rest passed over
// without being decoded (scanState); a line the scan does not take is decoded by encoding/json.
func LogStates(data []byte) []LogState {
	out := make([]LogState, 0, 1)
	eachLine(data, func(line []byte) {
		var st LogState
		if scanState(line, &st) || json.Unmarshal(line, &st) == nil {
			out = append(out, st)
		}
	})
	return out
}

// eachLine calls f with each line of data.
func eachLine(data []byte, f func(line []byte)) {
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		f(line)
	}
}
