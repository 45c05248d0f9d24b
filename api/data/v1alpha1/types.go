package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DeliveryState is where a delivery stands.
type DeliveryState string

// The states of a delivery. The rule that decides a delivery's state from the streams is
// internal/deliveries' alone.
const (
	// StateQueued: waiting for its first attempt (in the events stream) or for its next one
	// (a copy in the deliveries stream: a replay, a test delivery, or held while the endpoint
	// cannot deliver: status.heldReason says why).
	StateQueued DeliveryState = "Queued"
	// StateInFlight: handed to a dispatcher, being attempted.
	StateInFlight DeliveryState = "InFlight"
	// StateRetryScheduled: an attempt failed; the next one is due at status.nextAttemptTime.
	StateRetryScheduled DeliveryState = "RetryScheduled"
	// StateSucceeded: delivered.
	StateSucceeded DeliveryState = "Succeeded"
	// StateDeadLettered: given up; status.deadLetterReason says why, and the dead letter is a
	// WebhookDeadLetter of the same name until it is purged.
	StateDeadLettered DeliveryState = "DeadLettered"
)

// States lists every DeliveryState.
var States = []DeliveryState{StateQueued, StateInFlight, StateRetryScheduled, StateSucceeded, StateDeadLettered}

// AnnotationPurgeEvent names, on a dead letter a delete or deletecollection returns, the
// operational event (webhook_operator.dlq.purged) that records its purge.
const AnnotationPurgeEvent = "data.webhook-operator.io/purge-event"

// MaxPurge bounds the dead letters one deletecollection of webhookdeadletters purges (and
// returns); a client purges more by asking again.
const MaxPurge = 10_000

// Reasons a queued delivery is held (status.heldReason).
const (
	HeldSuspended   = "Suspended"
	HeldCircuitOpen = "CircuitOpen"
	HeldDisabled    = "Disabled"
)

// Field selectors of webhookdeliveries (and, where they apply, webhookdeadletters). since and
// until bound the time a delivery reached its state (RFC 3339, or a duration back from now
// such as 1h); the others are exact.
const (
	FieldEndpoint  = "spec.endpoint"
	FieldEventID   = "spec.eventID"
	FieldEventType = "spec.eventType"
	FieldState     = "status.state"
	FieldReason    = "status.reason"
	FieldSince     = "since"
	FieldUntil     = "until"
	FieldName      = "metadata.name"
	FieldNamespace = "metadata.namespace"
	// FieldView=attempts lists every attempt of the delivery log instead of one item per
	// delivery: each item is its delivery as that attempt left it (status.attempts is the
	// attempt's number), so a delivery's name may appear several times in one list.
	FieldView = "view"
)

// ViewAttempts is the value of FieldView that lists attempts.
const ViewAttempts = "attempts"

// +genclient
// +kubebuilder:object:root=true

// WebhookDelivery is one delivery of an event to one endpoint: its name is the delivery id
// (whdl_...), its creation time when the delivery was created.
type WebhookDelivery struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WebhookDeliverySpec   `json:"spec"`
	Status WebhookDeliveryStatus `json:"status"`
}

// WebhookDeliverySpec is what is delivered where.
type WebhookDeliverySpec struct {
	// Endpoint is the WebhookEndpoint of the namespace the delivery is for.
	Endpoint string `json:"endpoint"`
	// EventID is the event's id (the receivers' webhook-id).
	EventID string `json:"eventID,omitempty"`
	// EventType is the event's type.
	EventType string `json:"eventType,omitempty"`
	// ReplayOf is the delivery this one replays.
	ReplayOf string `json:"replayOf,omitempty"`
	// Test is true for a one-shot test delivery (kubectl webhooks test).
	Test bool `json:"test,omitempty"`
}

// WebhookDeliveryStatus is where the delivery stands and what its attempts got.
type WebhookDeliveryStatus struct {
	// State of the delivery.
	State DeliveryState `json:"state"`
	// Time the delivery reached this state (when the message that says so was stored), to the
	// microsecond: the since and until field selectors compare with it.
	Time metav1.MicroTime `json:"time"`
	// HeldReason says why a queued delivery is held (Suspended, CircuitOpen, Disabled).
	HeldReason string `json:"heldReason,omitempty"`
	// Attempts made so far.
	Attempts int32 `json:"attempts"`
	// LastAttemptTime is when the last attempt started.
	LastAttemptTime *metav1.Time `json:"lastAttemptTime,omitempty"`
	// NextAttemptTime is when the next attempt is due (RetryScheduled).
	NextAttemptTime *metav1.Time `json:"nextAttemptTime,omitempty"`
	// Reason of the last failed attempt (status_code, timeout, connection_refused, ...).
	Reason string `json:"reason,omitempty"`
	// DeadLetterReason says why the delivery was given up (exhausted, endpoint_disabled, ...).
	DeadLetterReason string `json:"deadLetterReason,omitempty"`
	// LastResponse is what the last attempt got, without its body (the payload subresource
	// has it).
	LastResponse *Response `json:"lastResponse,omitempty"`
	// LatencyMicroseconds of the last attempt.
	LatencyMicroseconds *int64 `json:"latencyMicroseconds,omitempty"`
	// AttemptHistory lists the attempts known where the delivery's state was read, oldest
	// first (a retry's or a dead letter's full history; a finished delivery's last attempt).
	// +listType=atomic
	AttemptHistory []Attempt `json:"attemptHistory,omitempty"`
	// TraceID of the last attempt (W3C trace context), when it was traced.
	TraceID string `json:"traceID,omitempty"`
	// PayloadRemoved says why the payload is gone (expired, erased).
	PayloadRemoved string `json:"payloadRemoved,omitempty"`
}

// Response is what came back from the receiver, without its body.
type Response struct {
	// StatusCode of the response; 0 without one.
	StatusCode int32 `json:"statusCode,omitempty"`
	// Error of an attempt that got no response (bounded).
	Error string `json:"error,omitempty"`
	// BodyTruncated is true when the body kept (2 KB) is not all of it.
	BodyTruncated bool `json:"bodyTruncated,omitempty"`
}

// Attempt is one attempt of a delivery.
type Attempt struct {
	// Number of the attempt, from 1.
	Number int32 `json:"number"`
	// Time the attempt started.
	Time metav1.Time `json:"time"`
	// StatusCode of the response; 0 without one.
	StatusCode int32 `json:"statusCode,omitempty"`
	// DurationMicroseconds the attempt took.
	DurationMicroseconds int64 `json:"durationMicroseconds,omitempty"`
	// Reason of a failure; empty on success.
	Reason string `json:"reason,omitempty"`
	// Error gives detail of a failure (bounded).
	Error string `json:"error,omitempty"`
	// TraceID of the attempt, when it was traced.
	TraceID string `json:"traceID,omitempty"`
}

// +kubebuilder:object:root=true

// WebhookDeliveryList is a page of deliveries, newest first.
type WebhookDeliveryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WebhookDelivery `json:"items"`
}

// +genclient
// +kubebuilder:object:root=true

// WebhookDeadLetter is a delivery given up, kept until it is purged (deleted) or replayed:
// its name is the delivery id.
type WebhookDeadLetter struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WebhookDeliverySpec     `json:"spec"`
	Status WebhookDeadLetterStatus `json:"status"`
}

// WebhookDeadLetterStatus says why and when the delivery was given up, and every attempt.
type WebhookDeadLetterStatus struct {
	// Reason: exhausted, retry_duration_exceeded, test_failed, endpoint_disabled,
	// endpoint_deleted, payload_too_large, invalid_event, filter_failed, transform_failed.
	Reason string `json:"reason"`
	// Message explains the reason.
	Message string `json:"message,omitempty"`
	// EventTime is the event's time.
	EventTime *metav1.Time `json:"eventTime,omitempty"`
	// DeadLetteredTime is when the delivery was given up.
	DeadLetteredTime metav1.Time `json:"deadLetteredTime"`
	// Attempts made, oldest first.
	// +listType=atomic
	Attempts []Attempt `json:"attempts,omitempty"`
	// LastResponse of the last attempt, without its body.
	LastResponse *Response `json:"lastResponse,omitempty"`
	// PayloadBytes is the size of the stored event body.
	PayloadBytes int64 `json:"payloadBytes"`
	// PayloadTruncated is true when the stored body is not the whole event (it cannot be
	// replayed).
	PayloadTruncated bool `json:"payloadTruncated,omitempty"`
	// PayloadRemoved says why the payload is gone (expired, erased); it cannot be replayed.
	PayloadRemoved string `json:"payloadRemoved,omitempty"`
	// PayloadRemovedTime is when the payload was removed.
	PayloadRemovedTime *metav1.Time `json:"payloadRemovedTime,omitempty"`
	// EventSequence is the event's sequence in its events stream, when known.
	EventSequence int64 `json:"eventSequence,omitempty"`
	// Sequence of the dead letter in the namespace's dead-letter stream.
	Sequence int64 `json:"sequence"`
}

// +kubebuilder:object:root=true

// WebhookDeadLetterList is a page of dead letters, newest first.
type WebhookDeadLetterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WebhookDeadLetter `json:"items"`
}

// +genclient
// +kubebuilder:object:root=true

// WebhookEvent is an event to publish into the namespace's events stream: its name is the
// event id, which de-duplicates a retried create. Creating one is publishing it, with the
// rules and answers of the HTTP ingress.
type WebhookEvent struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WebhookEventSpec   `json:"spec"`
	Status WebhookEventStatus `json:"status,omitempty"`
}

// WebhookEventSpec is the event.
type WebhookEventSpec struct {
	// Type is the event type, e.g. order.created.
	Type string `json:"type"`
	// Data is the event's body, any JSON value.
	// +kubebuilder:pruning:PreserveUnknownFields
	Data runtime.RawExtension `json:"data"`
	// Time is the event's time (RFC 3339); default: when it is stored.
	Time string `json:"time,omitempty"`
	// Subject is what the event is about (CloudEvents' subject).
	Subject string `json:"subject,omitempty"`
	// OrderingKey orders the events of one key for a PerKey endpoint.
	OrderingKey string `json:"orderingKey,omitempty"`
	// Headers are forwarded to receivers.
	Headers map[string]string `json:"headers,omitempty"`
}

// WebhookEventStatus is where the event was stored.
type WebhookEventStatus struct {
	// Stream and Sequence are where JetStream stored it.
	Stream   string `json:"stream,omitempty"`
	Sequence int64  `json:"sequence,omitempty"`
	// Duplicate: an event of this id was already stored within the duplicate window.
	Duplicate bool `json:"duplicate,omitempty"`
}

// +kubebuilder:object:root=true

// WebhookEventList is the list kind of WebhookEvent (the API lists no events).
type WebhookEventList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WebhookEvent `json:"items"`
}

// +kubebuilder:object:root=true

// DeliveryPayload is the personal data of a delivery or a dead letter, read through their
// payload subresource under its own RBAC: the event's body and headers, the request headers
// as sent (secrets redacted) and the last response's body.
type DeliveryPayload struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Endpoint the delivery is for.
	Endpoint string `json:"endpoint"`
	// Event is the event's body as stored; absent when it could not be found (its event no
	// longer in the events stream) or was removed.
	Event *Body `json:"event,omitempty"`
	// EventHeaders are the event's headers as published.
	EventHeaders map[string][]string `json:"eventHeaders,omitempty"`
	// RequestHeaders of the last attempt as sent, signatures and secrets redacted.
	RequestHeaders map[string]string `json:"requestHeaders,omitempty"`
	// Response is the last response's body (at most 2 KB).
	Response *Body `json:"response,omitempty"`
	// Removed says why the payload is gone (expired, erased).
	Removed string `json:"removed,omitempty"`
}

// Body is a stored body: JSON as it is, anything else as text.
type Body struct {
	// JSON is the body when it is JSON.
	// +kubebuilder:pruning:PreserveUnknownFields
	JSON *runtime.RawExtension `json:"json,omitempty"`
	// Text is the body when it is not JSON (invalid UTF-8 replaced).
	Text string `json:"text,omitempty"`
	// Bytes is the body's size.
	Bytes int64 `json:"bytes"`
	// Truncated is true when the stored body is not all of it.
	Truncated bool `json:"truncated,omitempty"`
}
