package deliver

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// finish carries out v for msg: the one place a delivery ends, and the only caller of Ack and
// Nak. Whatever is stored for it (a dead letter, a scheduled retry, a held copy, its record in
// the delivery log) is stored before it is acknowledged; a write that fails hands it back, to
// be written again (and de-duplicated) when it returns. It returns the retry to wait out here
// (actWait), or nil. ctx carries the attempt's span.
func (w *Worker) finish(ctx context.Context, msg jetstream.Msg, v decide.Verdict) *heldRetry {
	switch v.Act {
	case decide.ActAck:
		_ = msg.Ack()
	case decide.ActRelease:
		if v.Delay > 0 {
			_ = msg.NakWithDelay(v.Delay)
		} else {
			_ = msg.Nak()
		}
	case decide.ActLog:
		w.logThenAck(ctx, msg, v.Meta, v.Rec)
	case decide.ActWait:
		if v.Rec != nil && !w.logWait(ctx, msg, v.Meta, v.Rec) {
			_ = msg.NakWithDelay(time.Second)
			return nil
		}
		return &heldRetry{meta: v.Meta, wait: v.Delay}
	case decide.ActSchedule:
		w.schedule(ctx, msg, v)
	case decide.ActDeadLetter:
		w.deadLetter(ctx, msg, v)
	case decide.ActHold:
		w.store(ctx, msg, v.Out, v.Stored)
	}
	return nil
}

// releaseAll hands back what a stopping worker still had queued.
func releaseAll(queue []*pulled) {
	for _, m := range queue {
		_ = m.Nak()
	}
}

// tooLarge says a message to write does not fit the server's maximum payload.
type tooLarge string

func (e tooLarge) Error() string { return string(e) }

// schedule publishes the delivery's next attempt as a JetStream message schedule due at v.at
// (now when zero): it waits on its own subject, holding nothing of the endpoint's consumer,
// and the server publishes it onto the delivery subject when due. Then the attempt's record
// (when v has one) is logged and msg acknowledged; the scheduled retry is de-duplicated when
// written again.
func (w *Worker) schedule(ctx context.Context, msg jetstream.Msg, v decide.Verdict) {
	at := v.At
	if at.IsZero() {
		at = time.Now()
	}
	c := w.cfg.Load()
	lane := streams.LaneOwn
	if c != nil {
		lane = c.Lane
	}
	err := w.journal.scheduleRetry(w.name, lane, msg, v.Meta, at, alone(msg, v.Meta))
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
		w.deadLetter(ctx, msg, dl)
		return
	case err != nil:
		w.journal.log.Error(err, "scheduling a retry; the delivery will be attempted again", "endpoint", w.name, "delivery", v.Meta.DeliveryID)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	w.Metrics.Retried()
	if c != nil && c.Deleting {
		// A deleted endpoint's scheduled retries are dead-lettered by its partition's holder.
		w.scheduledRetries().noteParked()
	}
	if v.Rec == nil {
		_ = msg.Ack()
		return
	}
	w.logThenAck(ctx, msg, v.Meta, v.Rec)
	w.dirty()
}

// deadLetter stores the delivery in the dead-letter stream and its record in the delivery log
// (v.rec, the last attempt's, or one made from the reason), then acknowledges it. A failure
// leaves it queued: it is written again (and de-duplicated) later.
func (w *Worker) deadLetter(ctx context.Context, msg jetstream.Msg, v decide.Verdict) {
	now := time.Now()
	dl, err := w.journal.deadLetter(w.name, msg, v.Meta, v.Reason, v.Why, v.Last, now)
	if err != nil {
		w.journal.log.Error(err, "writing a dead letter; the delivery stays queued", "endpoint", w.name, "delivery", dl.DeliveryID)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	w.Metrics.DeadLettered(v.Reason)
	rec := v.Rec
	if rec == nil {
		rec = &records.LogRecord{DeliveryID: dl.DeliveryID, EventID: dl.EventID, EventType: dl.EventType, EventSeq: dl.EventSeq, EventNamespace: dl.EventNamespace,
			Namespace: w.journal.names.Namespace(),
			Endpoint:  w.name, State: records.StateDeadLetter, Attempt: v.Meta.Attempts, Time: now.UTC(), DeadLetterReason: v.Reason,
			ReplayOf: v.Meta.ReplayOf, Reason: v.Reason}
		rec.Response.Error = v.Why
	}
	w.logThenAck(ctx, msg, v.Meta, rec)
	w.dirty()
}

// logThenAck writes rec to the delivery log and acknowledges msg once it is stored; when it
// could not be, msg is left to be redelivered (and its record written again, a duplicate the
// stream drops if the first write did land: see LogWriter).
func (w *Worker) logThenAck(actx context.Context, msg jetstream.Msg, meta records.DeliveryMeta, rec *records.LogRecord) {
	tracing.Outcome(actx, rec)
	w.inflight.Add(1)
	w.busy.hold(meta.DeliveryID)
	w.journal.writeLog(w.logSubject, rec, alone(msg, meta), func(ok bool) {
		defer w.inflight.Done()
		defer w.busy.release(meta.DeliveryID)
		if ok {
			_ = msg.Ack()
		} else {
			_ = msg.NakWithDelay(time.Second)
		}
	})
}

// logWait writes rec to the delivery log and waits until it is stored; false when it could
// not be.
func (w *Worker) logWait(actx context.Context, msg jetstream.Msg, meta records.DeliveryMeta, rec *records.LogRecord) bool {
	tracing.Outcome(actx, rec)
	done := make(chan bool, 1)
	w.journal.writeLog(w.logSubject, rec, alone(msg, meta), func(ok bool) { done <- ok })
	return <-done
}

// store copies a held event into the deliveries stream (within the stream's hold room) and
// acknowledges the event once the copy is stored; without room, or when the copy fails, the
// event comes back. Copies are published in the order events arrive, so they keep it. done is
// called once the event is settled.
func (w *Worker) store(ctx context.Context, msg jetstream.Msg, out *nats.Msg, done func()) {
	size := records.MsgSize(out)
	if !w.journal.room.Reserve(ctx, size) {
		// The deliveries stream is at its hold threshold: the event stays in the events
		// stream, not acknowledged, and is held (or delivered) when it comes back.
		_ = msg.NakWithDelay(roomRetry)
		done()
		return
	}
	f, err := w.journal.js.PublishMsgAsync(out, jetstream.WithStallWait(5*time.Second))
	if err != nil {
		w.journal.room.Released(size)
		w.journal.log.V(1).Info("holding an event failed; it comes back", "endpoint", w.name, "error", err.Error())
		_ = msg.NakWithDelay(time.Second)
		done()
		return
	}
	w.Metrics.Held()
	w.dirty() // its pending changed
	w.run(func() {
		defer done()
		select {
		case <-f.Ok():
			w.journal.room.Stored(size)
			_ = msg.Ack()
		case err := <-f.Err():
			w.journal.room.Released(size)
			w.journal.log.V(1).Info("holding an event failed; it comes back", "endpoint", w.name, "error", err.Error())
			_ = msg.NakWithDelay(time.Second)
		}
	})
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
	_, again := redelivered(msg)
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
