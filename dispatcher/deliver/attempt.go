package deliver

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/attempt"
	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/dispatcher/settle"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// heldRetry is a PerKey delivery (or one due soon) retrying in place.
type heldRetry struct {
	meta records.DeliveryMeta
	wait time.Duration
}

// attempt makes one attempt of msg (or of a held retry) and finishes it. It returns a held
// retry when the delivery must retry in place.
func (w *Worker) attempt(ctx context.Context, msg jetstream.Msg, held *heldRetry) *heldRetry {
	c := w.cfg.Load()
	if c == nil {
		return w.finish(ctx, msg, decide.Release(0))
	}
	meta, invalid := w.deliveryOf(msg, held)
	if held == nil && invalid == "" && meta.DeliveryID != "" {
		// A copy of a delivery this worker is attempting or logging now (redelivered while
		// its outcome is being written) waits until that is decided.
		if !w.busy.claim(meta.DeliveryID) {
			return w.finish(ctx, msg, decide.Release(2*time.Second))
		}
		defer w.busy.release(meta.DeliveryID)
		// A message delivered before may have had its outcome logged, and only its
		// acknowledgement lost: then it is settled from the log, without a request.
		since, again := settle.Redelivered(msg)
		if (meta.Redelivered || w.parkedFirst(msg, meta)) && !meta.Created.IsZero() && (!again || meta.Created.Before(since)) {
			// A copy of a message delivered before (parked, held or scheduled from it; the
			// shared lane's queue brings it as a new message), or a first attempt parked: its
			// outcome may have been logged since its delivery was created.
			since, again = meta.Created, true
		}
		if again {
			dec, ok, err := w.decidedIndex().lookup(ctx, meta.DeliveryID, since)
			if err != nil {
				w.f.Log.V(1).Info("reading the delivery log for a redelivered message; it is attempted later", "endpoint", w.name,
					"delivery", meta.DeliveryID, "error", err.Error())
				return w.finish(ctx, msg, decide.Release(time.Second))
			}
			if ok && (dec.Terminal() || dec.Attempt > meta.Attempts) {
				w.f.Log.V(1).Info("a redelivered message's outcome is in the delivery log already; settled without a request",
					"endpoint", w.name, "delivery", meta.DeliveryID, "attempt", dec.Attempt, "state", dec.State)
				return w.finish(ctx, msg, decide.LoggedAgain(c, meta, dec, time.Now(), w.f.Settings.InPlaceRetryMax))
			}
		}
	}
	why, disabled := w.f.Health.DisabledReason(w.name)
	if v, ok := decide.Check(c, decide.Preflight{Meta: meta, Invalid: invalid, Size: len(msg.Data()), MaxEventBytes: w.f.Settings.MaxEventBytes,
		Disabled: disabled, Why: why}); !ok {
		return w.finish(ctx, msg, v)
	}

	n := meta.Attempts + 1
	req, v, ok := w.request(c, msg, meta, n)
	if !ok {
		return w.finish(ctx, msg, v)
	}
	// The attempt's span (none when tracing is off); finish records the outcome on it.
	ctx, span := w.f.Tracer.StartAttempt(ctx, tracing.Start{Namespace: meta.Namespace, Endpoint: w.name, DeliveryID: meta.DeliveryID,
		EventID: meta.EventID, EventType: meta.EventType, ReplayOf: meta.ReplayOf, Attempt: n, TraceParent: req.TraceParent, TraceState: req.TraceState})
	defer span.End()
	req.TraceParent, req.TraceState = span.Context(req.TraceParent, req.TraceState)
	o := w.exchange(c, req)
	if w.f.Hard.Err() != nil {
		// Shutting down past the grace period: this attempt does not count; redeliver.
		return w.finish(ctx, msg, decide.Release(0))
	}
	w.Metrics.Latency(o.Latency.Seconds())
	// What the receiver said is stored bounded, without Secret values or URL credentials.
	o.Body, o.Err = c.Scrub(o.Body), records.StoredError(c.Scrub(o.Err))
	return w.finish(ctx, msg, w.outcome(ctx, c, meta, n, o))
}

// deliveryOf reads the delivery msg is (held: the retry held here); invalid says why an event
// is not a delivery.
func (w *Worker) deliveryOf(msg jetstream.Msg, held *heldRetry) (meta records.DeliveryMeta, invalid string) {
	if held != nil {
		meta = held.meta
	} else if md, err := msg.Metadata(); err == nil && md.Stream == w.f.parks.name {
		// Only a message of the deliveries stream is a delivery whose headers the operator
		// wrote (attempts made, ids, test, replay-of); whatever headers an event carries, it is
		// an event (its Whk-* ones were deleted at admission anyway).
		meta = records.ParseDeliveryMeta(msg.Headers())
	} else if err == nil {
		// An event straight from an events stream.
		meta, invalid, _ = records.EventDelivery(msg.Subject(), w.f.Settings.Streams.EventsSubjectPrefix, md.Stream, md.Sequence.Stream, md.Timestamp,
			msg.Headers(), w.f.Settings.Names.Namespace(), w.name)
	}
	if meta.Namespace == "" {
		meta.Namespace = w.f.Settings.Names.Namespace()
	}
	if meta.Endpoint == "" {
		meta.Endpoint = w.name
	}
	return meta, invalid
}

// request builds attempt n's request: the event's body and headers, or what the endpoint's
// transformation makes of them (the signature covers that body), in the endpoint's format. A
// transformation that fails on the event is not the receiver's failure: the delivery is
// dead-lettered without an attempt.
func (w *Worker) request(c *endpoint.Config, msg jetstream.Msg, meta records.DeliveryMeta, n int) (*attempt.Request, decide.Verdict, bool) {
	h := msg.Headers()
	req := &attempt.Request{Meta: meta, Attempt: n, Body: msg.Data(),
		ContentType: h.Get(records.HeaderContentType), TraceParent: h.Get(records.HeaderTraceParent), TraceState: h.Get(records.HeaderTraceState),
		Forward: records.ForwardedHeaders(h)}
	if c.Transform != nil && c.ConfigError == nil {
		out, err := c.Transform.Apply(w.f.Hard, expr.NewInput(expr.DeliveryEvent(meta, h, msg.Data())))
		switch {
		case err != nil && w.f.Hard.Err() != nil:
			return nil, decide.Release(0), false
		case err != nil:
			return nil, decide.DeadLetter(records.ReasonTransformFailed, records.Bound(err.Error(), records.MaxErrorText)).With(meta), false
		}
		if out.Body != nil {
			req.Body, req.ContentType = out.Body, out.ContentType
		}
		req.Extra = out.Headers
	}
	if err := attempt.Chat(c, meta, msg.Data(), req); err != nil {
		return nil, decide.DeadLetter(records.ReasonInvalidEvent, records.Bound(err.Error(), records.MaxErrorText)).With(meta), false
	}
	if err := attempt.CloudEvent(c, meta, h, req); err != nil {
		return nil, decide.DeadLetter(records.ReasonInvalidEvent, records.Bound(err.Error(), records.MaxErrorText)).With(meta), false
	}
	return req, decide.Verdict{}, true
}

// outcome counts attempt n's outcome in the endpoint's health and metrics and decides what
// follows: a success is logged (then acknowledged); a failure is retried or dead-lettered as
// failed decides. Every outcome is written to the delivery log before the delivery is
// acknowledged, so the log (and the health counts folded from it) holds every outcome
// whatever crashes when.
func (w *Worker) outcome(ctx context.Context, c *endpoint.Config, meta records.DeliveryMeta, n int, o decide.Outcome) decide.Verdict {
	rec := records.LogRecord{
		DeliveryID: meta.DeliveryID, EventID: meta.EventID, EventType: meta.EventType, EventSeq: meta.EventSeq, EventNamespace: meta.EventNamespace,
		Namespace: w.f.Settings.Names.Namespace(), Endpoint: w.name,
		Attempt: n, Time: o.Start.UTC(), LatencyMS: o.Latency.Milliseconds(), LatencyUS: o.Latency.Microseconds(), Reason: o.Reason, RequestHeaders: o.Sent,
		Response: records.Response{StatusCode: o.StatusCode, Body: o.Body, Truncated: o.Truncated, Error: o.Err}, ReplayOf: meta.ReplayOf,
		Test: meta.Test,
	}
	if o.Success {
		w.Metrics.Succeeded()
		if _, needsSync := w.f.Health.Fast(w.name); needsSync {
			_, _ = w.f.Health.Change(ctx, w.name, func(s *state.State, now time.Time) []state.Transition { return s.OnSuccess(*c.Policy, now) })
		}
		rec.State = records.StateSucceeded
		w.dirty()
		return decide.Verdict{Act: decide.ActLog, Rec: &rec, Meta: meta}
	}
	if o.Reason != records.FailRequest {
		w.Metrics.Failed()
		_, _ = w.f.Health.Change(ctx, w.name, func(s *state.State, now time.Time) []state.Transition { return s.OnFailure(*c.Policy, now) })
	}
	return decide.Failed(c, meta, n, o, rec, time.Now(), rand.Float64, w.f.Settings.InPlaceRetryMax)
}

// parkedFirst says msg is a first attempt of the shared lane that was parked (read back from
// the park, or brought by the queue). The event it was copied from may have come again (its
// acknowledgement lost to a nats-server restart after the copy was stored) and been delivered
// meanwhile, which the copy cannot know: it reads the delivery log first. Parking is the slow
// path already, and the log's index reads forward, once.
func (w *Worker) parkedFirst(msg jetstream.Msg, meta records.DeliveryMeta) bool {
	p, ok := msg.(*pulled)
	if !ok || meta.Attempts > 0 {
		return false
	}
	if p.parked != nil {
		return true
	}
	return p.view != nil && p.md != nil && p.md.Stream == w.f.parks.name
}
