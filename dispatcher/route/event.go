package route

import (
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// event is what the router reads from a published event.
type event struct {
	namespace, eventType, eventID string
	// invalid says why the event cannot be delivered, if it cannot.
	invalid   string
	eventTime time.Time
	stream    string
	seq       uint64
	// ops says the event is an operational event (records.OpsTypePrefix), about the endpoint
	// it is about.
	ops   bool
	about string
}

// parseEvent reads an event's namespace, type, id and time from its subject and headers, and
// checks at ingest what would become part of a request (records.InvalidEvent).
func parseEvent(msg jetstream.Msg, subjectPrefix string) (event, bool) {
	rest, ok := strings.CutPrefix(msg.Subject(), subjectPrefix+".")
	if !ok {
		return event{}, false
	}
	ns, eventType, ok := strings.Cut(rest, ".")
	if !ok || eventType == "" {
		return event{}, false
	}
	md, err := msg.Metadata()
	if err != nil {
		return event{}, false
	}
	ev := event{namespace: ns, eventType: eventType, eventTime: md.Timestamp, stream: md.Stream, seq: md.Sequence.Stream}
	h := msg.Headers()
	ev.eventID = records.EventID(md.Stream, md.Sequence.Stream, h)
	ev.invalid = records.InvalidEvent(ev.eventID, eventType, h)
	ev.eventTime = records.EventTime(h, md.Timestamp)
	if records.IsOpsType(eventType) {
		ev.ops, ev.about = true, h.Get(records.HOpsEndpoint)
	}
	return ev, true
}

// receivesOps says whether endpoint ep (with event-type patterns) receives operational event
// ev of namespace own: only when a pattern names the operational types explicitly (its first
// token is webhook_operator: a catch-all such as > or *.created does not receive them), and
// never an event about ep itself, so an endpoint failing to deliver operational events does
// not feed on its own failures.
func receivesOps(ev *event, own, ep string, patterns []string) bool {
	if ev.about == ep && ev.namespace == own {
		return false
	}
	for _, p := range patterns {
		if p == records.OpsTypePrefix || strings.HasPrefix(p, records.OpsTypePrefix+".") {
			return true
		}
	}
	return false
}
