package deliver

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// heldRetry is a PerKey delivery (or one due soon) retrying in place.
type heldRetry struct {
	meta records.DeliveryMeta
	wait time.Duration
}

// attempt makes one attempt of msg (or of a held retry) and settles it. It returns a held
// retry when the delivery must retry in place.
func (w *Worker) attempt(ctx context.Context, msg jetstream.Msg, held *heldRetry) *heldRetry {
	c := w.cfg.Load()
	if c == nil {
		_ = msg.Nak()
		return nil
	}
	var meta records.DeliveryMeta
	invalid := ""
	if held != nil {
		meta = held.meta
	} else if md, err := msg.Metadata(); err == nil && md.Stream == w.deliveriesStream {
		// Only a message of the deliveries stream is a delivery whose headers the operator
		// wrote (attempts made, ids, test, replay-of); whatever headers an event carries, it is
		// an event (its Whk-* ones were deleted at admission anyway).
		meta = records.ParseDeliveryMeta(msg.Headers())
	} else if err == nil {
		// An event straight from an events stream.
		meta, invalid, _ = records.EventDelivery(msg.Subject(), w.env.Streams.EventsSubjectPrefix, md.Stream, md.Sequence.Stream, md.Timestamp,
			msg.Headers(), w.env.Names.Namespace(), w.name)
	}
	if invalid != "" {
		w.deadLetter(ctx, msg, meta, records.ReasonInvalidEvent, invalid, nil, nil)
		return nil
	}
	if meta.Namespace == "" {
		meta.Namespace = w.env.Names.Namespace()
	}
	if meta.Endpoint == "" {
		meta.Endpoint = w.name
	}
	if meta.DeliveryID == "" || meta.EventID == "" {
		reason, why := records.ReasonInvalidEvent, "the delivery has no delivery id or event id header"
		if c.Deleting { // named after where it is stored, like everything left for a deleted endpoint
			reason, why = records.ReasonEndpointDeleted, "WebhookEndpoint "+meta.Namespace+"/"+w.name+" was deleted before this delivery succeeded"
		}
		w.deadLetter(ctx, msg, meta, reason, why, nil, nil)
		return nil
	}
	if held == nil {
		// A copy of a delivery this worker is attempting or logging now (redelivered while
		// its outcome is being written) waits until that is decided.
		if !w.busy.claim(meta.DeliveryID) {
			_ = msg.NakWithDelay(2 * time.Second)
			return nil
		}
		defer w.busy.release(meta.DeliveryID)
		// A message delivered before may have had its outcome logged, and only its
		// acknowledgement lost: then it is settled from the log, without a request.
		if since, again := redelivered(msg); again {
			dec, ok, err := w.logged.lookup(ctx, meta.DeliveryID, since)
			if err != nil {
				w.env.Log.V(1).Info("reading the delivery log for a redelivered message; it is attempted later", "endpoint", w.name,
					"delivery", meta.DeliveryID, "error", err.Error())
				_ = msg.NakWithDelay(time.Second)
				return nil
			}
			if ok && (dec.terminal() || dec.Attempt > meta.Attempts) {
				return w.settle(ctx, msg, c, meta, dec.Attempt, outcome{Logged: &dec})
			}
		}
	}
	if c.Deleting {
		w.deadLetter(ctx, msg, meta, records.ReasonEndpointDeleted,
			"WebhookEndpoint "+meta.Namespace+"/"+w.name+" was deleted before this delivery succeeded", nil, nil)
		return nil
	}
	if why, disabled := w.env.Health.DisabledReason(w.name); disabled {
		w.deadLetter(ctx, msg, meta, records.ReasonEndpointDisabled, why, nil, nil)
		return nil
	}
	if len(msg.Data()) > w.env.MaxEventBytes {
		w.deadLetter(ctx, msg, meta, records.ReasonPayloadTooLarge,
			fmt.Sprintf("the event is %d bytes; the installation delivers at most %d", len(msg.Data()), w.env.MaxEventBytes), nil, nil)
		return nil
	}

	attempt := meta.Attempts + 1
	h := msg.Headers()
	req := &request{Meta: meta, Attempt: attempt, Body: msg.Data(),
		ContentType: h.Get(records.HeaderContentType), TraceParent: h.Get(records.HeaderTraceParent), TraceState: h.Get(records.HeaderTraceState),
		Forward: records.ForwardedHeaders(h)}
	if c.Transform != nil && c.ConfigError == nil {
		// The request carries what the transformation makes of the event, and the signature
		// covers that body. A transformation that fails on the event is not the receiver's
		// failure: the delivery is dead-lettered without an attempt.
		out, err := c.Transform.Apply(w.env.HardCtx, expr.NewInput(expr.DeliveryEvent(meta, h, msg.Data())))
		switch {
		case err != nil && w.env.HardCtx.Err() != nil:
			_ = msg.Nak()
			return nil
		case err != nil:
			w.deadLetter(ctx, msg, meta, records.ReasonTransformFailed, records.Bound(err.Error(), records.MaxErrorText), nil, nil)
			return nil
		}
		if out.Body != nil {
			req.Body, req.ContentType = out.Body, out.ContentType
		}
		req.Extra = out.Headers
	}
	if err := cloudEventRequest(c, meta, h, req); err != nil {
		w.deadLetter(ctx, msg, meta, records.ReasonInvalidEvent, records.Bound(err.Error(), records.MaxErrorText), nil, nil)
		return nil
	}
	// The attempt's span (none when tracing is off); settle records the outcome on it.
	ctx, span := w.env.Tracer.StartAttempt(ctx, tracing.Start{Namespace: meta.Namespace, Endpoint: w.name, DeliveryID: meta.DeliveryID,
		EventID: meta.EventID, EventType: meta.EventType, ReplayOf: meta.ReplayOf, Attempt: attempt, TraceParent: req.TraceParent, TraceState: req.TraceState})
	defer span.End()
	req.TraceParent, req.TraceState = span.Context(req.TraceParent, req.TraceState)
	o := send(w.env.HardCtx, w.client.Load(), c, req, time.Now())
	if w.env.HardCtx.Err() != nil {
		// Shutting down past the grace period: this attempt does not count; redeliver.
		_ = msg.Nak()
		return nil
	}
	w.Metrics.Latency(o.Latency.Seconds())
	// What the receiver said is stored bounded, without Secret values or URL credentials.
	o.Body, o.Err = c.Scrub(o.Body), records.StoredError(c.Scrub(o.Err))
	return w.settle(ctx, msg, c, meta, attempt, o)
}

// settle decides the fate of an attempt: the one place a delivery ends. Every outcome is
// written to the delivery log before the delivery is acknowledged, so the log (and the health
// counts folded from it) holds every outcome whatever crashes when; an outcome the log holds
// already (o.Logged) is not attempted, written or counted again.
func (w *Worker) settle(ctx context.Context, msg jetstream.Msg, c *endpoint.Config, meta records.DeliveryMeta, attempt int, o outcome) *heldRetry {
	if o.Logged != nil {
		return w.settleLogged(msg, c, meta, *o.Logged)
	}
	rec := records.LogRecord{
		DeliveryID: meta.DeliveryID, EventID: meta.EventID, EventType: meta.EventType, EventSeq: meta.EventSeq, Namespace: w.env.Names.Namespace(), Endpoint: w.name,
		Attempt: attempt, Time: o.Start.UTC(), LatencyMS: o.Latency.Milliseconds(), LatencyUS: o.Latency.Microseconds(), Reason: o.Reason, RequestHeaders: o.Sent,
		Response: records.Response{StatusCode: o.StatusCode, Body: o.Body, Truncated: o.Truncated, Error: o.Err}, ReplayOf: meta.ReplayOf,
		Test: meta.Test,
	}
	if o.Success {
		w.Metrics.Succeeded()
		if _, needsSync := w.env.Health.Fast(w.name); needsSync {
			_, _ = w.env.Health.Change(ctx, w.name, func(s *state.State, now time.Time) []state.Transition { return s.OnSuccess(c.Policy, now) })
		}
		rec.State = records.StateSucceeded
		w.logThenAck(ctx, msg, meta, &rec)
		w.dirty()
		return nil
	}
	if o.Reason == records.FailRequest {
		// The request could not be built: nothing reached the receiver, and retrying cannot help.
		w.deadLetter(ctx, msg, meta, records.ReasonInvalidEvent, "the request could not be built: "+o.Err, nil, nil)
		return nil
	}

	// A failed attempt.
	w.Metrics.Failed()
	_, _ = w.env.Health.Change(ctx, w.name, func(s *state.State, now time.Time) []state.Transition { return s.OnFailure(c.Policy, now) })
	meta.Attempts = attempt
	meta.History = append(meta.History, records.Attempt{N: attempt, Time: o.Start.UTC(), StatusCode: o.StatusCode,
		LatencyMS: o.Latency.Milliseconds(), LatencyUS: o.Latency.Microseconds(), Reason: o.Reason, Error: records.Bound(o.Err, records.MaxHistoryError)})
	last := &records.Response{StatusCode: o.StatusCode, Body: o.Body, Truncated: o.Truncated, Error: o.Err}

	// What follows a failed attempt: a retry, or a dead letter when the attempts or the
	// policy's maxRetryDuration are used up, or at once for a one-shot test delivery.
	wait, verdict := c.Policy.After(attempt, o.RetryAfter, meta.Created, time.Now(), rand.Float64)
	if reason, why := giveUp(meta, verdict, attempt, c.Policy.MaxRetryDuration); reason != "" {
		rec.State, rec.DeadLetterReason = records.StateDeadLetter, reason
		w.deadLetter(ctx, msg, meta, reason, why+"; last: "+describe(o), last, &rec)
		return nil
	}
	next := time.Now().Add(wait)
	rec.State = records.StateFailed
	rec.NextAttemptAt = &next
	if c.PerKey || wait < w.env.InPlaceRetryMax {
		// Short waits (and every retry of a PerKey endpoint, which must not be overtaken) are
		// waited out here; long ones become message schedules that hold nothing.
		if !w.logWait(ctx, msg, meta, &rec) {
			_ = msg.NakWithDelay(time.Second)
			return nil
		}
		return &heldRetry{meta: meta, wait: wait}
	}
	if err := w.scheduleRetry(ctx, msg, meta, next); errors.As(err, new(tooLarge)) {
		// The event itself fitted; with the retry's headers it does not.
		rec.State, rec.DeadLetterReason, rec.NextAttemptAt = records.StateDeadLetter, records.ReasonPayloadTooLarge, nil
		w.deadLetter(ctx, msg, meta, records.ReasonPayloadTooLarge, err.Error()+"; last: "+describe(o), last, &rec)
		return nil
	} else if err != nil {
		w.env.Log.Error(err, "scheduling a retry; the delivery will be attempted again", "endpoint", w.name, "delivery", meta.DeliveryID)
		_ = msg.NakWithDelay(time.Second)
		return nil
	}
	w.Metrics.Retried()
	// Not acknowledged: the scheduled retry is de-duplicated when written again.
	w.logThenAck(ctx, msg, meta, &rec)
	w.dirty()
	return nil
}

// settleLogged settles a redelivered message whose attempt the delivery log holds already
// (its acknowledgement was lost): a success or a dead letter is acknowledged; so is a failure
// whose retry was scheduled (the schedule was written before the log, see settle); a failure
// retried in place is waited out again from where it stood, as the held retry it was.
func (w *Worker) settleLogged(msg jetstream.Msg, c *endpoint.Config, meta records.DeliveryMeta, dec decision) *heldRetry {
	w.env.Log.V(1).Info("a redelivered message's outcome is in the delivery log already; settled without a request",
		"endpoint", w.name, "delivery", meta.DeliveryID, "attempt", dec.Attempt, "state", dec.State)
	if dec.terminal() || dec.State != records.StateFailed || !c.PerKey && dec.Wait >= w.env.InPlaceRetryMax {
		_ = msg.Ack()
		return nil
	}
	meta.Attempts = dec.Attempt
	meta.History = append(meta.History, dec.Record)
	return &heldRetry{meta: meta, wait: max(time.Until(dec.Due), 0)}
}

// giveUp says why a delivery whose attempt n just failed gets no further attempt (a dead-letter
// reason and its explanation), or "" when it is retried.
func giveUp(meta records.DeliveryMeta, verdict policy.Verdict, n int, limit time.Duration) (string, string) {
	switch {
	case meta.Test:
		return records.ReasonTestFailed, "the test delivery's one attempt failed (test deliveries are not retried)"
	case verdict == policy.Exhausted:
		return records.ReasonExhausted, fmt.Sprintf("%d attempts without a successful response", n)
	case verdict == policy.RetryDurationExceeded:
		return records.ReasonRetryDurationExceeded, fmt.Sprintf("%d attempts without a successful response, and the next would start more than maxRetryDuration (%s) after the delivery was created at %s",
			n, limit, meta.Created.UTC().Format(time.RFC3339))
	}
	return "", ""
}

// tooLarge says a message to write does not fit the server's maximum payload.
type tooLarge string

func (e tooLarge) Error() string { return string(e) }

// scheduleRetry publishes the delivery's next attempt as a JetStream message schedule: it
// waits on its own subject, holding nothing of the endpoint's consumer, and the server
// publishes it onto the delivery subject when due.
func (w *Worker) scheduleRetry(ctx context.Context, msg jetstream.Msg, meta records.DeliveryMeta, at time.Time) error {
	names := w.env.Names
	meta.Redelivered = alone(msg, meta)
	out := records.NewDelivery(names.RetrySubject(w.name, meta.DeliveryID), msg.Headers(), msg.Data(), meta)
	out.Header.Set("Nats-Schedule", "@at "+at.UTC().Format(time.RFC3339Nano))
	out.Header.Set("Nats-Schedule-Target", names.DeliverySubject(w.name))
	out.Header.Set(records.HeaderMsgID, meta.DeliveryID+"/retry/"+strconv.Itoa(meta.Attempts))
	if !records.Fits(out, w.env.MaxPayload) {
		return tooLarge(records.TooLarge(records.MsgSize(out), w.env.MaxPayload))
	}
	// A stop asked meanwhile does not abandon the write: the grace period bounds it.
	pctx, cancel := context.WithTimeout(w.env.HardCtx, 10*time.Second)
	defer cancel()
	_, err := w.env.JS.PublishMsg(pctx, out)
	return err
}

// deadLetter writes the delivery to the dead-letter stream and its record to the delivery
// log (final, when the last attempt made one), then acknowledges it. A failure leaves it
// queued: it is written again (and de-duplicated) later.
func (w *Worker) deadLetter(ctx context.Context, msg jetstream.Msg, meta records.DeliveryMeta, reason, message string, last *records.Response, final *records.LogRecord) {
	now := time.Now()
	dl := records.DeadLetterOf(msg.Headers(), meta, reason, message, last, now)
	if md, err := msg.Metadata(); err == nil {
		dl.Identify(md.Stream, md.Sequence.Stream, w.env.Names.Namespace(), w.name)
	}
	out := records.DeadLetterMessage(w.env.Names.DeadLetterSubject(w.name, subjectToken(dl.DeliveryID)), dl, msg.Data(), w.env.MaxPayload)
	pctx, cancel := context.WithTimeout(w.env.HardCtx, 10*time.Second)
	_, err := w.env.JS.PublishMsg(pctx, out)
	cancel()
	if err != nil {
		w.env.Log.Error(err, "writing a dead letter; the delivery stays queued", "endpoint", w.name, "delivery", dl.DeliveryID)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	w.Metrics.DeadLettered(reason)
	rec := final
	if rec == nil {
		rec = &records.LogRecord{DeliveryID: dl.DeliveryID, EventID: dl.EventID, EventType: dl.EventType, EventSeq: dl.EventSeq, Namespace: w.env.Names.Namespace(),
			Endpoint: w.name, State: records.StateDeadLetter, Attempt: meta.Attempts, Time: now.UTC(), DeadLetterReason: reason,
			ReplayOf: meta.ReplayOf, Reason: reason}
		rec.Response.Error = message
	}
	w.logThenAck(ctx, msg, meta, rec)
	w.dirty()
}

// logThenAck writes rec to the delivery log and acknowledges msg once it is stored; when it
// could not be, msg is left to be redelivered (and its record written again, a duplicate the
// stream drops if the first write did land: see LogWriter).
func (w *Worker) logThenAck(actx context.Context, msg jetstream.Msg, meta records.DeliveryMeta, rec *records.LogRecord) {
	tracing.Outcome(actx, rec)
	w.inflight.Add(1)
	w.busy.hold(meta.DeliveryID)
	w.env.LogWriter.Write(w.logSubject, rec, alone(msg, meta), func(ok bool) {
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
	w.env.LogWriter.Write(w.logSubject, rec, alone(msg, meta), func(ok bool) { done <- ok })
	return <-done
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

func describe(o outcome) string {
	if o.StatusCode != 0 {
		return fmt.Sprintf("HTTP %d (%s)", o.StatusCode, o.Reason)
	}
	if strings.HasPrefix(o.Err, o.Reason) {
		return records.Bound(o.Err, 200)
	}
	return fmt.Sprintf("%s: %s", o.Reason, records.Bound(o.Err, 200))
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
