package records

import (
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// EventDelivery is the delivery of a published event to endpoint of namespace reader, read from
// the event itself, as the dispatcher delivers it straight from the events stream: the event's
// id (the producer's Nats-Msg-Id, or one derived from where it is stored), type (the subject
// after <subjectPrefix>.<namespace>.), time (its Webhook-Event-Time header, else when it was
// stored), sequence, and a delivery id naming event, reader and endpoint. An event a
// dispatcher holds in the deliveries stream (NewDelivery with this meta) keeps that id, so
// holding it there and delivering it are one delivery. An event of another namespace (a
// source namespace) is told apart from one of the same id in reader's namespace.
//
// invalid says why the event cannot be delivered as published (InvalidEvent), or ""; its
// delivery id then names where it is stored, since its id may be what is wrong. ok is false
// when subject is not an event subject.
func EventDelivery(subject, subjectPrefix, stream string, seq uint64, stored time.Time, h nats.Header, reader, endpoint string) (m DeliveryMeta, invalid string, ok bool) {
	rest, ok := strings.CutPrefix(subject, subjectPrefix+".")
	if !ok {
		return m, "", false
	}
	ns, eventType, ok := strings.Cut(rest, ".")
	if !ok || eventType == "" {
		return m, "", false
	}
	id := EventID(stream, seq, h)
	m = DeliveryMeta{EventID: id, EventType: eventType, EventTime: EventTime(h, stored), EventSeq: seq, Namespace: reader, Endpoint: endpoint, Created: stored}
	if invalid = InvalidEvent(id, eventType, h); invalid != "" {
		m.DeliveryID = DeliveryIDAt(stream, seq, endpoint)
		return m, invalid, true
	}
	idOf := id
	if ns != reader {
		idOf = ns + "/" + id
	}
	m.DeliveryID = DeliveryID(idOf, reader, endpoint)
	return m, "", true
}

// DeadLetterOf is the dead letter of a delivery whose message has header h (an event's or a
// delivery's) and whose metadata is m (which wins over what h says).
func DeadLetterOf(h nats.Header, m DeliveryMeta, reason, message string, last *Response, now time.Time) DeadLetter {
	out := make(nats.Header, len(h)+12)
	CopyEventHeaders(out, h)
	SetDeliveryMeta(out, m)
	return NewDeadLetter(out, reason, message, last, now)
}
