// Package records is the one owner of what webhook-operator writes into JetStream and reads
// back: the delivery message of an event for one endpoint (NewDelivery: producer headers
// copied one way, forged Whk-* and Nats-* headers stripped, delivery metadata set), the
// dead letter of a delivery (NewDeadLetter, Identify for one without an id,
// DeadLetterMessage that always fits the server's maximum payload), and the delivery-log
// record of an outcome (LogMessage, with a message id that makes a re-write after a crash a
// duplicate). Every receiver- or producer-supplied string is bounded before it is stored,
// and URLs in stored errors are redacted (bounds.go); InvalidEvent refuses when an event is
// taken what a request could not carry. The dispatcher's workers, the controller's
// finalizer drain and the kubectl plugin's replay all write through this package, so they
// never disagree.
package records

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"strings"
	"time"
)

// Headers the producer may set on a published event.
const (
	// HeaderMsgID is JetStream's de-duplication header; a producer sets it to its event id.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderContentType is forwarded to the receiver (default application/json).
	HeaderContentType = "Content-Type"
	// HeaderEventTime is the event's time (RFC 3339); defaults to the publish time.
	HeaderEventTime = "Webhook-Event-Time"
	// HeaderTraceParent and HeaderTraceState carry W3C trace context to the receiver.
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
	// HeaderCEPrefix starts the headers of an event's CloudEvents attributes other than id
	// (Nats-Msg-Id), type (the subject), time (Webhook-Event-Time) and datacontenttype
	// (Content-Type): ce-source, ce-subject, ce-dataschema and extensions such as
	// ce-partitionkey, as the CloudEvents NATS binding's binary mode names them. They are
	// not forwarded to receivers as headers: an endpoint of format CloudEvents gets them as
	// attributes (internal/cloudevent).
	HeaderCEPrefix = "Ce-"
)

// Headers the operator writes on delivery messages (never sent to receivers).
const (
	HDeliveryID = "Whk-Delivery-Id"
	HEventID    = "Whk-Event-Id"
	HEventType  = "Whk-Event-Type"
	HEventTime  = "Whk-Event-Time"
	HEventSeq   = "Whk-Event-Seq"
	// HEventNamespace names the source namespace an event of another namespace came from
	// (DeliveryMeta.EventNamespace).
	HEventNamespace = "Whk-Event-Namespace"
	HNamespace      = "Whk-Namespace"
	HEndpoint       = "Whk-Endpoint"
	HCreated        = "Whk-Created"
	HAttempts       = "Whk-Attempts"
	HHistory        = "Whk-History"
	HReplayOf       = "Whk-Replay-Of"
	HOrderingKey    = "Whk-Ordering-Key"
	// HTest marks a one-shot test delivery (`kubectl webhooks test`): one attempt, no retries,
	// dead-lettered as test_failed when it fails.
	HTest = "Whk-Test"
	// HRedelivered marks a delivery copied from a message delivered more than once (see
	// DeliveryMeta.Redelivered).
	HRedelivered = "Whk-Redelivered"
	// HRetainFrom is when a payload's retention counts from, on a delivery or a dead letter
	// whose payload was stored before it: a replay of a dead letter carries the original's
	// (DeliveryMeta.RetainFrom), so that a dead letter written of it keeps the original's
	// retention deadline.
	HRetainFrom = "Whk-Retain-From"
)

// Headers sent to receivers.
const (
	// Standard Webhooks.
	SendID        = "webhook-id"
	SendTimestamp = "webhook-timestamp"
	SendSignature = "webhook-signature"
	// webhook-operator's own.
	SendAttempt   = "webhook-attempt"
	SendEventType = "webhook-event-type"
	SendEventTime = "webhook-event-time"
	SendSequence  = "webhook-sequence"
	// SendSourceNamespace is the namespace the event was published in: the endpoint's own,
	// or one of its spec.sourceNamespaces. No producer header reaches a receiver under a
	// webhook- name (ForwardedHeaders), so a receiver can trust it.
	SendSourceNamespace = "webhook-source-namespace"
	SendReplayOf        = "webhook-replay-of"
	// Aliases that receivers written for seed 001's CRM already read.
	SendLegacyEventID = "X-Webhook-Event-Id"
	SendLegacyAttempt = "X-Webhook-Delivery-Attempt"
)

// Delivery states, as the delivery log reports them (seed 002).
const (
	StatePending    = "pending"
	StateAttempting = "attempting"
	StateSucceeded  = "succeeded"
	StateFailed     = "failed"
	StateDeadLetter = "dead_letter"
)

// Reasons a delivery is dead-lettered.
const (
	ReasonExhausted        = "exhausted"
	ReasonEndpointDisabled = "endpoint_disabled"
	ReasonEndpointDeleted  = "endpoint_deleted"
	ReasonPayloadTooLarge  = "payload_too_large"
	ReasonInvalidEvent     = "invalid_event"
	// ReasonRetryDurationExceeded: the next attempt would have started later than the retry
	// policy's maxRetryDuration after the delivery was created.
	ReasonRetryDurationExceeded = "retry_duration_exceeded"
	// ReasonTestFailed: the one attempt of a test delivery failed.
	ReasonTestFailed = "test_failed"
	// ReasonFilterFailed: the endpoint's filter could not decide on the event (an error
	// evaluating it, e.g. a field the event lacks).
	ReasonFilterFailed = "filter_failed"
	// ReasonTransformFailed: the endpoint's transformation failed on the event.
	ReasonTransformFailed = "transform_failed"
)

// Reasons an attempt failed.
const (
	FailStatusCode     = "status_code"
	FailRedirect       = "redirect"
	FailTimeout        = "timeout"
	FailConnRefused    = "connection_refused"
	FailConnReset      = "connection_reset"
	FailDNS            = "dns"
	FailTLS            = "tls"
	FailBlockedAddress = "blocked_address"
	FailNetwork        = "network"
	// FailResponseHeaders: the receiver's response headers were larger than the dispatcher
	// reads (MaxResponseHeaderBytes); the attempt failed and is retried like any other.
	FailResponseHeaders = "response_headers_too_large"
	FailRequest         = "invalid_request"
	FailConfig          = "configuration"
	// FailAuth: the token spec.auth asks for could not be had (the token endpoint refused,
	// failed, was unreachable or refused by the outbound guard; the key did not sign). Nothing
	// was sent to the receiver; retried like any failure.
	FailAuth = "auth_failed"
	// FailProxy: the egress proxy could not be reached, asked for credentials or refused the
	// tunnel. Nothing reached the receiver; retried like any failure.
	FailProxy = "proxy"
)

// MaxResponseBody is how much of a response body is kept (2 KB, seed 002).
const MaxResponseBody = 2048

// MaxResponseHeaderBytes bounds a receiver's response headers (64 KiB, where Go's default is
// 10 MiB): a response with more fails its attempt as FailResponseHeaders.
const MaxResponseHeaderBytes = 64 << 10

// DeliveryIDPrefix starts every delivery id (seed 002 uses whdl_).
const DeliveryIDPrefix = "whdl_"

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// DeliveryID is the deterministic id of the delivery of eventID to namespace/endpoint, so a
// dispatcher that holds an event twice writes the same delivery twice and JetStream keeps one,
// and the delivery of an event and its held copy are one delivery.
func DeliveryID(eventID, namespace, endpoint string) string {
	return hashID(eventID, namespace, endpoint)
}

// ReplayDeliveryID is the id of the replay of originalID; the same idempotency key always
// gives the same id.
func ReplayDeliveryID(originalID, idempotencyKey string) string {
	return hashID("replay", originalID, idempotencyKey)
}

func hashID(parts ...string) string {
	// On the stack, for a delivery of every event: one allocation, the id itself.
	var in [256]byte
	b := in[:0]
	for _, p := range parts {
		b = append(b, p...)
		b = append(b, 0)
	}
	sum := sha256.Sum256(b)
	var out [len(DeliveryIDPrefix) + 26]byte
	copy(out[:], DeliveryIDPrefix)
	idEncoding.Encode(out[len(DeliveryIDPrefix):], sum[:16])
	return string(out[:])
}

// IsDeliveryID reports whether s looks like a delivery id.
func IsDeliveryID(s string) bool {
	if !strings.HasPrefix(s, DeliveryIDPrefix) || len(s) != len(DeliveryIDPrefix)+26 {
		return false
	}
	for _, c := range s[len(DeliveryIDPrefix):] {
		if !strings.ContainsRune("0123456789abcdefghjkmnpqrstvwxyz", c) {
			return false
		}
	}
	return true
}

// Attempt is one attempt, as kept in a delivery's history and in dead letters.
type Attempt struct {
	// N is the 1-based attempt number.
	N int `json:"n"`
	// Time the attempt started.
	Time time.Time `json:"time"`
	// StatusCode of the response, 0 without one.
	StatusCode int `json:"statusCode,omitempty"`
	// LatencyMS of the attempt, in whole milliseconds (kept for readers of older records).
	LatencyMS int64 `json:"latencyMs"`
	// LatencyUS of the attempt, in microseconds; 0 in records written before it existed.
	LatencyUS int64 `json:"latencyUs,omitempty"`
	// Reason of a failure (see Fail*), empty on success.
	Reason string `json:"reason,omitempty"`
	// Error gives detail of a failure.
	Error string `json:"error,omitempty"`
}

// EncodeHistory encodes a delivery's attempt history for the HHistory header.
func EncodeHistory(h []Attempt) string {
	if len(h) == 0 {
		return ""
	}
	b, _ := json.Marshal(h)
	return string(b)
}

// DecodeHistory decodes the HHistory header; a damaged header yields what could be read.
func DecodeHistory(s string) []Attempt {
	if s == "" {
		return nil
	}
	var h []Attempt
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil
	}
	return h
}

// Response is what came back from the receiver.
type Response struct {
	StatusCode int `json:"statusCode,omitempty"`
	// Body, cut to MaxResponseBody bytes.
	Body string `json:"body,omitempty"`
	// Truncated is true when Body was cut.
	Truncated bool `json:"truncated,omitempty"`
	// Error of a failed attempt without a response.
	Error string `json:"error,omitempty"`
}

// LogRecord is one entry of the delivery log: one attempt of one delivery and the delivery's
// state after it.
type LogRecord struct {
	DeliveryID string `json:"deliveryId"`
	EventID    string `json:"eventId"`
	EventType  string `json:"eventType"`
	// EventSeq is the event's sequence in the namespace's events stream, where a recover
	// (a WebhookReplay of the delivery log) finds its body; 0 in records written before it
	// existed.
	EventSeq uint64 `json:"eventSeq,omitempty"`
	// EventNamespace is the source namespace of an event of another namespace (its EventSeq
	// counts in that namespace's events stream); empty for the namespace's own events.
	EventNamespace string `json:"eventNamespace,omitempty"`
	Namespace      string `json:"namespace"`
	Endpoint       string `json:"endpoint"`
	// State after this attempt: succeeded, failed (a retry is scheduled), dead_letter.
	State string `json:"state"`
	// Attempt number (1-based); Attempts is the same, kept for seed 002's field name.
	Attempt int `json:"attempt"`
	// Time the attempt started.
	Time time.Time `json:"time"`
	// LatencyMS of the attempt, in whole milliseconds (kept for readers of older records).
	LatencyMS int64 `json:"latencyMs"`
	// LatencyUS of the attempt, in microseconds; 0 in records written before it existed.
	LatencyUS int64 `json:"latencyUs,omitempty"`
	// Reason of a failure.
	Reason string `json:"reason,omitempty"`
	// Request headers as sent, without secrets (signatures and headersFrom values redacted).
	RequestHeaders map[string]string `json:"requestHeaders,omitempty"`
	// Response of the attempt.
	Response Response `json:"response"`
	// NextAttemptAt when a retry is scheduled.
	NextAttemptAt *time.Time `json:"nextAttemptAt,omitempty"`
	// ReplayOf points at the original delivery of a replay.
	ReplayOf string `json:"replayOf,omitempty"`
	// DeadLetterReason when State is dead_letter.
	DeadLetterReason string `json:"deadLetterReason,omitempty"`
	// Test is true for a one-shot test delivery (`kubectl webhooks test`).
	Test bool `json:"test,omitempty"`
	// PayloadRemoved says why the record no longer has its payload (the request headers and
	// the response body): PayloadExpired (the endpoint's retention) or PayloadErased (a
	// WebhookErasure); empty while it has it.
	PayloadRemoved string `json:"payloadRemoved,omitempty"`
}

// DeadLetter is a delivery that will not be attempted again, with everything needed to
// understand and replay it. The event's payload is the dead-letter message's body.
type DeadLetter struct {
	DeliveryID string    `json:"deliveryId"`
	EventID    string    `json:"eventId"`
	EventType  string    `json:"eventType"`
	EventTime  time.Time `json:"eventTime"`
	// EventSeq is the event's sequence in the events stream.
	EventSeq uint64 `json:"eventSeq,omitempty"`
	// EventNamespace is the source namespace of an event of another namespace (its EventSeq
	// counts in that namespace's events stream); empty for the namespace's own events.
	EventNamespace string `json:"eventNamespace,omitempty"`
	Namespace      string `json:"namespace"`
	Endpoint       string `json:"endpoint"`
	// Reason: exhausted, retry_duration_exceeded, test_failed, endpoint_disabled,
	// endpoint_deleted, payload_too_large, invalid_event.
	Reason string `json:"reason"`
	// Message explains the reason.
	Message string `json:"message,omitempty"`
	// Attempts made, in order, with time, status code, latency and error.
	Attempts []Attempt `json:"attempts"`
	// LastResponse of the last attempt (body cut at 2 KB).
	LastResponse *Response `json:"lastResponse,omitempty"`
	// Headers of the event as published (Content-Type, trace context, producer headers).
	Headers map[string][]string `json:"headers,omitempty"`
	// PayloadTruncated is true when the stored body is not the whole event.
	PayloadTruncated bool `json:"payloadTruncated,omitempty"`
	// CreatedAt is when the delivery was created; DeadLetteredAt when it was given up.
	CreatedAt      time.Time `json:"createdAt"`
	DeadLetteredAt time.Time `json:"deadLetteredAt"`
	// ReplayOf points at the original delivery when this one was a replay.
	ReplayOf string `json:"replayOf,omitempty"`
	// RetainFrom is when the payload's retention counts from when that is before the dead
	// letter was stored: a replay's dead letter keeps the original dead letter's.
	RetainFrom *time.Time `json:"retainFrom,omitempty"`
	// PayloadRemoved says why the dead letter no longer has its payload (the event's body and
	// headers, the last response's body): PayloadExpired or PayloadErased; empty while it has
	// it. Such a dead letter cannot be replayed.
	PayloadRemoved string `json:"payloadRemoved,omitempty"`
	// PayloadRemovedAt is when it was removed.
	PayloadRemovedAt *time.Time `json:"payloadRemovedAt,omitempty"`
}

// HDeadLetter carries the JSON-encoded DeadLetter on a dead-letter message.
const HDeadLetter = "Whk-Dead-Letter"

// CutBody keeps at most MaxResponseBody bytes of b, without splitting a UTF-8 sequence.
func CutBody(b []byte) (string, bool) {
	if len(b) <= MaxResponseBody {
		return string(b), false
	}
	cut := MaxResponseBody
	for cut > 0 && cut > MaxResponseBody-4 && b[cut]&0xC0 == 0x80 {
		cut--
	}
	return string(b[:cut]), true
}
