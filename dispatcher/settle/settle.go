// Package settle is the one place a delivery ends: it carries out a verdict
// (dispatcher/decide) for a message, and alone acknowledges it, hands it back, schedules its
// next attempt, dead-letters it or holds it. Whatever is stored for a delivery (a dead letter,
// a scheduled retry, a held copy, its record in the delivery log) is stored before the message
// is acknowledged; a write that fails hands the message back, to be written again (and
// de-duplicated) when it returns. The delivery log's writes are batched (LogWriter), and held
// copies stay within the deliveries stream's hold room (Room).
package settle

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// Settler settles a dispatcher's deliveries in its namespace's streams. Writes are bounded by
// the grace period of a stop (hard), not by the stop itself.
type Settler struct {
	js         jetstream.JetStream
	names      streams.NamespaceNames
	logs       *LogWriter
	room       *Room
	maxPayload int64
	hard       context.Context
	log        logr.Logger
}

// New settles through js into the streams names; logs writes the delivery log, room bounds
// held copies, hard ends writes in flight.
func New(js jetstream.JetStream, names streams.NamespaceNames, logs *LogWriter, room *Room, maxPayload int64, hard context.Context, log logr.Logger) *Settler {
	return &Settler{js: js, names: names, logs: logs, room: room, maxPayload: maxPayload, hard: hard, log: log}
}

// Endpoint is the endpoint whose delivery is settled: what a settlement tells it.
type Endpoint interface {
	// Name is the endpoint's; LogSubject its subject in the delivery log.
	Name() string
	LogSubject() string
	// Lane is the lane its retries are scheduled on; deleting says it is being deleted.
	Lane() (lane streams.Lane, deleting bool)
	// Logging says a delivery's record is being logged; Logged that it was (or could not be).
	Logging(deliveryID string)
	Logged(deliveryID string)
	// Go runs f among the endpoint's goroutines (waited for when it stops).
	Go(f func())
	// Changed says its pending deliveries or its counts changed.
	Changed()
	// Retried, DeadLettered and Held count what became of a delivery; RetryScheduled says a
	// retry of a deleted endpoint was scheduled (its partition's holder dead-letters it).
	Retried()
	DeadLettered(reason string)
	Held()
	RetryScheduled()
}

// Wait is a retry the worker waits out in place (decide.ActWait).
type Wait struct {
	Meta  records.DeliveryMeta
	Delay time.Duration
}

// RoomRetry is when an event that found no room in the deliveries stream comes back.
const RoomRetry = 5 * time.Second

// Finish carries out v for msg of ep. It returns the retry to wait out in place (actWait), or
// nil. ctx carries the attempt's span.
func (s *Settler) Finish(ctx context.Context, ep Endpoint, msg jetstream.Msg, v decide.Verdict) *Wait {
	switch v.Act {
	case decide.ActAck:
		_ = msg.Ack()
	case decide.ActRelease:
		Release(msg, v.Delay)
	case decide.ActLog:
		s.logThenAck(ctx, ep, msg, v.Meta, v.Rec)
	case decide.ActWait:
		if v.Rec != nil && !s.logWait(ctx, ep, msg, v.Meta, v.Rec) {
			_ = msg.NakWithDelay(time.Second)
			return nil
		}
		return &Wait{Meta: v.Meta, Delay: v.Delay}
	case decide.ActSchedule:
		s.schedule(ctx, ep, msg, v)
	case decide.ActDeadLetter:
		s.deadLetter(ctx, ep, msg, v)
	case decide.ActHold:
		s.store(ctx, ep, msg, v.Out, v.Stored)
	}
	return nil
}

// Release hands msg back, to come again after delay (at once when 0).
func Release(msg jetstream.Msg, delay time.Duration) {
	if delay > 0 {
		_ = msg.NakWithDelay(delay)
	} else {
		_ = msg.Nak()
	}
}

// MaxPayload is the largest message the server takes.
func (s *Settler) MaxPayload() int64 { return s.maxPayload }

// HoldFull says the deliveries stream is at its hold threshold: an event to hold stays where
// it is.
func (s *Settler) HoldFull() bool { return s.room.Full() }

// tooLarge says a message to write does not fit the server's maximum payload.
type tooLarge string

func (e tooLarge) Error() string { return string(e) }

// schedule publishes the delivery's next attempt as a JetStream message schedule due at v.At
// (now when zero): it waits on its own subject, holding nothing of the endpoint's consumer,
// and the server publishes it onto the delivery subject when due. Then the attempt's record
// (when v has one) is logged and msg acknowledged; the scheduled retry is de-duplicated when
// written again.
func (s *Settler) schedule(ctx context.Context, ep Endpoint, msg jetstream.Msg, v decide.Verdict) {
	at := v.At
	if at.IsZero() {
		at = time.Now()
	}
	lane, deleting := ep.Lane()
	err := s.scheduleRetry(ep.Name(), lane, msg, v.Meta, at, alone(msg, v.Meta))
	switch {
	case errors.As(err, new(tooLarge)):
		// The event itself fitted; with the retry's headers it does not.
		dl := decide.Verdict{Act: decide.ActDeadLetter, Reason: records.ReasonPayloadTooLarge, Why: err.Error(), Last: v.Last, Meta: v.Meta}
		if v.Why != "" {
			dl.Why += "; last: " + v.Why
		}
		if v.Rec != nil {
			rec := *v.Rec
			rec.State, rec.DeadLetterReason, rec.NextAttemptAt = records.StateDeadLetter, records.ReasonPayloadTooLarge, nil
			dl.Rec = &rec
		}
		s.deadLetter(ctx, ep, msg, dl)
		return
	case err != nil:
		s.log.Error(err, "scheduling a retry; the delivery will be attempted again", "endpoint", ep.Name(), "delivery", v.Meta.DeliveryID)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	ep.Retried()
	if deleting {
		ep.RetryScheduled()
	}
	if v.Rec == nil {
		_ = msg.Ack()
		return
	}
	s.logThenAck(ctx, ep, msg, v.Meta, v.Rec)
	ep.Changed()
}

// scheduleRetry publishes the delivery's next attempt as a message schedule due at, on the
// subjects of the endpoint's lane.
func (s *Settler) scheduleRetry(ep string, lane streams.Lane, msg jetstream.Msg, meta records.DeliveryMeta, at time.Time, redelivered bool) error {
	meta.Redelivered = redelivered
	wait, target := s.names.RetryTarget(ep, meta.DeliveryID, lane)
	out := records.NewDelivery(wait, msg.Headers(), msg.Data(), meta)
	out.Header.Set("Nats-Schedule", "@at "+at.UTC().Format(time.RFC3339Nano))
	out.Header.Set("Nats-Schedule-Target", target)
	out.Header.Set(records.HeaderMsgID, retryMsgID(meta))
	if !records.Fits(out, s.maxPayload) {
		return tooLarge(records.TooLarge(records.MsgSize(out), s.maxPayload))
	}
	return s.write(out)
}

// outage bounds how long a write waits out a stream that does not answer: a stream whose
// leader's node died answers again once a new leader is elected, within seconds. The
// delivery stays in hand meanwhile (its consumer's ack wait is longer) and is settled then,
// instead of being handed back to a consumer whose own leader may be moving at the same time.
const outage = 10 * time.Second

// outageTry bounds one request of a write: a request the dying leader took and never
// answered is sent again, to the next leader.
const outageTry = 2 * time.Second

// write stores out, a message with a message id (so a write that landed unanswered and is
// sent again is stored once): sent again while the stream does not answer (no responders, no
// reply), for at most outage. A stop asked meanwhile does not abandon it: the grace period
// (hard) bounds it. Any other error (the stream's answer: a limit, a bad message) ends it.
func (s *Settler) write(out *nats.Msg) error {
	deadline := time.Now().Add(outage)
	for {
		try := time.Now().Add(outageTry)
		if try.After(deadline) {
			try = deadline
		}
		ctx, cancel := context.WithDeadline(s.hard, try)
		_, err := s.js.PublishMsg(ctx, out, jetstream.WithRetryAttempts(int(outageTry/outageWait)), jetstream.WithRetryWait(outageWait))
		cancel()
		if err == nil || !unanswered(err) || s.hard.Err() != nil || !time.Now().Before(deadline) {
			return err
		}
		s.log.V(1).Info("the stream did not answer a write; writing it again", "subject", out.Subject, "error", err.Error())
	}
}

// outageWait is how often a stream without responders is asked again.
const outageWait = 250 * time.Millisecond

// unanswered says a write got no answer from its stream: nobody took it (no leader), or the
// answer did not come.
func unanswered(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// deadLetter stores the delivery in the dead-letter stream and its record in the delivery log
// (v.Rec, the last attempt's, or one made from the reason), then acknowledges it. A failure
// leaves it queued: it is written again (and de-duplicated) later.
func (s *Settler) deadLetter(ctx context.Context, ep Endpoint, msg jetstream.Msg, v decide.Verdict) {
	now := time.Now()
	dl := records.DeadLetterOf(msg.Headers(), v.Meta, v.Reason, v.Why, v.Last, now)
	if md, err := msg.Metadata(); err == nil {
		dl.Identify(md.Stream, md.Sequence.Stream, s.names.Namespace(), ep.Name())
	}
	out := records.DeadLetterMessage(s.names.DeadLetterSubject(ep.Name(), subjectToken(dl.DeliveryID)), dl, msg.Data(), s.maxPayload)
	if err := s.write(out); err != nil {
		s.log.Error(err, "writing a dead letter; the delivery stays queued", "endpoint", ep.Name(), "delivery", dl.DeliveryID)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	ep.DeadLettered(v.Reason)
	rec := v.Rec
	if rec == nil {
		rec = &records.LogRecord{DeliveryID: dl.DeliveryID, EventID: dl.EventID, EventType: dl.EventType, EventSeq: dl.EventSeq, EventNamespace: dl.EventNamespace,
			Namespace: s.names.Namespace(),
			Endpoint:  ep.Name(), State: records.StateDeadLetter, Attempt: v.Meta.Attempts, Time: now.UTC(), DeadLetterReason: v.Reason,
			ReplayOf: v.Meta.ReplayOf, Reason: v.Reason}
		rec.Response.Error = v.Why
	}
	s.logThenAck(ctx, ep, msg, v.Meta, rec)
	ep.Changed()
}

// logThenAck writes rec to the delivery log and acknowledges msg once it is stored; when it
// could not be, msg is left to be redelivered (and its record written again, a duplicate the
// stream drops if the first write did land: see LogWriter).
func (s *Settler) logThenAck(actx context.Context, ep Endpoint, msg jetstream.Msg, meta records.DeliveryMeta, rec *records.LogRecord) {
	tracing.Outcome(actx, rec)
	ep.Logging(meta.DeliveryID)
	s.logs.Write(ep.LogSubject(), rec, alone(msg, meta), func(ok bool) {
		defer ep.Logged(meta.DeliveryID)
		if ok {
			_ = msg.Ack()
		} else {
			_ = msg.NakWithDelay(time.Second)
		}
	})
}

// logWait writes rec to the delivery log and waits until it is stored; false when it could
// not be.
func (s *Settler) logWait(actx context.Context, ep Endpoint, msg jetstream.Msg, meta records.DeliveryMeta, rec *records.LogRecord) bool {
	tracing.Outcome(actx, rec)
	done := make(chan bool, 1)
	s.logs.Write(ep.LogSubject(), rec, alone(msg, meta), func(ok bool) { done <- ok })
	return <-done
}

// store copies a held event into the deliveries stream (within the stream's hold room) and
// acknowledges the event once the copy is stored; without room, or when the copy fails, the
// event comes back. Copies are published in the order events arrive, so they keep it. done is
// called once the event is settled.
func (s *Settler) store(ctx context.Context, ep Endpoint, msg jetstream.Msg, out *nats.Msg, done func()) {
	size := records.MsgSize(out)
	if !s.room.Reserve(ctx, size) {
		// The deliveries stream is at its hold threshold: the event stays in the events
		// stream, not acknowledged, and is held (or delivered) when it comes back.
		_ = msg.NakWithDelay(RoomRetry)
		done()
		return
	}
	f, err := s.js.PublishMsgAsync(out, jetstream.WithStallWait(5*time.Second))
	if err != nil {
		s.room.Released(size)
		s.log.V(1).Info("holding an event failed; it comes back", "endpoint", ep.Name(), "error", err.Error())
		_ = msg.NakWithDelay(time.Second)
		done()
		return
	}
	ep.Held()
	ep.Changed() // its pending changed
	ep.Go(func() {
		defer done()
		select {
		case <-f.Ok():
			s.room.Stored(size)
			_ = msg.Ack()
		case err := <-f.Err():
			s.room.Released(size)
			s.log.V(1).Info("holding an event failed; it comes back", "endpoint", ep.Name(), "error", err.Error())
			_ = msg.NakWithDelay(time.Second)
		}
	})
}

// Again is a message that may have come before although its consumer delivered it once
// (pull.Stamp.Again).
type Again interface{ Again() bool }

// Redelivered says msg was delivered before, and when it was first: its outcome may be
// logged already. Its delivery count says so, or, when a consumer's new leader counts from 1
// again (its state replicated after the delivery was made), its place in the source's order
// does, or a reconnect since it came (Again).
func Redelivered(msg jetstream.Msg) (time.Time, bool) {
	md, err := msg.Metadata()
	if err != nil {
		return time.Time{}, false
	}
	a, ok := msg.(Again)
	if md.NumDelivered <= 1 && (!ok || !a.Again()) {
		return time.Time{}, false
	}
	return md.Timestamp, true
}

// alone says whether an outcome of msg must be logged alone: msg (or one it was copied from)
// was delivered before, so the same outcome may be logged already (see LogWriter).
func alone(msg jetstream.Msg, meta records.DeliveryMeta) bool {
	if meta.Redelivered {
		return true
	}
	if _, err := msg.Metadata(); err != nil {
		return true
	}
	_, again := Redelivered(msg)
	return again
}

// subjectToken makes s safe as one subject token.
func subjectToken(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '.' || c == '*' || c == '>' || c <= ' ' || c > '~' {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
}

// retryMsgID names a delivery's scheduled retry after its attempts, so writing it again is
// de-duplicated.
func retryMsgID(meta records.DeliveryMeta) string {
	return meta.DeliveryID + "/retry/" + strconv.Itoa(meta.Attempts)
}
