package counts

import (
	"time"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// MaxNewsSample bounds the dead letters one delivery.dead_lettered event names.
const MaxNewsSample = 10

// DeadLetterRef names one dead letter in an operational event.
type DeadLetterRef struct {
	DeliveryID string `json:"deliveryId"`
	EventID    string `json:"eventId"`
	EventType  string `json:"eventType,omitempty"`
	Reason     string `json:"reason"`
}

// DeadLetterNews are dead letters of one endpoint to announce: how many, by reason, the first
// few, and the delivery-log sequence of the first (the event's identity).
type DeadLetterNews struct {
	Count    int64            `json:"count"`
	Reasons  map[string]int64 `json:"reasons"`
	Sample   []DeadLetterRef  `json:"sample"`
	FirstSeq uint64           `json:"firstSeq"`
	From     time.Time        `json:"from"`
	To       time.Time        `json:"to"`
}

// Add counts one dead letter read at log sequence seq.
func (n *DeadLetterNews) Add(seq uint64, o records.Outcome) {
	if n.Count == 0 {
		n.FirstSeq, n.From = seq, o.Time
	}
	n.Count++
	if n.Reasons == nil {
		n.Reasons = map[string]int64{}
	}
	n.Reasons[o.DeadLetterReason]++
	if len(n.Sample) < MaxNewsSample {
		n.Sample = append(n.Sample, DeadLetterRef{DeliveryID: records.Bound(o.DeliveryID, 64), EventID: records.Bound(o.EventID, records.MaxEventIDLength),
			EventType: records.Bound(o.EventType, 256), Reason: o.DeadLetterReason})
	}
	if o.Time.After(n.To) {
		n.To = o.Time
	}
}

// Merge adds m (later dead letters) to n.
func (n *DeadLetterNews) Merge(m *DeadLetterNews) {
	if n.Reasons == nil {
		n.Reasons = map[string]int64{}
	}
	for r, c := range m.Reasons {
		n.Reasons[r] += c
	}
	n.Count += m.Count
	for _, ref := range m.Sample {
		if len(n.Sample) < MaxNewsSample {
			n.Sample = append(n.Sample, ref)
		}
	}
	if m.To.After(n.To) {
		n.To = m.To
	}
}
