package v1alpha1

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// Decimal is a number users write as a YAML or JSON number, e.g. 2 or 1.5. Go holds its text,
// so the API carries no float and the value round-trips exactly; Float64 reads it. Reading
// also accepts the number quoted ("1.5"), as objects stored before the field became a number
// hold it; the API server accepts only the number.
// +kubebuilder:validation:Type=number
type Decimal string

// Float64 is the number, or an error for text that is not a finite decimal number.
func (d Decimal) Float64() (float64, error) {
	f, err := strconv.ParseFloat(string(d), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%q is not a decimal number", string(d))
	}
	return f, nil
}

// MarshalJSON writes the number as a JSON number.
func (d Decimal) MarshalJSON() ([]byte, error) {
	f, err := d.Float64()
	if err != nil {
		return nil, err
	}
	return []byte(strconv.FormatFloat(f, 'f', -1, 64)), nil
}

// UnmarshalJSON reads a JSON number, or a string holding one.
func (d *Decimal) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	text := string(b)
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &text); err != nil {
			return err
		}
	}
	if _, err := Decimal(text).Float64(); err != nil {
		return err
	}
	*d = Decimal(text)
	return nil
}

// LocalObjectReference names an object in the same namespace.
type LocalObjectReference struct {
	// Name of the referenced object.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// SecretKeySelector selects one key of a Secret in the same namespace.
type SecretKeySelector struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Key within the Secret's data.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// Condition types used on both kinds.
const (
	// ConditionReady is True when the object is fully wired and able to do its job.
	ConditionReady = "Ready"
	// ConditionDisabled is True when the dispatcher has auto-disabled the endpoint.
	ConditionDisabled = "Disabled"
	// ConditionCircuitOpen is True while the endpoint's circuit breaker is open or half-open.
	ConditionCircuitOpen = "CircuitOpen"
	// ConditionReconciling is True while the controller waits for something to become ready
	// (kstatus: InProgress). It is removed when there is nothing left to wait for.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when the controller cannot make progress until the object or the
	// installation's configuration changes (kstatus: Failed). It is removed otherwise.
	ConditionStalled = "Stalled"
	// ConditionStorageLimitReached is True when the namespace's dead-letter stream is full or
	// nearly so (new dead letters are refused), or its delivery log is at its size bound (the
	// oldest records go before their age). The controller sets it on every endpoint of the
	// namespace; it is a warning and leaves Ready as it is.
	ConditionStorageLimitReached = "StorageLimitReached"
	// ConditionDispatcherCapped is True while the installation's caps change what the endpoint
	// asks of its dedicated dispatcher (spec.dispatcher.replicas or .resources above them): the
	// dispatcher runs at the caps. A warning beside Ready, removed when nothing is capped.
	ConditionDispatcherCapped = "DispatcherCapped"
)

// Reasons of the Ready condition, each something a user can act on.
const (
	ReasonReady                 = "Ready"
	ReasonReconciling           = "Reconciling"
	ReasonRetryPolicyNotFound   = "RetryPolicyNotFound"
	ReasonSigningSecretNotFound = "SigningSecretNotFound"
	ReasonSecretNotFound        = "SecretNotFound"
	ReasonSecretNotAllowed      = "SecretNotAllowed"
	ReasonInvalidURL            = "InvalidURL"
	ReasonNATSUnavailable       = "NATSUnavailable"
	// ReasonInsufficientStorage: the NATS servers have no room left to reserve the
	// namespace's stream bounds (max_file_store or the account's storage limit is spent).
	ReasonInsufficientStorage   = "InsufficientStorage"
	ReasonDispatcherUnavailable = "DispatcherUnavailable"
	ReasonSuspended             = "Suspended"
	ReasonSourceNotAllowed      = "SourceNotAllowed"
	// ReasonSourceGrantFull: the endpoint's consumers on source namespaces do not fit in its
	// dispatcher's bus grant.
	ReasonSourceGrantFull  = "SourceGrantFull"
	ReasonInvalidSpec      = "InvalidSpec"
	ReasonInvalidFilter    = "InvalidFilter"
	ReasonInvalidTransform = "InvalidTransform"
	ReasonDeleting         = "Deleting"
	// ReasonNamespaceExcluded: the endpoint is in a namespace the installation keeps the
	// controller out of (kube-system and the like, and the operator's own); nothing is wired.
	ReasonNamespaceExcluded = "NamespaceExcluded"
)

// ReasonInstallationCap is the reason of the DispatcherCapped condition.
const ReasonInstallationCap = "InstallationCap"

// Reasons of the StorageLimitReached condition.
const (
	ReasonWithinLimits         = "WithinLimits"
	ReasonDeadLetterStreamFull = "DeadLetterStreamFull"
	ReasonDeliveryLogAtLimit   = "DeliveryLogAtLimit"
	// ReasonDeliveriesStreamFull: the deliveries stream is at its hold threshold (80% of its
	// bound): held events stay in the events stream.
	ReasonDeliveriesStreamFull = "DeliveriesStreamFull"
)

// Reasons of the Disabled and CircuitOpen conditions, written by the dispatcher.
const (
	ReasonEnabled             = "Enabled"
	ReasonConsecutiveFailures = "ConsecutiveFailures"
	ReasonFailureRate         = "FailureRate"
	ReasonCircuitClosed       = "Closed"
	ReasonCircuitOpen         = "Open"
	ReasonCircuitHalfOpen     = "HalfOpen"
)

// Annotations the operator reads.
const (
	// AnnotationEnable re-enables an auto-disabled endpoint. Its value is an RFC 3339 time;
	// when it is later than the time the endpoint was disabled, the dispatcher re-enables the
	// endpoint, resets its failure counters and closes its circuit. `kubectl webhooks enable`
	// sets it to the current time.
	AnnotationEnable = "webhook-operator.io/enabled-at"

	// AnnotationTTLAfterComplete on a WebhookReplay overrides, for that replay, how long the
	// controller keeps it once complete (the controller's --replay-ttl): a duration such as
	// 30m or 168h; "0" keeps it until it is deleted.
	AnnotationTTLAfterComplete = "webhook-operator.io/ttl-after-complete"
)
