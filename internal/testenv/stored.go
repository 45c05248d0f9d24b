package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Stored writes into a namespace's streams what producers and the dispatcher write there
// (events, delivery-log records, dead letters), with the record contract, and reads them
// back, for tests of what reads them (the replay engine, the plugin).
type Stored struct {
	T   testing.TB
	JS  jetstream.JetStream
	Set streams.Set
}

// Event publishes an event of type typ with id (its Nats-Msg-Id; none when empty) and body to
// the events stream, and returns its sequence.
func (s Stored) Event(typ, id, body string, h nats.Header) uint64 {
	s.T.Helper()
	msg := &nats.Msg{Subject: s.Set.EventSubject(typ), Header: nats.Header{}, Data: []byte(body)}
	for k, v := range h {
		msg.Header[k] = v
	}
	if id != "" {
		msg.Header.Set(records.HeaderMsgID, id)
	}
	ack, err := s.JS.PublishMsg(context.Background(), msg)
	if err != nil {
		s.T.Fatalf("publishing event %s: %v", id, err)
	}
	return ack.Sequence
}

// Delivery is the metadata of the delivery of event eventID (stored at seq) to endpoint, as
// a dispatcher makes it.
func (s Stored) Delivery(endpoint, eventID string, seq uint64, created time.Time) records.DeliveryMeta {
	return records.DeliveryMeta{
		DeliveryID: records.DeliveryID(eventID, s.Set.Namespace(), endpoint),
		EventID:    eventID,
		EventType:  "order.created",
		EventTime:  created,
		EventSeq:   seq,
		Namespace:  s.Set.Namespace(),
		Endpoint:   endpoint,
		Created:    created,
	}
}

// Log appends a delivery-log record, as the dispatcher does after an outcome, and returns
// its sequence.
func (s Stored) Log(rec records.LogRecord) uint64 {
	s.T.Helper()
	b, err := json.Marshal(rec)
	if err != nil {
		s.T.Fatal(err)
	}
	ack, err := s.JS.Publish(context.Background(), s.Set.AttemptSubject(rec.Endpoint), b)
	if err != nil {
		s.T.Fatalf("writing a log record: %v", err)
	}
	return ack.Sequence
}

// LogBatch appends records of one endpoint in one message, as the dispatcher's log writer
// does under load, and returns its sequence.
func (s Stored) LogBatch(recs ...records.LogRecord) uint64 {
	s.T.Helper()
	entries := make([]records.LogEntry, len(recs))
	for i := range recs {
		entries[i] = records.EncodeLog(&recs[i], nil)
	}
	ack, err := s.JS.PublishMsg(context.Background(), records.LogBatch(s.Set.AttemptSubject(recs[0].Endpoint), entries))
	if err != nil {
		s.T.Fatalf("writing log records: %v", err)
	}
	return ack.Sequence
}

// DeadLetter dead-letters delivery m after attempts failed attempts (503s), with the event
// headers h (Content-Type, trace context, X-Tenant when nil), as the dispatcher does.
func (s Stored) DeadLetter(m records.DeliveryMeta, attempts int, reason, payload string, at time.Time, h nats.Header) records.DeadLetter {
	s.T.Helper()
	if h == nil {
		h = nats.Header{}
		h.Set(records.HeaderContentType, "application/json")
		h.Set(records.HeaderTraceParent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		h.Set("X-Tenant", "acme")
	}
	for n := 1; n <= attempts; n++ {
		m.History = append(m.History, records.Attempt{N: n, Time: at.Add(time.Duration(n-attempts) * time.Minute), StatusCode: 503,
			LatencyMS: int64(10 * n), Reason: records.FailStatusCode, Error: "503 Service Unavailable"})
	}
	m.Attempts = attempts
	records.SetDeliveryMeta(h, m)
	var last *records.Response
	if attempts > 0 {
		last = &records.Response{StatusCode: 503, Body: `{"error":"down for maintenance"}`}
	}
	dl := records.NewDeadLetter(h, reason, "gave up after "+fmt.Sprint(attempts)+" attempts", last, at)
	msg := records.DeadLetterMessage(s.Set.DeadLetterSubject(m.Endpoint, m.DeliveryID), dl, []byte(payload), 0)
	if _, err := s.JS.PublishMsg(context.Background(), msg); err != nil {
		s.T.Fatalf("writing a dead letter: %v", err)
	}
	return dl
}

// Msgs returns every message on subject (wildcards allowed) in stream, oldest first.
func (s Stored) Msgs(stream, subject string) []*jetstream.RawStreamMsg {
	s.T.Helper()
	ctx := context.Background()
	st, err := s.JS.Stream(ctx, stream)
	if err != nil {
		s.T.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	seq := uint64(1)
	for {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if err != nil {
			break
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
	return out
}

// Holding lists the streams of the set whose stored messages hold text in their subject,
// headers or data: every message of every stream is read back (to show that an erased or
// expired payload is stored nowhere).
func (s Stored) Holding(text string) []string {
	s.T.Helper()
	var out []string
	for _, name := range s.Set.Streams() {
		for _, m := range s.Msgs(name, ">") {
			all := m.Subject + string(m.Data)
			for k, vs := range m.Header {
				all += k + strings.Join(vs, ",")
			}
			if strings.Contains(all, text) {
				out = append(out, name)
				break
			}
		}
	}
	return out
}
