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
		m.EventNamespace = ns
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

// Origin is the namespace the delivery's event was published in: its source namespace, or the
// delivery's own.
func (m DeliveryMeta) Origin() string {
	if m.EventNamespace != "" {
		return m.EventNamespace
	}
	return m.Namespace
}

// WebhookID is the webhook-id a receiver gets for the delivery's event, the same on every
// attempt, retry and replay of it: the event's id for an event of the endpoint's own namespace
// (nothing changes for the common case), "<namespace>/<id>" for one of a source namespace.
// So that no id of one event can be the id of another, a '%' or '/' in an event id is
// percent-encoded (%25, %2F): an own event's webhook-id never holds a '/', a source event's
// holds exactly one, after its namespace (a DNS label).
func (m DeliveryMeta) WebhookID() string {
	id := m.EventID
	if strings.ContainsAny(id, "%/") {
		id = idEscaper.Replace(id)
	}
	if m.EventNamespace == "" {
		return id
	}
	return m.EventNamespace + "/" + id
}

var idEscaper = strings.NewReplacer("%", "%25", "/", "%2F")
