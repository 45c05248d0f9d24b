package deliver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/match"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// Every decision about a message is a function that returns a verdict, and Worker.finish
// (finish.go) is the one place a verdict is carried out: the only caller of Ack and Nak, of
// retry scheduling, of dead-lettering and of the log-then-ack. The decisions (admission,
// the pre-flight checks, the gate, giving up after a failed attempt) read what they are
// given and change nothing, so they are tested as tables, without NATS (verdict_test.go).

// act is what finish does with a message.
type act int

const (
	// actAck acknowledges: settled without a record (not the endpoint's, filtered, or its
	// outcome is in the delivery log already).
	actAck act = iota
	// actRelease hands the message back to the server, redelivered after delay (0: at once).
	actRelease
	// actDeadLetter stores a dead letter and the delivery's final record, then acknowledges.
	actDeadLetter
	// actLog stores the attempt's record in the delivery log, then acknowledges (a success).
	actLog
	// actSchedule stores the next attempt as a message schedule due at, then logs rec and
	// acknowledges.
	actSchedule
	// actWait logs rec and keeps the message here until its retry is due (after delay).
	actWait
	// actHold stores a copy of the event in the deliveries stream (out) and acknowledges the
	// event once the copy is stored.
	actHold
)

// verdict is what becomes of one message.
type verdict struct {
	act act
	// delay: actRelease's redelivery delay, actWait's wait.
	delay time.Duration
	// reason and why: actDeadLetter's reason (records.Reason*) and its explanation.
	reason, why string
	// last is the last attempt's response (actDeadLetter after an attempt).
	last *records.Response
	// rec is the attempt's delivery-log record (actLog, actSchedule, actWait; actDeadLetter
	// after an attempt, otherwise made from the reason).
	rec *records.LogRecord
	// meta is the delivery as it stands (attempts made, their history).
	meta records.DeliveryMeta
	// at is when a scheduled retry is due (actSchedule).
	at time.Time
	// out is the copy to store (actHold); stored is called once the event is settled.
	out    *nats.Msg
	stored func()
}

func ack() verdict                        { return verdict{act: actAck} }
func release(delay time.Duration) verdict { return verdict{act: actRelease, delay: delay} }
func deadLetter(reason, why string) verdict {
	return verdict{act: actDeadLetter, reason: reason, why: why}
}

// with is v for the delivery meta.
func (v verdict) with(meta records.DeliveryMeta) verdict { v.meta = meta; return v }

// step is what a pass does with a message it pulled (route).
type step int

const (
	stepRelease step = iota // hand it back (verdict release)
	stepAdmit               // an event: admission decides whether it is the endpoint's, then routeAdmitted
	stepAck                 // not the endpoint's (stored after its deletion)
	stepHold                // copy it into the deliveries stream
	stepTake                // deliver it (or dead-letter it: a deleting endpoint's)
)

// view is what a pass knows of its worker, computed once: the configuration, the mode, whether
// it holds its events, whether the endpoint's lease is held elsewhere, and (PerKey) whether
// events held before are still coming back.
type view struct {
	c          *endpoint.Config
	mode       mode
	hold       bool
	leaseMoved bool
	heldBefore bool
}

// route decides, before admission, what a pass does with a message pulled from an events
// stream (fromEvents) or the deliveries stream; scheduled says it is a retry its schedule has
// not published yet (on the endpoint's retry subject).
func route(v view, fromEvents, scheduled bool) (step, time.Duration) {
	switch {
	case v.c == nil:
		return stepRelease, 0
	case fromEvents:
		return stepAdmit, 0
	case scheduled && !v.c.Deleting:
		// The deliveries consumer brings scheduled retries only once the endpoint's deletion
		// widened it: dead-lettered when this dispatcher sees the deletion too, never sent
		// ahead of its time.
		return stepRelease, time.Second
	}
	return routeAdmitted(v, false, false, false)
}

// routeAdmitted decides what a pass does with a message admitted (an event the endpoint takes,
// or anything from the deliveries stream): afterDeletion says an event was stored after its
// deleting endpoint was deleted; endangered that it is among those its events stream's
// limits drop next.
func routeAdmitted(v view, fromEvents, afterDeletion, endangered bool) (step, time.Duration) {
	c := v.c
	switch {
	case c.Deleting && fromEvents && afterDeletion:
		return stepAck, 0
	case c.Deleting:
		return stepTake, 0
	case fromEvents && (v.hold || c.PerKey && v.heldBefore):
		// A PerKey endpoint also holds what still arrives until the events it held before have
		// come back, so no key goes out of order.
		return stepHold, 0
	case fromEvents && v.leaseMoved:
		// The lease moved: the new holder gets it first.
		return stepRelease, 0
	case v.mode == modePaused && !c.PerKey:
		// Requested before the endpoint paused (half-open with another replica probing, or
		// suspended with deliveries arriving): handed back for whoever takes it next.
		return stepRelease, time.Second
	case fromEvents && endangered:
		return stepHold, 0
	}
	return stepTake, 0
}

// admission is what admit decides from.
type admission struct {
	subject, prefix string
	headers         nats.Header
	data            []byte
	// md is the message's metadata (nil: unreadable).
	md *jetstream.MsgMetadata
	// own and name are the endpoint's namespace and name; exact says its consumers' filters
	// are its patterns.
	own, name string
	exact     bool
	// maxEventBytes: a larger event is not filtered (preflight dead-letters it).
	maxEventBytes int
}

// admit decides whether an event from an events stream is the endpoint's: its patterns match
// (the consumer's filter may be the whole namespace when they overlap), it is not an
// operational event the endpoint does not ask for, and its filter (spec.filter) accepts it.
// One that is not is acknowledged (filtered reports a filtered one); one the filter cannot
// decide on is dead-lettered as filter_failed. ok says the event goes on. The operator's
// headers (Whk-*) a producer set were deleted before (records.StripOperatorHeaders).
func admit(ctx context.Context, c *endpoint.Config, a admission) (v verdict, ok, filtered bool) {
	ns, typ := eventNamespaceType(a.subject, a.prefix)
	switch {
	case ns == "":
		return ack(), false, false
	case !a.exact && !slices.ContainsFunc(c.EventTypes, func(p string) bool { return match.Match(p, typ) }):
		return ack(), false, false
	case records.IsOpsType(typ) && !receivesOps(ns, a.headers.Get(records.HOpsEndpoint), a.own, a.name, c.EventTypes):
		return ack(), false, false
	case c.Filter == nil || len(a.data) > a.maxEventBytes:
		return verdict{}, true, false
	case a.md == nil:
		return release(0), false, false
	}
	in := expr.NewInput(&expr.Event{ID: records.EventID(a.md.Stream, a.md.Sequence.Stream, a.headers), Type: typ, Namespace: ns,
		Time: records.EventTime(a.headers, a.md.Timestamp), Headers: a.headers, Data: a.data})
	match, err := c.Filter.Match(ctx, in)
	switch {
	case err != nil && ctx.Err() != nil:
		return release(0), false, false // stopping: it comes back
	case err != nil:
		meta, _, _ := records.EventDelivery(a.subject, a.prefix, a.md.Stream, a.md.Sequence.Stream, a.md.Timestamp, a.headers, a.own, a.name)
		return deadLetter(records.ReasonFilterFailed, records.Bound(err.Error(), records.MaxErrorText)).with(meta), false, false
	case !match:
		return ack(), false, true
	}
	return verdict{}, true, false
}

// receivesOps says whether endpoint ep of namespace own (with event-type patterns) receives an
// operational event of namespace ns about endpoint about: only when a pattern names the
// operational types explicitly (its first token is webhook_operator: a catch-all such as > or
// *.created does not receive them), and never an event about ep itself, so an endpoint failing
// to deliver operational events does not feed on its own failures.
func receivesOps(ns, about, own, ep string, patterns []string) bool {
	if about == ep && ns == own {
		return false
	}
	for _, p := range patterns {
		if p == records.OpsTypePrefix || strings.HasPrefix(p, records.OpsTypePrefix+".") {
			return true
		}
	}
	return false
}

// preflight is what is checked of a delivery before any request: invalid says why the event
// is not one (records.EventDelivery); disabled and why say the endpoint is disabled.
type preflight struct {
	meta          records.DeliveryMeta
	invalid       string
	size          int
	maxEventBytes int
	disabled      bool
	why           string
}

// check decides whether a delivery may be attempted: ok, or a dead letter with its reason. A
// deleting endpoint's delivery is dead-lettered without a request.
func check(c *endpoint.Config, p preflight) (verdict, bool) {
	meta := p.meta
	switch {
	case c.Deleting:
		// Whatever is left for a deleted endpoint, a delivery no router wrote included (named
		// after where it is stored).
		return deadLetter(records.ReasonEndpointDeleted,
			"WebhookEndpoint "+meta.Namespace+"/"+meta.Endpoint+" was deleted before this delivery succeeded").with(meta), false
	case p.invalid != "":
		return deadLetter(records.ReasonInvalidEvent, p.invalid).with(meta), false
	case meta.DeliveryID == "" || meta.EventID == "":
		return deadLetter(records.ReasonInvalidEvent, "the delivery has no delivery id or event id header").with(meta), false
	case p.disabled:
		return deadLetter(records.ReasonEndpointDisabled, p.why).with(meta), false
	case p.size > p.maxEventBytes:
		return deadLetter(records.ReasonPayloadTooLarge,
			fmt.Sprintf("the event is %d bytes; the installation delivers at most %d", p.size, p.maxEventBytes)).with(meta), false
	}
	return verdict{}, true
}

// failed decides what follows attempt n of a delivery that failed with outcome o: a dead
// letter when the attempts or the policy's maxRetryDuration are used up (at once for a
// one-shot test delivery), a retry waited out here when it is due within inPlaceMax (and
// every retry of a PerKey endpoint, which nothing of its key may overtake), otherwise a retry
// scheduled as a JetStream message schedule. meta is the delivery before the attempt; rec
// its record, completed here.
func failed(c *endpoint.Config, meta records.DeliveryMeta, n int, o outcome, rec records.LogRecord, now time.Time, jitter func() float64, inPlaceMax time.Duration) verdict {
	if o.Reason == records.FailRequest {
		// The request could not be built: nothing reached the receiver (no attempt is
		// counted), and retrying cannot help.
		return verdict{act: actDeadLetter, reason: records.ReasonInvalidEvent, why: "the request could not be built: " + o.Err, meta: meta}
	}
	meta.Attempts = n
	meta.History = append(meta.History, records.Attempt{N: n, Time: o.Start.UTC(), StatusCode: o.StatusCode,
		LatencyMS: o.Latency.Milliseconds(), LatencyUS: o.Latency.Microseconds(), Reason: o.Reason, Error: records.Bound(o.Err, records.MaxHistoryError)})
	last := &records.Response{StatusCode: o.StatusCode, Body: o.Body, Truncated: o.Truncated, Error: o.Err}
	wait, after := c.Policy.After(n, o.RetryAfter, meta.Created, now, jitter)
	if reason, why := giveUp(meta, after, n, c.Policy.MaxRetryDuration); reason != "" {
		rec.State, rec.DeadLetterReason = records.StateDeadLetter, reason
		return verdict{act: actDeadLetter, reason: reason, why: why + "; last: " + describe(o), last: last, rec: &rec, meta: meta}
	}
	next := now.Add(wait)
	rec.State, rec.NextAttemptAt = records.StateFailed, &next
	if c.PerKey || wait < inPlaceMax {
		return verdict{act: actWait, delay: wait, rec: &rec, meta: meta}
	}
	return verdict{act: actSchedule, at: next, rec: &rec, last: last, why: describe(o), meta: meta}
}

// giveUp says why a delivery whose attempt n just failed gets no further attempt (a dead-letter
// reason and its explanation), or "" when it is retried.
func giveUp(meta records.DeliveryMeta, after policy.Verdict, n int, limit time.Duration) (string, string) {
	switch {
	case meta.Test:
		return records.ReasonTestFailed, "the test delivery's one attempt failed (test deliveries are not retried)"
	case after == policy.Exhausted:
		return records.ReasonExhausted, fmt.Sprintf("%d attempts without a successful response", n)
	case after == policy.RetryDurationExceeded:
		return records.ReasonRetryDurationExceeded, fmt.Sprintf("%d attempts without a successful response, and the next would start more than maxRetryDuration (%s) after the delivery was created at %s",
			n, limit, meta.Created.UTC().Format(time.RFC3339))
	}
	return "", ""
}

// loggedAgain decides what becomes of a redelivered message whose attempt the delivery log
// holds already (its acknowledgement was lost): a success or a dead letter is acknowledged;
// so is a failure whose retry was scheduled (the schedule was written before the log); a
// failure retried in place is waited out again from where it stood.
func loggedAgain(c *endpoint.Config, meta records.DeliveryMeta, dec decision, now time.Time, inPlaceMax time.Duration) verdict {
	if dec.terminal() || dec.State != records.StateFailed || !c.PerKey && dec.Wait >= inPlaceMax {
		return ack()
	}
	meta.Attempts = dec.Attempt
	meta.History = append(meta.History, dec.Record)
	return verdict{act: actWait, delay: max(dec.Due.Sub(now), 0), meta: meta}
}

// paused decides what becomes of a message waiting at the gate while the endpoint may not
// deliver (m is not modeRun, or it probes and another message holds the probe): a retry held
// here of an endpoint that keeps no order is scheduled for now (it holds nothing of the
// consumer meanwhile); a message not yet attempted is handed back when nothing is kept in
// order; one whose endpoint's lease moved is handed back to the new holder; otherwise it waits.
func paused(c *endpoint.Config, m mode, held *heldRetry, leaseMoved bool) (verdict, bool) {
	switch {
	case held != nil && (c == nil || !c.PerKey):
		return verdict{act: actSchedule, meta: held.meta}, false
	case held == nil && m == modePaused && (c == nil || !c.PerKey):
		// It comes back to whoever takes it next: a probe, a holding worker, or this one
		// resuming.
		return release(time.Second), false
	case c != nil && !c.Deleting && !c.Suspend && leaseMoved:
		// The server gives handed-back messages to the holder first, in the order they were
		// handed back, so a key's events keep their order when this replica still reaches
		// NATS. A PerKey retry held here starts again from its last recorded attempt.
		return release(0), false
	}
	return verdict{}, true
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
