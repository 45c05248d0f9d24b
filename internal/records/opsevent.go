package records

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Operational events: what a platform wants to react to (an endpoint disabled or re-enabled,
// a circuit opened, half-open or closed, deliveries dead-lettered, a replay completed, dead
// letters purged),
// published by webhook-operator as ordinary events of the namespace, on
// webhooks.<namespace>.webhook_operator.<what>, so an endpoint whose eventTypes name them
// (webhook_operator.>) delivers them like any other event.
const (
	// OpsTypePrefix is the first token of every operational event type. Producers must not
	// publish events of these types (deny webhooks.*.webhook_operator.> in NATS permissions).
	OpsTypePrefix = "webhook_operator"

	OpsEndpointDisabled     = OpsTypePrefix + ".endpoint.disabled"
	OpsEndpointEnabled      = OpsTypePrefix + ".endpoint.enabled"
	OpsCircuitOpened        = OpsTypePrefix + ".circuit.opened"
	OpsCircuitHalfOpen      = OpsTypePrefix + ".circuit.half_open"
	OpsCircuitClosed        = OpsTypePrefix + ".circuit.closed"
	OpsDeliveryDeadLettered = OpsTypePrefix + ".delivery.dead_lettered"
	OpsReplayCompleted      = OpsTypePrefix + ".replay.completed"
	// OpsErasureCompleted: a WebhookErasure completed (its name and counts).
	OpsErasureCompleted = OpsTypePrefix + ".erasure.completed"
	// OpsDeadLettersPurged records a purge of dead letters (kubectl webhooks dlq purge),
	// published by the purger itself: the one operational event a tenant's identity (one
	// allowed to delete webhookdeliveries) may publish.
	OpsDeadLettersPurged = OpsTypePrefix + ".dlq.purged"
)

// HOpsEndpoint names, on an operational event, the endpoint it is about: a dispatcher never
// delivers it to that endpoint. Like every Whk-* header it never reaches a receiver.
const HOpsEndpoint = "Whk-Ops-Endpoint"

// OpsSpecVersion is the CloudEvents version whose attribute names OpsEvent follows.
const OpsSpecVersion = "1.0"

// IsOpsType reports whether an event type is an operational event's.
func IsOpsType(eventType string) bool {
	return strings.HasPrefix(eventType, OpsTypePrefix+".")
}

// OpsEvent is one operational event, CloudEvents-like: the body of the message and the
// payload a subscribed endpoint receives.
type OpsEvent struct {
	SpecVersion string `json:"specversion"`
	// ID is unique within the namespace and derived from what happened (the endpoint, the
	// kind of change and its time or log sequence), never random: it is the message id, so a
	// publish repeated after a crash is a duplicate JetStream drops.
	ID   string `json:"id"`
	Type string `json:"type"`
	// Source is webhook-operator/<namespace>/<endpoint>.
	Source    string    `json:"source"`
	Time      time.Time `json:"time"`
	Namespace string    `json:"namespace"`
	Endpoint  string    `json:"endpoint"`
	// Data depends on the type (see docs/operational-events.md); values are bounded.
	Data map[string]any `json:"data"`
}

// NewOpsEvent makes an operational event of type typ about endpoint ep; key says what
// happened uniquely within the endpoint and type (a time, a log sequence) and makes its id.
func NewOpsEvent(namespace, ep, typ, key string, at time.Time, data map[string]any) OpsEvent {
	if data == nil {
		data = map[string]any{}
	}
	return OpsEvent{SpecVersion: OpsSpecVersion, ID: "whop_" + strings.TrimPrefix(hashID(namespace, ep, typ, key), DeliveryIDPrefix),
		Type: typ, Source: "webhook-operator/" + namespace + "/" + ep, Time: at.UTC(), Namespace: namespace, Endpoint: ep, Data: data}
}

// OpsEventMessage is the message publishing ev on subject (the namespace's event subject of
// ev.Type), with ev.ID as the message id.
func OpsEventMessage(subject string, ev OpsEvent) (*nats.Msg, error) {
	b, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	m := &nats.Msg{Subject: subject, Data: b, Header: nats.Header{}}
	m.Header.Set(HeaderMsgID, ev.ID)
	m.Header.Set(HeaderContentType, "application/json")
	m.Header.Set(HeaderEventTime, ev.Time.Format(time.RFC3339Nano))
	if ev.Endpoint != "" {
		m.Header.Set(HOpsEndpoint, ev.Endpoint)
	}
	return m, nil
}
