// Package decide holds every decision about a message of the data plane: pure functions over
// one input (the endpoint's resolved configuration and what is known of the message) that
// return a Verdict and change nothing, so they are tested as tables, without NATS. What a
// Verdict says is carried out in one place, dispatcher/settle (Settler.Finish): the only
// caller of Ack and Nak on a delivery, of retry scheduling, of dead-lettering and
// of the log-then-ack.
package decide

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
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Act is what the settle does with a message.
type Act int

const (
	// ActAck acknowledges: settled without a record (not the endpoint's, filtered, or its
	// outcome is in the delivery log already).
	ActAck Act = iota
	// ActRelease hands the message back to the server, redelivered after delay (0: at once).
	ActRelease
	// ActDeadLetter stores a dead letter and the delivery's final record, then acknowledges.
	ActDeadLetter
	// ActLog stores the attempt's record in the delivery log, then acknowledges (a success).
	ActLog
	// ActSchedule stores the next attempt as a message schedule due at, then logs rec and
	// acknowledges.
	ActSchedule
	// ActWait logs rec and keeps the message here until its retry is due (after delay).
	ActWait
	// ActHold stores a copy of the event in the deliveries stream (out) and acknowledges the
	// event once the copy is stored.
	ActHold
)

// Verdict is what becomes of one message.
type Verdict struct {
	Act Act
	// Delay: ActRelease's redelivery delay, ActWait's wait.
	Delay time.Duration
	// Reason and Why: ActDeadLetter's reason (records.Reason*) and its explanation.
	Reason, Why string
	// Last is the last attempt's response (ActDeadLetter after an attempt).
	Last *records.Response
	// Rec is the attempt's delivery-log record (ActLog, ActSchedule, ActWait; ActDeadLetter
	// after an attempt, otherwise made from the reason).
	Rec *records.LogRecord
	// Meta is the delivery as it stands (attempts made, their history).
	Meta records.DeliveryMeta
	// At is when a scheduled retry is due (ActSchedule).
	At time.Time
	// Out is the copy to store (ActHold); Stored is called once the event is settled.
	Out    *nats.Msg
	Stored func()
}

// Ack acknowledges; Release hands back, to come again after delay; DeadLetter dead-letters
// for reason (records.Reason*), explained by why.
func Ack() Verdict                        { return Verdict{Act: ActAck} }
func Release(delay time.Duration) Verdict { return Verdict{Act: ActRelease, Delay: delay} }
func DeadLetter(reason, why string) Verdict {
	return Verdict{Act: ActDeadLetter, Reason: reason, Why: why}
}

// With is v for the delivery meta.
func (v Verdict) With(meta records.DeliveryMeta) Verdict { v.Meta = meta; return v }

// Step is what a pass does with a message it pulled (Route).
type Step int

const (
	StepRelease Step = iota // hand it back (Release)
	StepAdmit               // an event: admission decides whether it is the endpoint's, then RouteAdmitted
	StepAck                 // not the endpoint's (stored after its deletion)
	StepHold                // copy it into the deliveries stream
	StepTake                // deliver it (or dead-letter it: a deleting endpoint's)
)

// Mode is what a worker may do right now.
type Mode int

const (
	ModePaused Mode = iota // suspended, circuit open, not configured, or waiting for leadership
	ModeProbe              // half-open: this replica delivers one at a time
	ModeRun                // deliver normally (a disabled endpoint runs to dead-letter)
)

// View is what a pass knows of its worker, computed once: the configuration, the mode, whether
// it holds its events, whether the endpoint's lease is held elsewhere, and (PerKey) whether
// events held before are still coming back.
type View struct {
	Config     *endpoint.Config
	Mode       Mode
	Hold       bool
	LeaseMoved bool
	HeldBefore bool
}

// Route decides, before admission, what a pass does with a message pulled from an events
// stream (fromEvents) or the deliveries stream; scheduled says it is a retry its schedule has
// not published yet (on the endpoint's retry subject).
func Route(v View, fromEvents, scheduled bool) (Step, time.Duration) {
	switch {
	case v.Config == nil:
		return StepRelease, 0
	case fromEvents:
		return StepAdmit, 0
	case scheduled && !v.Config.Deleting:
		// The deliveries consumer brings scheduled retries only once the endpoint's deletion
		// widened it: dead-lettered when this dispatcher sees the deletion too, never sent
		// ahead of its time.
		return StepRelease, time.Second
	}
	return RouteAdmitted(v, false, false, false)
}

// RouteAdmitted decides what a pass does with a message admitted (an event the endpoint takes,
// or anything from the deliveries stream): afterDeletion says an event was stored after its
// deleting endpoint was deleted; endangered that it is among those its events stream's
// limits drop next.
func RouteAdmitted(v View, fromEvents, afterDeletion, endangered bool) (Step, time.Duration) {
	c := v.Config
	switch {
	case c.Deleting && fromEvents && afterDeletion:
		return StepAck, 0
	case c.Deleting:
		return StepTake, 0
	case fromEvents && (v.Hold || c.PerKey && v.HeldBefore):
		// A PerKey endpoint also holds what still arrives until the events it held before have
		// come back, so no key goes out of order.
		return StepHold, 0
	case fromEvents && v.LeaseMoved:
		// The lease moved: the new holder gets it first.
		return StepRelease, 0
	case v.Mode == ModePaused && !c.PerKey:
		// Requested before the endpoint paused (half-open with another replica probing, or
		// suspended with deliveries arriving): handed back for whoever takes it next.
		return StepRelease, time.Second
	case fromEvents && endangered:
		return StepHold, 0
	}
	return StepTake, 0
}

// Admission is what Admit decides from.
type Admission struct {
	Subject, Prefix string
	Headers         nats.Header
	Data            []byte
	// MD is the message's metadata (nil: unreadable).
	MD *jetstream.MsgMetadata
	// Own and Name are the endpoint's namespace and name; Exact says its consumers' filters
	// are its patterns.
	Own, Name string
	Exact     bool
	// MaxEventBytes: a larger event is not filtered (Check dead-letters it).
	MaxEventBytes int
}

// Admit decides whether an event from an events stream is the endpoint's: its patterns match
// (the consumer's filter may be the whole namespace when they overlap), it is not an
// operational event the endpoint does not ask for, and its filter (spec.filter) accepts it.
// One that is not is acknowledged (filtered reports a filtered one); one the filter cannot
// decide on is dead-lettered as filter_failed. ok says the event goes on. The operator's
// headers (Whk-*) a producer set were deleted before (records.StripOperatorHeaders).
func Admit(ctx context.Context, c *endpoint.Config, a Admission) (v Verdict, ok, filtered bool) {
	ns, typ := streams.SplitEventSubject(a.Subject, a.Prefix)
	switch {
	case ns == "":
		return Ack(), false, false
	case !a.Exact && !slices.ContainsFunc(c.EventTypes, func(p string) bool { return match.Match(p, typ) }):
		return Ack(), false, false
	case records.IsOpsType(typ) && !receivesOps(ns, a.Headers.Get(records.HOpsEndpoint), a.Own, a.Name, c.EventTypes):
		return Ack(), false, false
	case c.Filter == nil || len(a.Data) > a.MaxEventBytes:
		return Verdict{}, true, false
	case a.MD == nil:
		return Release(0), false, false
	}
	in := expr.NewInput(&expr.Event{ID: records.EventID(a.MD.Stream, a.MD.Sequence.Stream, a.Headers), Type: typ, Namespace: ns,
		Time: records.EventTime(a.Headers, a.MD.Timestamp), Headers: a.Headers, Data: a.Data})
	match, err := c.Filter.Match(ctx, in)
	switch {
	case err != nil && ctx.Err() != nil:
		return Release(0), false, false // stopping: it comes back
	case err != nil:
		meta, _, _ := records.EventDelivery(a.Subject, a.Prefix, a.MD.Stream, a.MD.Sequence.Stream, a.MD.Timestamp, a.Headers, a.Own, a.Name)
		return DeadLetter(records.ReasonFilterFailed, records.Bound(err.Error(), records.MaxErrorText)).With(meta), false, false
	case !match:
		return Ack(), false, true
	}
	return Verdict{}, true, false
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

// Preflight is what is checked of a delivery before any request: Invalid says why the event
// is not one (records.EventDelivery); Disabled and Why say the endpoint is disabled.
type Preflight struct {
	Meta          records.DeliveryMeta
	Invalid       string
	Size          int
	MaxEventBytes int
	Disabled      bool
	Why           string
}

// Check decides whether a delivery may be attempted: ok, or a dead letter with its reason. A
// deleting endpoint's delivery is dead-lettered without a request.
func Check(c *endpoint.Config, p Preflight) (Verdict, bool) {
	meta := p.Meta
	switch {
	case c.Deleting:
		// Whatever is left for a deleted endpoint, a delivery no router wrote included (named
		// after where it is stored).
		return DeadLetter(records.ReasonEndpointDeleted,
			"WebhookEndpoint "+meta.Namespace+"/"+meta.Endpoint+" was deleted before this delivery succeeded").With(meta), false
	case p.Invalid != "":
		return DeadLetter(records.ReasonInvalidEvent, p.Invalid).With(meta), false
	case meta.DeliveryID == "" || meta.EventID == "":
		return DeadLetter(records.ReasonInvalidEvent, "the delivery has no delivery id or event id header").With(meta), false
	case p.Disabled:
		return DeadLetter(records.ReasonEndpointDisabled, p.Why).With(meta), false
	case p.Size > p.MaxEventBytes:
		return DeadLetter(records.ReasonPayloadTooLarge,
			fmt.Sprintf("the event is %d bytes; the installation delivers at most %d", p.Size, p.MaxEventBytes)).With(meta), false
	}
	return Verdict{}, true
}

// Failed decides what follows attempt n of a delivery that failed with outcome o: a dead
// letter when the attempts or the policy's maxRetryDuration are used up (at once for a
// one-shot test delivery), a retry waited out here when it is due within inPlaceMax (and
// every retry of a PerKey endpoint, which nothing of its key may overtake), otherwise a retry
// scheduled as a JetStream message schedule. meta is the delivery before the attempt; rec
// its record, completed here.
func Failed(c *endpoint.Config, meta records.DeliveryMeta, n int, o Outcome, rec records.LogRecord, now time.Time, jitter func() float64, inPlaceMax time.Duration) Verdict {
	if o.Reason == records.FailRequest {
		// The request could not be built: nothing reached the receiver (no attempt is
		// counted), and retrying cannot help.
		return Verdict{Act: ActDeadLetter, Reason: records.ReasonInvalidEvent, Why: "the request could not be built: " + o.Err, Meta: meta}
	}
	meta.Attempts = n
	meta.History = append(meta.History, records.Attempt{N: n, Time: o.Start.UTC(), StatusCode: o.StatusCode,
		LatencyMS: o.Latency.Milliseconds(), LatencyUS: o.Latency.Microseconds(), Reason: o.Reason, Error: records.Bound(o.Err, records.MaxHistoryError)})
	last := &records.Response{StatusCode: o.StatusCode, Body: o.Body, Truncated: o.Truncated, Error: o.Err}
	wait, after := c.Policy.After(n, o.RetryAfter, meta.Created, now, jitter)
	if reason, why := giveUp(meta, after, n, c.Policy.MaxRetryDuration); reason != "" {
		rec.State, rec.DeadLetterReason = records.StateDeadLetter, reason
		return Verdict{Act: ActDeadLetter, Reason: reason, Why: why + "; last: " + Describe(o), Last: last, Rec: &rec, Meta: meta}
	}
	next := now.Add(wait)
	rec.State, rec.NextAttemptAt = records.StateFailed, &next
	if c.PerKey || wait < inPlaceMax {
		return Verdict{Act: ActWait, Delay: wait, Rec: &rec, Meta: meta}
	}
	return Verdict{Act: ActSchedule, At: next, Rec: &rec, Last: last, Why: Describe(o), Meta: meta}
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

// LoggedAgain decides what becomes of a redelivered message whose attempt the delivery log
// holds already (its acknowledgement was lost): a success or a dead letter is acknowledged;
// so is a failure whose retry was scheduled (the schedule was written before the log); a
// failure retried in place is waited out again from where it stood.
func LoggedAgain(c *endpoint.Config, meta records.DeliveryMeta, dec Logged, now time.Time, inPlaceMax time.Duration) Verdict {
	if dec.Terminal() || dec.State != records.StateFailed || !c.PerKey && dec.Wait >= inPlaceMax {
		return Ack()
	}
	meta.Attempts = dec.Attempt
	meta.History = append(meta.History, dec.Record)
	return Verdict{Act: ActWait, Delay: max(dec.Due.Sub(now), 0), Meta: meta}
}

// Paused decides what becomes of a message waiting at the gate while the endpoint may not
// deliver (m is not ModeRun, or it probes and another message holds the probe): a retry held
// (held, its delivery) here of an endpoint that keeps no order is scheduled for now (it holds nothing of the
// consumer meanwhile); a message not yet attempted is handed back when nothing is kept in
// order; one whose endpoint's lease moved is handed back to the new holder; otherwise it waits.
func Paused(c *endpoint.Config, m Mode, held *records.DeliveryMeta, leaseMoved bool) (Verdict, bool) {
	switch {
	case held != nil && (c == nil || !c.PerKey):
		return Verdict{Act: ActSchedule, Meta: *held}, false
	case held == nil && m == ModePaused && (c == nil || !c.PerKey):
		// It comes back to whoever takes it next: a probe, a holding worker, or this one
		// resuming.
		return Release(time.Second), false
	case c != nil && !c.Deleting && !c.Suspend && leaseMoved:
		// The server gives handed-back messages to the holder first, in the order they were
		// handed back, so a key's events keep their order when this replica still reaches
		// NATS. A PerKey retry held here starts again from its last recorded attempt.
		return Release(0), false
	}
	return Verdict{}, true
}

// Describe says what an attempt came to, in a line.
func Describe(o Outcome) string {
	if o.StatusCode != 0 {
		return fmt.Sprintf("HTTP %d (%s)", o.StatusCode, o.Reason)
	}
	if strings.HasPrefix(o.Err, o.Reason) {
		return records.Bound(o.Err, 200)
	}
	return fmt.Sprintf("%s: %s", o.Reason, records.Bound(o.Err, 200))
}

// Outcome is what one attempt came to.
type Outcome struct {
	Start      time.Time
	Latency    time.Duration
	Success    bool
	StatusCode int
	Reason     string // records.Fail*, empty on success
	Err        string
	Body       string
	Truncated  bool
	RetryAfter time.Duration
	// Sent are the request headers as sent, secrets redacted, for the delivery log.
	Sent map[string]string
	// Logged is the outcome the delivery log already holds of a redelivered message: no
	// request was made.
	Logged *Logged
}

// Logged is what the delivery log holds of one delivery: its latest attempt's outcome.
type Logged struct {
	State   string
	Attempt int
	Time    time.Time
	// Wait is how long the dispatcher chose to wait after a failed attempt before the next;
	// Due is when the next is due.
	Wait time.Duration
	Due  time.Time
	// Record is the outcome as logged, for a held retry's history.
	Record records.Attempt
}

// Terminal says no attempt follows.
func (d Logged) Terminal() bool {
	return d.State == records.StateSucceeded || d.State == records.StateDeadLetter
}
