package state

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/webhook-operator/webhook-operator/dispatcher/health/counts"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// Operational events of an endpoint's changes (records.OpsEvent) are made here, in the same
// compare-and-set as the change, and kept in the state's outbox until they are published
// (report.Announcer).

// DeadLetterNewsWindow is the least time between two delivery.dead_lettered events of one
// endpoint: the first dead letter after a quiet window is announced at once, the ones that
// follow within the window are counted and announced together when it ends, so a failing
// endpoint dead-lettering thousands of deliveries makes one event a minute, not thousands.
const DeadLetterNewsWindow = time.Minute

// maxOutbox and maxOutboxBytes bound the events waiting (JSON-encoded), so the state stays
// far below the bucket's value size.
const (
	maxOutbox      = 32
	maxOutboxBytes = 16 << 10
)

// TakeDeadLetterNews adds n (perhaps nil) to the dead letters waiting to be announced and
// returns what to announce now: all that waits, when no delivery.dead_lettered event was
// queued within window (DeadLetterNewsWindow); nil otherwise.
func (s *State) TakeDeadLetterNews(n *counts.DeadLetterNews, now time.Time, window time.Duration) *counts.DeadLetterNews {
	if n != nil && n.Count > 0 {
		if s.DeadLetterNews == nil {
			c := *n
			s.DeadLetterNews = &c
		} else {
			s.DeadLetterNews.Merge(n)
		}
	}
	if s.DeadLetterNews == nil || now.Before(s.NewsAt.Add(window)) {
		return nil
	}
	out := s.DeadLetterNews
	s.DeadLetterNews, s.NewsAt = nil, now
	return out
}

// NewsDue reports whether dead letters wait whose window has ended.
func (s *State) NewsDue(now time.Time, window time.Duration) bool {
	return s.DeadLetterNews != nil && !now.Before(s.NewsAt.Add(window))
}

// transitionTypes maps a transition to its operational event type.
var transitionTypes = map[string]string{
	"Disabled":        records.OpsEndpointDisabled,
	"Enabled":         records.OpsEndpointEnabled,
	"CircuitOpened":   records.OpsCircuitOpened,
	"CircuitHalfOpen": records.OpsCircuitHalfOpen,
	"CircuitClosed":   records.OpsCircuitClosed,
}

// transitionEvent is the operational event of transition t of endpoint ep at now.
func transitionEvent(namespace, ep string, t Transition, now time.Time) (records.OpsEvent, bool) {
	typ, ok := transitionTypes[t.Type]
	if !ok {
		return records.OpsEvent{}, false
	}
	data := make(map[string]any, len(t.Data)+1)
	for k, v := range t.Data {
		data[k] = v
	}
	data["message"] = t.Message
	return records.NewOpsEvent(namespace, ep, typ, strconv.FormatInt(now.UnixNano(), 10), now, data), true
}

// deadLetterEvent is the delivery.dead_lettered event of news n of endpoint ep.
func deadLetterEvent(namespace, ep string, n *counts.DeadLetterNews, now time.Time, window time.Duration) records.OpsEvent {
	data := map[string]any{"count": n.Count, "reasons": n.Reasons, "deliveries": n.Sample, "from": n.From.UTC(), "to": n.To.UTC(),
		"windowSeconds": window.Seconds()}
	if len(n.Sample) > 0 {
		first := n.Sample[0]
		data["deliveryId"], data["eventId"], data["eventType"], data["reason"] = first.DeliveryID, first.EventID, first.EventType, first.Reason
	}
	return records.NewOpsEvent(namespace, ep, records.OpsDeliveryDeadLettered, "log."+strconv.FormatUint(n.FirstSeq, 10), now, data)
}

// queue adds ev to the outbox, dropping the oldest beyond maxOutbox events or maxOutboxBytes
// (it returns them).
func (s *State) queue(ev records.OpsEvent) (dropped []records.OpsEvent) {
	s.Outbox = append(s.Outbox, ev)
	size := 0
	for _, e := range s.Outbox {
		size += encodedSize(e)
	}
	for len(s.Outbox) > 1 && (len(s.Outbox) > maxOutbox || size > maxOutboxBytes) {
		dropped = append(dropped, s.Outbox[0])
		size -= encodedSize(s.Outbox[0])
		s.Outbox = append(s.Outbox[:0:0], s.Outbox[1:]...)
	}
	return dropped
}

func encodedSize(ev records.OpsEvent) int {
	b, _ := json.Marshal(ev)
	return len(b)
}

// Published removes the events with these ids from the outbox.
func (s *State) Published(ids map[string]bool) {
	kept := s.Outbox[:0:0]
	for _, ev := range s.Outbox {
		if !ids[ev.ID] {
			kept = append(kept, ev)
		}
	}
	if len(kept) == 0 {
		kept = nil
	}
	s.Outbox = kept
}
