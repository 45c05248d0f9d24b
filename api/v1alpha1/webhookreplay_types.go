package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReplaySource says which deliveries of an endpoint a WebhookReplay selects.
// +kubebuilder:validation:Enum=DeadLetters;DeliveryLog
type ReplaySource string

const (
	// ReplayDeadLetters replays dead letters: all of the endpoint's, those of some reasons,
	// those dead-lettered between since and until, or the ones named by deliveryIDs.
	ReplayDeadLetters ReplaySource = "DeadLetters"
	// ReplayDeliveryLog replays every delivery whose outcome the delivery log recorded
	// between since and until, succeeded ones included ("recover"): for a receiver that
	// lost what it had acknowledged.
	ReplayDeliveryLog ReplaySource = "DeliveryLog"
)

// DeadLetterReason is a reason a delivery was dead-lettered.
// +kubebuilder:validation:Enum=exhausted;retry_duration_exceeded;endpoint_disabled;endpoint_deleted;payload_too_large;invalid_event;test_failed;filter_failed;transform_failed
type DeadLetterReason string

// WebhookReplaySpec says which deliveries of one endpoint are made again. It cannot change
// once created: a WebhookReplay is one replay, and its name is its idempotency key.
// +kubebuilder:validation:XValidation:rule="self.source != 'DeliveryLog' || has(self.since)",message="source DeliveryLog needs since: a recover replays what the delivery log recorded from since (until until, or when the replay starts)"
// +kubebuilder:validation:XValidation:rule="self.source != 'DeliveryLog' || (!has(self.reasons) && !has(self.deliveryIDs))",message="reasons and deliveryIDs select dead letters: they apply only to source DeadLetters"
// +kubebuilder:validation:XValidation:rule="!has(self.deliveryIDs) || (!has(self.reasons) && !has(self.since) && !has(self.until))",message="deliveryIDs names the dead letters to replay: leave out reasons, since and until"
// +kubebuilder:validation:XValidation:rule="!has(self.since) || !has(self.until) || self.since < self.until",message="until must be later than since"
type WebhookReplaySpec struct {
	// EndpointRef names the WebhookEndpoint, in this namespace, whose deliveries are replayed.
	// Each replayed delivery is a new delivery of that endpoint only, pointing at the original
	// (the webhook-replay-of header); other endpoints never see it.
	EndpointRef LocalObjectReference `json:"endpointRef"`

	// Source is DeadLetters (the default: the endpoint's dead letters) or DeliveryLog (every
	// delivery the delivery log recorded as succeeded or dead-lettered between since and
	// until: a recover, for a receiver that lost what it had acknowledged). A delivery of the
	// log is replayed with its event's body from the events stream (kept 72h by default),
	// or from its dead letter.
	// +kubebuilder:default=DeadLetters
	// +optional
	Source ReplaySource `json:"source,omitempty"`

	// Reasons selects the dead letters of these reasons only (e.g. exhausted,
	// endpoint_disabled); absent: every reason.
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +optional
	Reasons []DeadLetterReason `json:"reasons,omitempty"`

	// DeliveryIDs selects these dead letters only (1 to 100 delivery ids, whdl_...).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:Pattern=`^whdl_[0-9a-hjkmnp-tv-z]{26}$`
	// +listType=set
	// +optional
	DeliveryIDs []string `json:"deliveryIDs,omitempty"`

	// Since selects what was dead-lettered (DeadLetters) or attempted (DeliveryLog) at or
	// after this time. Required for DeliveryLog.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`

	// Until selects what was dead-lettered or attempted before this time; absent: up to when
	// the replay starts (nothing that happens while it runs is selected).
	// +optional
	Until *metav1.Time `json:"until,omitempty"`

	// RatePerSecond caps how many deliveries the replay creates per second (1 to 10000);
	// absent: as fast as the controller writes them, in batches. The endpoint's own rateLimit
	// still applies to sending them.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	RatePerSecond *int32 `json:"ratePerSecond,omitempty"`
}

// WebhookReplayStatus is written by the controller only.
type WebhookReplayStatus struct {
	// ObservedGeneration is the generation the controller last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Complete (True once every selected delivery was handled), Ready (True
	// once complete without failures), Reconciling (while it runs or waits for its endpoint
	// or NATS) and Stalled (while its endpoint is disabled, or once complete with failures).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Selected counts the deliveries the spec selected so far: replayed, skipped and failed
	// add up to it.
	// +optional
	Selected int64 `json:"selected,omitempty"`

	// Replayed counts the new deliveries created.
	// +optional
	Replayed int64 `json:"replayed,omitempty"`

	// Skipped counts the selected deliveries not replayed on purpose: already replayed by a
	// replay of the same name (its idempotency key), or refused (a dead letter whose payload
	// was cut would deliver a different body).
	// +optional
	Skipped int64 `json:"skipped,omitempty"`

	// Failed counts the selected deliveries that could not be replayed, e.g. a delivery of
	// the log whose event is no longer stored.
	// +optional
	Failed int64 `json:"failed,omitempty"`

	// Progress is how far the replay has read, so that it resumes there after a restart.
	// +optional
	Progress *ReplayProgress `json:"progress,omitempty"`

	// StartedAt is when the replay started; CompletedAt when it completed.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`

	// Problems describes the first deliveries that were refused or failed (at most 10).
	// +kubebuilder:validation:MaxItems=10
	// +listType=atomic
	// +optional
	Problems []ReplayProblem `json:"problems,omitempty"`
}

// ReplayProgress is a replay's cursor: the next position it reads and where it stops.
type ReplayProgress struct {
	// Stream the replay reads: the dead-letter stream or the delivery log of the namespace.
	Stream string `json:"stream"`
	// Next is the next stream sequence to read (with deliveryIDs, the index of the next id).
	Next int64 `json:"next"`
	// End is where the replay stops, not included: one past the stream's last sequence when
	// the replay started (with deliveryIDs, their number).
	End int64 `json:"end"`
}

// ReplayProblem is one delivery that was refused or could not be replayed.
type ReplayProblem struct {
	// DeliveryID of the original delivery.
	DeliveryID string `json:"deliveryID"`
	// Outcome is Skipped (refused) or Failed.
	Outcome string `json:"outcome"`
	// Message says why.
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message"`
}

// ConditionComplete is True on a WebhookReplay once every selected delivery was handled.
const ConditionComplete = "Complete"

// Reasons of a WebhookReplay's conditions.
const (
	// ReasonReplaying: the replay is creating deliveries.
	ReasonReplaying = "Replaying"
	// ReasonReplayed: complete, nothing failed.
	ReasonReplayed = "Replayed"
	// ReasonDeliveriesFailed: complete, some selected deliveries could not be replayed.
	ReasonDeliveriesFailed = "DeliveriesFailed"
	// ReasonEndpointNotFound: the endpoint does not exist (yet); the replay starts once it does.
	ReasonEndpointNotFound = "EndpointNotFound"
	// ReasonEndpointDisabled: the endpoint is auto-disabled; replays are refused until a
	// person re-enables it, and the replay proceeds then.
	ReasonEndpointDisabled = "EndpointDisabled"
)

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=whr,categories=webhooks
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.endpointRef.name`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.source`
// +kubebuilder:printcolumn:name="Complete",type=string,JSONPath=`.status.conditions[?(@.type=="Complete")].status`
// +kubebuilder:printcolumn:name="Selected",type=integer,JSONPath=`.status.selected`
// +kubebuilder:printcolumn:name="Replayed",type=integer,JSONPath=`.status.replayed`
// +kubebuilder:printcolumn:name="Skipped",type=integer,JSONPath=`.status.skipped`
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.failed`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Complete")].reason`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Complete")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// WebhookReplay makes deliveries of one endpoint again: its dead letters, or every delivery
// the delivery log recorded between two times (recover). Its name is its idempotency key: a
// delivery is replayed at most once per name, even across a controller restart or a
// WebhookReplay deleted and created again. Deleting one never deletes deliveries.
type WebhookReplay struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: a WebhookReplay is one replay and its name is its idempotency key; create another WebhookReplay, with another name, to replay again"
	Spec   WebhookReplaySpec   `json:"spec"`
	Status WebhookReplayStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// WebhookReplayList is a list of WebhookReplays.
type WebhookReplayList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WebhookReplay `json:"items"`
}

func init() {
	SchemeBuilder.Register(&WebhookReplay{}, &WebhookReplayList{})
}
