package v1alpha1

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
	ReasonDispatcherUnavailable = "DispatcherUnavailable"
	ReasonSuspended             = "Suspended"
	ReasonSourceNotAllowed      = "SourceNotAllowed"
	ReasonInvalidSpec           = "InvalidSpec"
	ReasonDeleting              = "Deleting"
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
)
