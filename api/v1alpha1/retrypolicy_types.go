package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BackoffStrategy is how the wait grows between attempts.
// +kubebuilder:validation:Enum=Exponential;Linear
type BackoffStrategy string

const (
	// BackoffExponential waits initialInterval * factor^(n-1) before retry n, up to maxInterval.
	BackoffExponential BackoffStrategy = "Exponential"
	// BackoffLinear waits initialInterval * n before retry n, up to maxInterval.
	BackoffLinear BackoffStrategy = "Linear"
)

// JitterMode randomises a wait so that failures do not retry in lockstep.
// +kubebuilder:validation:Enum=Full;Equal;Additive;None
type JitterMode string

const (
	// JitterFull waits a uniformly random time between zero and the bound.
	JitterFull JitterMode = "Full"
	// JitterEqual waits half the bound plus a random time up to the other half.
	JitterEqual JitterMode = "Equal"
	// JitterAdditive waits the bound plus a random time up to jitterPercent of it: never less
	// than the bound, at most jitterPercent more (seed 001: "about 0, 2, 4, 8, 16 s with a
	// small added jitter").
	JitterAdditive JitterMode = "Additive"
	// JitterNone waits exactly the bound.
	JitterNone JitterMode = "None"
)

// DefaultJitterPercent is the share of the bound Additive jitter adds at most, when the policy
// does not say.
const DefaultJitterPercent = 10

// RetryPolicySpec says how often and when deliveries are retried, when an endpoint's circuit
// opens, and when an endpoint is disabled. Give either backoff or schedule; with neither the
// backoff defaults apply (exponential from 2s, factor 2, up to 1h, full jitter).
// +kubebuilder:validation:XValidation:rule="!(has(self.schedule) && has(self.backoff))",message="set either schedule or backoff, not both"
// +kubebuilder:validation:XValidation:rule="!has(self.schedule) || !has(self.maxAttempts) || self.maxAttempts <= size(self.schedule)",message="maxAttempts cannot exceed the number of waits in schedule (the schedule lists the wait before every attempt)"
type RetryPolicySpec struct {
	// MaxAttempts counts every attempt, the first included (1 to 100). Defaults to the length
	// of schedule, or to 7 with backoff.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxAttempts *int32 `json:"maxAttempts,omitempty"`

	// MaxRetryDuration limits retries in time, as maxAttempts does in number: when the next
	// attempt would start later than this after the delivery was created, the delivery is
	// dead-lettered (reason retry_duration_exceeded) instead of waiting for it. From 1s to
	// 720h (30 days). Absent: only maxAttempts ends retries.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('720h')",message="maxRetryDuration must be between 1s and 720h"
	// +optional
	MaxRetryDuration *metav1.Duration `json:"maxRetryDuration,omitempty"`

	// Backoff computes the wait before each retry.
	// +optional
	Backoff *BackoffSpec `json:"backoff,omitempty"`

	// Schedule lists the wait before each attempt, the first included (usually 0s), e.g.
	// [0s, 30s, 5m, 30m, 2h, 12h, 24h]. Waits are counted from the previous failure.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:Type=string
	// +kubebuilder:validation:items:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.all(d, duration(d) >= duration('0s'))",message="schedule waits cannot be negative"
	// +kubebuilder:validation:XValidation:rule="duration(self[0]) == duration('0s')",message="the first wait is before the first attempt, which is immediate: it must be 0s"
	// +kubebuilder:validation:XValidation:rule="self.all(d, duration(d) <= duration('168h'))",message="schedule waits can be at most 168h (7 days)"
	// +optional
	Schedule []metav1.Duration `json:"schedule,omitempty"`

	// RetryAfter says whether a Retry-After header on 429 and 503 replaces the computed wait.
	// +kubebuilder:default={honor: true, maxDelay: "1h"}
	// +optional
	RetryAfter *RetryAfterSpec `json:"retryAfter,omitempty"`

	// CircuitBreaker protects a failing endpoint: it opens after consecutive failures, parks
	// deliveries, probes once after openDuration, and ramps back up after closing.
	// +kubebuilder:default={}
	// +optional
	CircuitBreaker *CircuitBreakerSpec `json:"circuitBreaker,omitempty"`

	// AutoDisable turns an endpoint off when it keeps failing: after consecutiveFailures failed
	// attempts in a row (retries included), or when failureRatePercent of the completed
	// deliveries in window failed, with at least minAttempts of them. Absent: never.
	// +optional
	AutoDisable *AutoDisableSpec `json:"autoDisable,omitempty"`
}

// BackoffSpec computes retry waits.
// +kubebuilder:validation:XValidation:rule="duration(self.maxInterval) >= duration(self.initialInterval)",message="maxInterval must not be below initialInterval"
// +kubebuilder:validation:XValidation:rule="!has(self.jitterPercent) || self.jitter == 'Additive'",message="jitterPercent applies only to jitter: Additive"
type BackoffSpec struct {
	// Strategy is Exponential (default) or Linear.
	// +kubebuilder:default=Exponential
	// +optional
	Strategy BackoffStrategy `json:"strategy,omitempty"`

	// InitialInterval is the bound of the first retry's wait.
	// +kubebuilder:default="2s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="initialInterval must be positive"
	// +optional
	InitialInterval *metav1.Duration `json:"initialInterval,omitempty"`

	// Factor multiplies the bound at each retry (Exponential): a number from 1 to 10, written
	// as a YAML number, e.g. 2 or 1.5 (not quoted).
	// +kubebuilder:default=2
	// +kubebuilder:validation:XValidation:rule="self >= 1.0 && self <= 10.0",message="factor must be a number from 1 to 10, e.g. 2 or 1.5"
	// +optional
	Factor Decimal `json:"factor,omitempty"`

	// MaxInterval caps the bound (Additive jitter adds to the capped bound).
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) <= duration('168h')",message="maxInterval must be positive and at most 168h"
	// +optional
	MaxInterval *metav1.Duration `json:"maxInterval,omitempty"`

	// Jitter is Full (default: a random wait from 0 to the bound), Equal (from half the bound
	// to the bound), Additive (the bound plus up to jitterPercent of it) or None (the bound).
	// +kubebuilder:default=Full
	// +optional
	Jitter JitterMode `json:"jitter,omitempty"`

	// JitterPercent is the most Additive jitter adds, in percent of the bound (1 to 100;
	// default 10): with 10, a 16s bound waits 16s to 17.6s. Only with jitter: Additive.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	JitterPercent *int32 `json:"jitterPercent,omitempty"`
}

// RetryAfterSpec governs the Retry-After response header.
type RetryAfterSpec struct {
	// Honor a Retry-After header on 429 and 503 responses.
	// +kubebuilder:default=true
	// +optional
	Honor bool `json:"honor"`

	// MaxDelay bounds a Retry-After wait; a longer one is cut to it.
	// +kubebuilder:default="1h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('168h')",message="retryAfter.maxDelay must be between 0s and 168h"
	// +optional
	MaxDelay *metav1.Duration `json:"maxDelay,omitempty"`
}

// CircuitBreakerSpec configures the per-endpoint circuit breaker, shared by every replica.
type CircuitBreakerSpec struct {
	// ConsecutiveFailures opens the circuit (failed attempts in a row); 0 disables the breaker.
	// +kubebuilder:default=5
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	ConsecutiveFailures int32 `json:"consecutiveFailures"`

	// OpenDuration is how long the circuit stays open before one half-open probe.
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s') && duration(self) <= duration('24h')",message="openDuration must be positive and at most 24h"
	// +optional
	OpenDuration *metav1.Duration `json:"openDuration,omitempty"`

	// SuccessesToClose is how many successful probes in a row close the circuit.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	SuccessesToClose int32 `json:"successesToClose,omitempty"`

	// RampUp is how long, after closing, the allowed rate grows from a trickle back to full,
	// so a recovering receiver is not hit by the whole backlog at once. 0s releases at once.
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('1h')",message="rampUp must be between 0s and 1h"
	// +optional
	RampUp *metav1.Duration `json:"rampUp,omitempty"`
}

// AutoDisableSpec has two independent triggers; either disables the endpoint.
// +kubebuilder:validation:XValidation:rule="has(self.consecutiveFailures) || has(self.failureRatePercent)",message="autoDisable needs consecutiveFailures, failureRatePercent, or both"
// +kubebuilder:validation:XValidation:rule="!has(self.failureRatePercent) || (has(self.window) && has(self.minAttempts))",message="failureRatePercent needs window and minAttempts"
type AutoDisableSpec struct {
	// ConsecutiveFailures disables the endpoint at this many failed attempts in a row, retries
	// included (seed 001: 10).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	ConsecutiveFailures *int32 `json:"consecutiveFailures,omitempty"`

	// FailureRatePercent disables the endpoint when at least this share of the completed
	// deliveries in window failed (seed 002: 95), evaluated whenever a delivery is
	// dead-lettered.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	FailureRatePercent *int32 `json:"failureRatePercent,omitempty"`

	// Window of the failure rate (seed 002: 72h).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('720h')",message="window must be between 1m and 720h"
	// +optional
	Window *metav1.Duration `json:"window,omitempty"`

	// MinAttempts is the minimum sample of completed deliveries in window below which the rate
	// never disables the endpoint (seed 002: 20; 19 are never enough).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	MinAttempts *int32 `json:"minAttempts,omitempty"`
}

// RetryPolicyStatus reports whether the policy is usable and who uses it.
type RetryPolicyStatus struct {
	// ObservedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, and Stalled while the policy is invalid.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Endpoints is how many WebhookEndpoints use this policy.
	// +optional
	Endpoints int32 `json:"endpoints"`

	// MaxAttempts in force.
	// +optional
	MaxAttempts int32 `json:"maxAttempts,omitempty"`

	// Summary of the waits, e.g. "0s, 30s, 5m, 30m, 2h, 12h, 24h" or "0s, ≤2s, ≤4s, ...".
	// +optional
	Summary string `json:"summary,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rp,categories=webhooks
// +kubebuilder:printcolumn:name="Attempts",type=integer,JSONPath=`.status.maxAttempts`
// +kubebuilder:printcolumn:name="Waits",type=string,JSONPath=`.status.summary`
// +kubebuilder:printcolumn:name="Endpoints",type=integer,JSONPath=`.status.endpoints`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// RetryPolicy says how deliveries are retried, when an endpoint's circuit opens and when an
// endpoint is disabled. Endpoints in the same namespace refer to it by name.
type RetryPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RetryPolicySpec   `json:"spec,omitempty"`
	Status RetryPolicyStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// RetryPolicyList is a list of RetryPolicies.
type RetryPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RetryPolicy `json:"items"`
}

func init() {
	SchemeBuilder.Register(&RetryPolicy{}, &RetryPolicyList{})
}
