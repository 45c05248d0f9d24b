package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WebhookErasureSpec selects the events of the namespace whose payloads are erased. Every
// criterion given must hold (they combine with AND); at least one is needed. It cannot change
// once created: a WebhookErasure is one erasure.
// +kubebuilder:validation:XValidation:rule="has(self.eventIDs) || has(self.subjects) || has(self.expression) || has(self.since) || has(self.until)",message="select what to erase: eventIDs, subjects, expression, since or until (they combine with AND)"
// +kubebuilder:validation:XValidation:rule="!has(self.since) || !has(self.until) || self.since < self.until",message="until must be later than since"
type WebhookErasureSpec struct {
	// EventIDs selects these events (their ids, the Nats-Msg-Id they were published with), 1
	// to 1000.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:items:Pattern=`^[!-~]+$`
	// +listType=set
	// +optional
	EventIDs []string `json:"eventIDs,omitempty"`

	// Subjects selects the events published on these NATS subjects: patterns under the
	// namespace's events subject (webhooks.<namespace>.<event-type>, `*` for one token, `>`
	// last for the rest), e.g. webhooks.shop.customer.42.>. A subject outside the namespace is
	// refused (Stalled, OutsideNamespace).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=512
	// +kubebuilder:validation:items:Pattern=`^[!-~]+$`
	// +listType=set
	// +optional
	Subjects []string `json:"subjects,omitempty"`

	// Expression is a CEL expression over the event that is true for the events to erase,
	// with the variables of an endpoint's spec.filter (payload, raw, type, id, ns, time,
	// headers), e.g. `has(payload.customer) && payload.customer.email == "ana@example.com"`.
	// An event it cannot evaluate is not erased (it is counted in status.unevaluated).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +optional
	Expression string `json:"expression,omitempty"`

	// Since selects the events whose time (their Webhook-Event-Time, else when they were
	// published) is at or after this.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`

	// Until selects the events whose time is before this.
	// +optional
	Until *metav1.Time `json:"until,omitempty"`
}

// ErasureCounts are what an erasure erased, per stream.
type ErasureCounts struct {
	// Events deleted from the events stream (an endpoint that had not delivered one yet
	// never will).
	// +optional
	Events int64 `json:"events,omitempty"`
	// Deliveries deleted from the deliveries stream: retries, replays, test deliveries and
	// held events, which are not attempted again.
	// +optional
	Deliveries int64 `json:"deliveries,omitempty"`
	// DeliveryLogRecords kept without their payload (request headers, response body).
	// +optional
	DeliveryLogRecords int64 `json:"deliveryLogRecords,omitempty"`
	// DeadLetters kept without their payload (the event's body and headers, the last
	// response); their attempt history stays, and they can no longer be replayed.
	// +optional
	DeadLetters int64 `json:"deadLetters,omitempty"`
}

// ErasureProgress is how far an erasure has gone, so that it resumes there.
type ErasureProgress struct {
	// Phase is the step running: Collect (finding the selected events, changing nothing),
	// DeliveryLog, DeadLetters, Deliveries, Events, then Settle: once the attempts in flight
	// when the deletions began can no longer write anything, what they wrote meanwhile, again
	// until a reading finds nothing more.
	Phase string `json:"phase"`
	// Stream is the stream the phase reads; Next the next sequence to read.
	// +optional
	Stream string `json:"stream,omitempty"`
	// +optional
	Next int64 `json:"next,omitempty"`
	// Ends are, by stream name, one past the stream's last sequence when the erasure started
	// (a reading namespace's streams: when the erasure first read them; what was stored later
	// is read only by the Settle phase), and in the Settle phase where its next reading of
	// each stream starts. They hold the erased namespace's four streams and the three of the
	// reading namespace being read, never more.
	// +optional
	Ends map[string]int64 `json:"ends,omitempty"`
	// SettleAfter is when the Settle phase may read.
	// +optional
	SettleAfter *metav1.Time `json:"settleAfter,omitempty"`
	// SettleErased counts what the Settle phase's current reading erased: one that erases
	// nothing completes the erasure, otherwise another follows after a wait.
	// +optional
	SettleErased int64 `json:"settleErased,omitempty"`
}

// Phases of an erasure.
const (
	ErasurePhaseCollect     = "Collect"
	ErasurePhaseDeliveryLog = "DeliveryLog"
	ErasurePhaseDeadLetters = "DeadLetters"
	ErasurePhaseDeliveries  = "Deliveries"
	ErasurePhaseEvents      = "Events"
	ErasurePhaseSettle      = "Settle"
)

// WebhookErasureStatus is written by the controller only.
type WebhookErasureStatus struct {
	// ObservedGeneration is the generation the controller last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Complete (True once no stored message of the namespace holds a selected
	// payload), Ready (the same), Reconciling while it runs or waits, Stalled when its spec
	// cannot be carried out.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Matched counts the selected events found (each once, by id).
	// +optional
	Matched int64 `json:"matched,omitempty"`
	// Unevaluated counts the stored events the expression could not decide on (not erased).
	// +optional
	Unevaluated int64 `json:"unevaluated,omitempty"`
	// Erased counts what was erased, per stream.
	// +optional
	Erased ErasureCounts `json:"erased,omitempty"`

	// Progress is the erasure's cursor.
	// +optional
	Progress *ErasureProgress `json:"progress,omitempty"`

	// StartedAt is when the erasure started; CompletedAt when it completed.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
}

// Reasons of a WebhookErasure's conditions.
const (
	// ReasonErasing: the erasure runs.
	ReasonErasing = "Erasing"
	// ReasonErased: complete.
	ReasonErased = "Erased"
	// ReasonOutsideNamespace: the spec names something outside the erasure's namespace.
	ReasonOutsideNamespace = "OutsideNamespace"
	// ReasonInvalidExpression: spec.expression does not compile.
	ReasonInvalidExpression = "InvalidExpression"
	// ReasonTooManyEvents: the selector matches more events than one erasure handles.
	ReasonTooManyEvents = "TooManyEvents"
	// ReasonWaitingForFold: a delivery-log record is kept until the health counts include it,
	// so that erasing its payload changes no count.
	ReasonWaitingForFold = "WaitingForFold"
	// ReasonQueued: as many erasures as the installation runs at once are in progress, in
	// the namespace or in all; this one starts when one of them ends.
	ReasonQueued = "Queued"
	// ReasonExpressionLimit: spec.expression was stopped by one of an expression's bounds
	// (what it builds, its work, its deadline) on a stored event; the erasure stopped.
	ReasonExpressionLimit = "ExpressionLimit"
)

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=whx,categories=webhooks
// +kubebuilder:printcolumn:name="Complete",type=string,JSONPath=`.status.conditions[?(@.type=="Complete")].status`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.progress.phase`
// +kubebuilder:printcolumn:name="Matched",type=integer,JSONPath=`.status.matched`
// +kubebuilder:printcolumn:name="Events",type=integer,JSONPath=`.status.erased.events`
// +kubebuilder:printcolumn:name="Deliveries",type=integer,JSONPath=`.status.erased.deliveries`
// +kubebuilder:printcolumn:name="Log",type=integer,JSONPath=`.status.erased.deliveryLogRecords`
// +kubebuilder:printcolumn:name="Dead-Letters",type=integer,JSONPath=`.status.erased.deadLetters`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Complete")].reason`,priority=1
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Complete")].message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// WebhookErasure erases the payloads of the namespace's events that its spec selects, from
// every stream that holds them: the events stream and the deliveries stream lose those
// messages, the delivery log and the dead letters keep their records without the payload.
// It is idempotent (applying it again, or another erasure of the same events, erases
// nothing more), reports its progress and counts, and is announced as the
// webhook_operator.erasure.completed operational event. Deleting one stops it.
type WebhookErasure struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: a WebhookErasure is one erasure; create another to erase more"
	Spec   WebhookErasureSpec   `json:"spec"`
	Status WebhookErasureStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// WebhookErasureList is a list of WebhookErasures.
type WebhookErasureList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WebhookErasure `json:"items"`
}

func init() {
	SchemeBuilder.Register(&WebhookErasure{}, &WebhookErasureList{})
}
