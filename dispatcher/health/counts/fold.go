// Package counts makes an endpoint's counts: the fold of the durable delivery log into deltas
// (Delta, Folder, run by the holder of partition 0 from its checkpoint), the dead letters to
// announce among them (DeadLetterNews), and the tally of events the filters rejected, which
// leave no record in the log (FilterTally). Where the counts go is the consumer's interface
// (FoldTarget, TallyTarget): the endpoints' shared state.
package counts

import (
	"time"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// Failure is the last failed attempt of an endpoint, as its status shows it.
type Failure struct {
	Time       time.Time `json:"time"`
	StatusCode int       `json:"statusCode,omitempty"`
	Reason     string    `json:"reason"`
	Message    string    `json:"message,omitempty"`
}

// maxFailureMessage bounds the message of the last failure kept in the bucket and the status.
const maxFailureMessage = 512

// receiverFailed reports whether a dead letter ends a delivery the receiver failed (its
// attempts or its retry duration ran out, or a test delivery's one attempt failed), as
// opposed to one given up for another reason (the endpoint was disabled, the event was
// invalid or too large), which counts only as dead-lettered.
func receiverFailed(deadLetterReason string) bool {
	switch deadLetterReason {
	case records.ReasonExhausted, records.ReasonRetryDurationExceeded, records.ReasonTestFailed:
		return true
	}
	return false
}

// Delta is what folding part of the delivery log adds to one endpoint's counts.
type Delta struct {
	// Attempts and Failures count attempts; Completed and Failed count deliveries that ended
	// (succeeded or dead-lettered after their attempts), for the failure-rate trigger.
	Attempts, Failures, Completed, Failed int64
	Delivered, DeadLettered               int64
	LastSuccess                           time.Time
	LastFailure                           *Failure
	// From and Through are the first and last stream sequences folded in (0: none).
	From, Through uint64
	// News are the dead letters to announce (delivery.dead_lettered): every one but those of
	// operational events, so an endpoint failing to deliver operational events does not make
	// more of them (the loop guard).
	News *DeadLetterNews
}

// Empty reports whether nothing was folded in.
func (d *Delta) Empty() bool { return d.Through == 0 }

// Add folds in the record at stream sequence seq (in any order: From and Through bound them).
func (d *Delta) Add(seq uint64, o records.Outcome) {
	if d.From == 0 || seq < d.From {
		d.From = seq
	}
	d.Through = max(d.Through, seq)
	switch o.State {
	case records.StateSucceeded:
		d.Attempts++
		d.Completed++
		d.Delivered++
		if o.Time.After(d.LastSuccess) {
			d.LastSuccess = o.Time
		}
	case records.StateFailed:
		d.Attempts++
		d.Failures++
		d.lastFailure(o)
	case records.StateDeadLetter:
		d.DeadLettered++
		if !records.IsOpsType(o.EventType) {
			if d.News == nil {
				d.News = &DeadLetterNews{}
			}
			d.News.Add(seq, o)
		}
		if receiverFailed(o.DeadLetterReason) && o.Attempt > 0 {
			d.Attempts++
			d.Failures++
			d.Completed++
			d.Failed++
			d.lastFailure(o)
		}
	}
}

func (d *Delta) lastFailure(o records.Outcome) {
	if d.LastFailure != nil && !o.Time.After(d.LastFailure.Time) {
		return
	}
	d.LastFailure = &Failure{Time: o.Time.UTC(), StatusCode: o.StatusCode, Reason: o.Reason,
		Message: records.Bound(o.Error, maxFailureMessage)}
}

// FailedDeliveries reports whether the delta ended a delivery the receiver failed: the
// failure-rate trigger is evaluated then, as it is whenever a delivery is dead-lettered.
func (d *Delta) FailedDeliveries() bool { return d.Failed > 0 }

// Pending collects the deltas of a fold pass per endpoint.
type Pending map[string]*Delta

// AddIf folds outcome o, read at stream sequence seq, into its endpoint's delta when
// counts(endpoint, seq) says so.
func (p Pending) AddIf(seq uint64, o records.Outcome, counts func(endpoint string, seq uint64) bool) {
	if !counts(o.Endpoint, seq) {
		return
	}
	d := p[o.Endpoint]
	if d == nil {
		d = &Delta{}
		p[o.Endpoint] = d
	}
	d.Add(seq, o)
}
