package health

import (
	"encoding/json"
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

// Outcome is what the fold reads of one delivery-log record.
type Outcome struct {
	Endpoint         string    `json:"endpoint"`
	State            string    `json:"state"`
	Attempt          int       `json:"attempt"`
	Time             time.Time `json:"time"`
	Reason           string    `json:"reason"`
	DeadLetterReason string    `json:"deadLetterReason"`
	Response         struct {
		StatusCode int    `json:"statusCode"`
		Error      string `json:"error"`
	} `json:"response"`
}

// ReadOutcome decodes the part of a delivery-log record the fold needs.
func ReadOutcome(data []byte) (Outcome, bool) {
	var o Outcome
	if err := json.Unmarshal(data, &o); err != nil || o.Endpoint == "" || o.State == "" {
		return Outcome{}, false
	}
	return o, true
}

// receiverFailed reports whether a dead letter ends a delivery the receiver failed (its
// attempts ran out), as opposed to one given up for another reason (the endpoint was
// disabled, the event was invalid or too large), which counts only as dead-lettered.
func receiverFailed(deadLetterReason string) bool {
	return deadLetterReason == records.ReasonExhausted
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
}

// Empty reports whether nothing was folded in.
func (d *Delta) Empty() bool { return d.Through == 0 }

// Add folds in the record at stream sequence seq.
func (d *Delta) Add(seq uint64, o Outcome) {
	if d.From == 0 {
		d.From = seq
	}
	d.Through = seq
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
		if receiverFailed(o.DeadLetterReason) && o.Attempt > 0 {
			d.Attempts++
			d.Failures++
			d.Completed++
			d.Failed++
			d.lastFailure(o)
		}
	}
}

func (d *Delta) lastFailure(o Outcome) {
	if d.LastFailure != nil && !o.Time.After(d.LastFailure.Time) {
		return
	}
	d.LastFailure = &Failure{Time: o.Time.UTC(), StatusCode: o.Response.StatusCode, Reason: o.Reason,
		Message: records.Bound(o.Response.Error, maxFailureMessage)}
}

// FailedDeliveries reports whether the delta ended a delivery the receiver failed: the
// failure-rate trigger is evaluated then, as it is whenever a delivery is dead-lettered.
func (d *Delta) FailedDeliveries() bool { return d.Failed > 0 }

// Pending collects the deltas of a fold pass per endpoint.
type Pending map[string]*Delta

// Add folds the record data, read at stream sequence seq, into its endpoint's delta; records
// of endpoints this dispatcher does not serve, and unreadable ones, are passed over.
func (p Pending) Add(seq uint64, data []byte, serves func(endpoint string) bool) {
	o, ok := ReadOutcome(data)
	if !ok || !serves(o.Endpoint) {
		return
	}
	d := p[o.Endpoint]
	if d == nil {
		d = &Delta{}
		p[o.Endpoint] = d
	}
	d.Add(seq, o)
}
