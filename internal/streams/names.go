// Package streams holds the JetStream layout every part of webhook-operator agrees on: stream
// and bucket names, subjects, consumer names, and the code that creates them.
//
// The layout (with the default names):
//
//	WEBHOOKS              events, published by producers on webhooks.<namespace>.<event-type>
//	WEBHOOKS_DELIVERIES   one message per (event, endpoint) on whk.d.<namespace>.<endpoint>;
//	                      scheduled retries wait on whk.r.<namespace>.<endpoint>.<delivery-id>
//	                      and are published back onto whk.d.... by the server when due.
//	                      Work-queue retention: an acknowledged delivery is gone.
//	WEBHOOKS_ATTEMPTS     the delivery log, whk.log.<namespace>.<endpoint>, kept 30 days
//	WEBHOOKS_DLQ          dead letters, whk.dlq.<namespace>.<endpoint>.<delivery-id>, kept
//	webhook-operator      key-value bucket: health.<namespace>.<endpoint> (shared health and
//	                      circuit state), replay.<namespace>.<endpoint>.<key> (idempotent replays)
//
// Endpoint names may contain dots, which NATS uses as token separators; EndpointToken
// replaces them with underscores, which Kubernetes names never contain, so the mapping is
// one-to-one.
package streams

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Names are the configurable names of the streams, bucket and subject prefixes.
type Names struct {
	// EventsStream holds published events (default WEBHOOKS).
	EventsStream string
	// EventsSubjectPrefix is the first token of event subjects (default "webhooks").
	EventsSubjectPrefix string
	// DeliveriesStream holds per-endpoint deliveries and scheduled retries.
	DeliveriesStream string
	// AttemptsStream is the delivery log.
	AttemptsStream string
	// DeadLetterStream holds dead letters.
	DeadLetterStream string
	// Bucket is the key-value bucket for health, circuit state and replay keys.
	Bucket string
	// InternalPrefix is the first token of every subject the operator writes (default "whk").
	InternalPrefix string
}

// DefaultNames returns the default names.
func DefaultNames() Names {
	return Names{
		EventsStream:        "WEBHOOKS",
		EventsSubjectPrefix: "webhooks",
		DeliveriesStream:    "WEBHOOKS_DELIVERIES",
		AttemptsStream:      "WEBHOOKS_ATTEMPTS",
		DeadLetterStream:    "WEBHOOKS_DLQ",
		Bucket:              "webhook-operator",
		InternalPrefix:      "whk",
	}
}

// EndpointToken is an endpoint's name as one subject token: dots become underscores.
func EndpointToken(name string) string { return strings.ReplaceAll(name, ".", "_") }

// EndpointName reverses EndpointToken.
func EndpointName(token string) string { return strings.ReplaceAll(token, "_", ".") }

// EventSubject is where producers publish an event of eventType in namespace.
func (n Names) EventSubject(namespace, eventType string) string {
	return n.EventsSubjectPrefix + "." + namespace + "." + eventType
}

// EventsFilter matches every event of a namespace.
func (n Names) EventsFilter(namespace string) string {
	return n.EventsSubjectPrefix + "." + namespace + ".>"
}

// EventsSubjects are the events stream's subjects.
func (n Names) EventsSubjects() []string { return []string{n.EventsSubjectPrefix + ".>"} }

// EventType returns the event type of an event subject in namespace, or false.
func (n Names) EventType(subject, namespace string) (string, bool) {
	p := n.EventsSubjectPrefix + "." + namespace + "."
	if !strings.HasPrefix(subject, p) || len(subject) == len(p) {
		return "", false
	}
	return subject[len(p):], true
}

// DeliverySubject is the literal subject of one endpoint's deliveries.
func (n Names) DeliverySubject(namespace, endpoint string) string {
	return n.InternalPrefix + ".d." + namespace + "." + EndpointToken(endpoint)
}

// RetrySubject is where one delivery's scheduled retry waits until due.
func (n Names) RetrySubject(namespace, endpoint, deliveryID string) string {
	return n.InternalPrefix + ".r." + namespace + "." + EndpointToken(endpoint) + "." + deliveryID
}

// RetryFilter matches every scheduled retry of one endpoint.
func (n Names) RetryFilter(namespace, endpoint string) string {
	return n.InternalPrefix + ".r." + namespace + "." + EndpointToken(endpoint) + ".>"
}

// DeliveriesSubjects are the deliveries stream's subjects.
func (n Names) DeliveriesSubjects() []string {
	return []string{n.InternalPrefix + ".d.>", n.InternalPrefix + ".r.>"}
}

// AttemptSubject is one endpoint's delivery-log subject.
func (n Names) AttemptSubject(namespace, endpoint string) string {
	return n.InternalPrefix + ".log." + namespace + "." + EndpointToken(endpoint)
}

// AttemptsSubjects are the attempts stream's subjects.
func (n Names) AttemptsSubjects() []string { return []string{n.InternalPrefix + ".log.>"} }

// DeadLetterSubject is the subject of one dead letter.
func (n Names) DeadLetterSubject(namespace, endpoint, deliveryID string) string {
	return n.InternalPrefix + ".dlq." + namespace + "." + EndpointToken(endpoint) + "." + deliveryID
}

// DeadLetterFilter matches the dead letters of one endpoint, or of a whole namespace when
// endpoint is empty.
func (n Names) DeadLetterFilter(namespace, endpoint string) string {
	if endpoint == "" {
		return n.InternalPrefix + ".dlq." + namespace + ".>"
	}
	return n.InternalPrefix + ".dlq." + namespace + "." + EndpointToken(endpoint) + ".>"
}

// DeadLetterIDFilter matches the dead letter with deliveryID in namespace, whatever its endpoint.
func (n Names) DeadLetterIDFilter(namespace, deliveryID string) string {
	return n.InternalPrefix + ".dlq." + namespace + ".*." + deliveryID
}

// DeadLetterSubjects are the dead-letter stream's subjects.
func (n Names) DeadLetterSubjects() []string { return []string{n.InternalPrefix + ".dlq.>"} }

// HealthKey is the key-value key of one endpoint's shared health and circuit state.
func HealthKey(namespace, endpoint string) string {
	return "health." + namespace + "." + EndpointToken(endpoint)
}

// ReplayKey is the key-value key remembering one idempotent replay.
func ReplayKey(namespace, endpoint, idempotencyKey string) string {
	sum := sha256.Sum256([]byte(idempotencyKey))
	return "replay." + namespace + "." + EndpointToken(endpoint) + "." + hex.EncodeToString(sum[:12])
}

// maxConsumerName keeps consumer names short enough to be file names on any server.
const maxConsumerName = 200

func consumerName(prefix, namespace, endpoint string) string {
	name := prefix + namespace
	if endpoint != "" {
		name += "_" + EndpointToken(endpoint)
	}
	if len(name) <= maxConsumerName {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:maxConsumerName-17] + "-" + hex.EncodeToString(sum[:8])
}

// EndpointConsumer is the durable consumer delivering one endpoint.
func EndpointConsumer(namespace, endpoint string) string {
	return consumerName("ep_", namespace, endpoint)
}

// RouterConsumer is the durable consumer on the events stream of the router inside a
// dispatcher: the namespace's shared dispatcher (endpoint empty) or one endpoint's dedicated one.
func RouterConsumer(namespace, dedicatedEndpoint string) string {
	return consumerName("router_", namespace, dedicatedEndpoint)
}

// DrainConsumer is the temporary consumer the controller uses to move a deleted endpoint's
// deliveries to the dead-letter stream.
func DrainConsumer(namespace, endpoint string) string {
	return consumerName("drain_", namespace, endpoint)
}
