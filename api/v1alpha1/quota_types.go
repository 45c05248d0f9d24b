package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// QuotaName is the name of a namespace's one WebhookQuota.
const QuotaName = "default"

// WebhookQuotaSpec bounds what one namespace may use of the webhook installation. Every limit
// is optional: one left out is the installation's default (as without a quota), so a quota
// may bound only what the platform team cares about.
type WebhookQuotaSpec struct {
	// EventsPerSecond is the rate at which the namespace's producers may publish events
	// (a token bucket of eventsBurst). The ingress answers a publish over the rate with 429
	// and Retry-After, storing nothing. NATS cannot limit a client's message rate, so while
	// a rate is set producers may not publish to the bus directly: the auth callout grants
	// them no publish permission on the namespace's events (their next connection, at most an
	// hour later, is refused the publish), and they publish through the ingress. The rate
	// covers the deliveries the namespace's users write too: no test delivery or replay is
	// written to the bus directly, and a WebhookReplay replays at most this many a second.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	EventsPerSecond *int32 `json:"eventsPerSecond,omitempty"`

	// EventsBurst is the token bucket's size: how many events may be published at once
	// after a quiet second; defaults to eventsPerSecond.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	EventsBurst *int32 `json:"eventsBurst,omitempty"`

	// MaxEndpoints bounds the namespace's WebhookEndpoints. Endpoints are counted in the
	// order they were created; one beyond the limit is not Ready (reason QuotaExceeded) and
	// delivers nothing until an earlier one is deleted or the limit is raised.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	// +optional
	MaxEndpoints *int32 `json:"maxEndpoints,omitempty"`

	// MaxDeliveriesInFlight bounds the deliveries the namespace's endpoints may have in
	// flight at once: the sum of their spec.maxInFlight (default 50 each), which their
	// consumers and dispatchers enforce. An endpoint whose maxInFlight does not fit beside
	// the endpoints created before it is not Ready (reason QuotaExceeded).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000000
	// +optional
	MaxDeliveriesInFlight *int32 `json:"maxDeliveriesInFlight,omitempty"`

	// DedicatedDispatchers bounds the endpoints with spec.dispatcher.dedicated, each of
	// which runs its own Deployment.
	// +optional
	DedicatedDispatchers *DedicatedDispatcherQuota `json:"dedicatedDispatchers,omitempty"`

	// Storage bounds, in bytes, the namespace's streams. Each replaces the installation's
	// bound of that stream (--events-max-bytes and the others) for this namespace: the
	// events stream and the delivery log drop their oldest messages first, the dead-letter
	// stream refuses new messages when full, and held events stop at 80% of the deliveries
	// stream's bound and wait in the events stream (the endpoints show StorageLimitReached). JetStream reserves a stream's bound when it is created, so these
	// are also what the namespace takes of the server's storage.
	// +optional
	Storage *StorageQuota `json:"storage,omitempty"`

	// Retention bounds how long payloads are kept in the namespace's delivery log and dead
	// letters: the default of every endpoint, and the longest an endpoint's
	// spec.payloadRetention may ask for. Records older than this are kept without their
	// payload (the attempt history stays).
	// +optional
	Retention *PayloadRetention `json:"retention,omitempty"`
}

// DedicatedDispatcherQuota bounds the namespace's dedicated dispatchers.
type DedicatedDispatcherQuota struct {
	// Max is how many endpoints may ask for a dedicated dispatcher (0: none may). Absent:
	// no bound on the number.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Max *int32 `json:"max,omitempty"`

	// MaxReplicas bounds spec.dispatcher.replicas of each dedicated dispatcher.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	// +optional
	MaxReplicas *int32 `json:"maxReplicas,omitempty"`

	// MaxResources bounds each request and limit of a dedicated dispatcher's container (its
	// spec.dispatcher.resources, or the installation's default when it sets none), e.g.
	// {cpu: "1", memory: 512Mi}.
	// +optional
	MaxResources corev1.ResourceList `json:"maxResources,omitempty"`
}

// StorageQuota is the byte bound of each of a namespace's streams.
type StorageQuota struct {
	// Events bounds the events stream (oldest events go first).
	// +optional
	Events *resource.Quantity `json:"events,omitempty"`
	// Deliveries bounds the deliveries stream: retries, replays, test deliveries and held
	// events (held events stop at 80% of it and then stay in the events stream).
	// +optional
	Deliveries *resource.Quantity `json:"deliveries,omitempty"`
	// DeliveryLog bounds the delivery log (oldest records go first).
	// +optional
	DeliveryLog *resource.Quantity `json:"deliveryLog,omitempty"`
	// DeadLetters bounds the dead-letter stream (new dead letters are refused when full; their
	// deliveries stay queued).
	// +optional
	DeadLetters *resource.Quantity `json:"deadLetters,omitempty"`
}

// PayloadRetention says how long payloads are kept. A record older than this stays, without
// its payload: a dead letter keeps its reason, attempts and last status but not the event's
// body, headers or the receiver's response; a delivery-log record keeps its outcome, time,
// latency and status code but not the request headers or the response body. Absent: payloads
// are kept as long as their records (the delivery log's 30 days; dead letters until removed).
type PayloadRetention struct {
	// DeliveryLog is how long the delivery log keeps request headers and response bodies,
	// e.g. 168h.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="payload retention must be at least 1s"
	// +optional
	DeliveryLog *metav1.Duration `json:"deliveryLog,omitempty"`
	// DeadLetters is how long dead letters keep the event's payload, headers and the last
	// response, e.g. 720h.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="payload retention must be at least 1s"
	// +optional
	DeadLetters *metav1.Duration `json:"deadLetters,omitempty"`
}

// QuotaCount is a counted limit and what is used of it.
type QuotaCount struct {
	// Limit is the quota's limit; absent when the quota sets none.
	// +optional
	Limit *int64 `json:"limit,omitempty"`
	// Used is what the namespace uses of it now.
	Used int64 `json:"used"`
}

// QuotaBytes is a byte bound and what is stored.
type QuotaBytes struct {
	// Limit is the stream's bound (the quota's, else the installation's); absent when
	// unbounded.
	// +optional
	Limit *resource.Quantity `json:"limit,omitempty"`
	// Used is what the stream holds.
	Used resource.Quantity `json:"used"`
}

// StorageUsage is what each of the namespace's streams holds of its bound.
type StorageUsage struct {
	// +optional
	Events *QuotaBytes `json:"events,omitempty"`
	// +optional
	Deliveries *QuotaBytes `json:"deliveries,omitempty"`
	// +optional
	DeliveryLog *QuotaBytes `json:"deliveryLog,omitempty"`
	// +optional
	DeadLetters *QuotaBytes `json:"deadLetters,omitempty"`
}

// QuotaHold is one endpoint a limit holds back.
type QuotaHold struct {
	// Endpoint is the WebhookEndpoint's name.
	Endpoint string `json:"endpoint"`
	// Reason names the limit: EndpointLimit, DedicatedDispatcherLimit,
	// DedicatedDispatcherResources or InFlightLimit.
	Reason string `json:"reason"`
	// Message says what the limit is and what would fit.
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message"`
}

// WebhookQuotaStatus is written by the controller only.
type WebhookQuotaStatus struct {
	// ObservedGeneration is the generation the controller last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready (the limits are in force: the streams carry their bounds) and
	// LimitReached (True while a limit holds something back: an endpoint not admitted, a
	// stream at its bound).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Endpoints counts the namespace's admitted endpoints.
	// +optional
	Endpoints *QuotaCount `json:"endpoints,omitempty"`
	// DedicatedDispatchers counts the admitted endpoints with a dedicated dispatcher.
	// +optional
	DedicatedDispatchers *QuotaCount `json:"dedicatedDispatchers,omitempty"`
	// DeliveriesInFlight sums the admitted endpoints' maxInFlight.
	// +optional
	DeliveriesInFlight *QuotaCount `json:"deliveriesInFlight,omitempty"`
	// EventsPerSecond is the publish rate: the limit, and the rate at which events were
	// stored over the last reading (about a minute).
	// +optional
	EventsPerSecond *QuotaCount `json:"eventsPerSecond,omitempty"`
	// Storage is what each stream holds of its bound.
	// +optional
	Storage *StorageUsage `json:"storage,omitempty"`

	// HeldBack lists the endpoints a limit holds back (at most 20).
	// +kubebuilder:validation:MaxItems=20
	// +listType=atomic
	// +optional
	HeldBack []QuotaHold `json:"heldBack,omitempty"`
}

// Conditions and reasons of quotas.
const (
	// ConditionLimitReached is True on a WebhookQuota while one of its limits holds something
	// back.
	ConditionLimitReached = "LimitReached"
	// ConditionQuotaLimitReached is True on a WebhookEndpoint that its namespace's quota holds
	// back (its reason names the limit); False WithinQuota when the quota admits it; absent
	// without a quota.
	ConditionQuotaLimitReached = "QuotaLimitReached"

	// ReasonQuotaExceeded is the Ready reason of an endpoint its namespace's quota holds back.
	ReasonQuotaExceeded = "QuotaExceeded"
	// ReasonWithinQuota: the quota admits the endpoint, or no limit is reached.
	ReasonWithinQuota = "WithinQuota"
	// ReasonEndpointLimit: maxEndpoints.
	ReasonEndpointLimit = "EndpointLimit"
	// ReasonDedicatedDispatcherLimit: dedicatedDispatchers.max or .maxReplicas.
	ReasonDedicatedDispatcherLimit = "DedicatedDispatcherLimit"
	// ReasonDedicatedDispatcherResources: dedicatedDispatchers.maxResources.
	ReasonDedicatedDispatcherResources = "DedicatedDispatcherResources"
	// ReasonInFlightLimit: maxDeliveriesInFlight.
	ReasonInFlightLimit = "InFlightLimit"
	// ReasonStorageLimit: a stream of the namespace is at its bound.
	ReasonStorageLimit = "StorageLimit"
	// ReasonApplied: the quota's limits are in force.
	ReasonApplied = "Applied"
)

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=whq,categories=webhooks
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'default'",message="a namespace has one WebhookQuota, and it is named default"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Limited",type=string,JSONPath=`.status.conditions[?(@.type=="LimitReached")].status`
// +kubebuilder:printcolumn:name="Endpoints",type=integer,JSONPath=`.status.endpoints.used`
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.maxEndpoints`
// +kubebuilder:printcolumn:name="In-Flight",type=integer,JSONPath=`.status.deliveriesInFlight.used`
// +kubebuilder:printcolumn:name="Events/s",type=integer,JSONPath=`.spec.eventsPerSecond`
// +kubebuilder:printcolumn:name="Dedicated",type=integer,JSONPath=`.status.dedicatedDispatchers.used`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="LimitReached")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// WebhookQuota bounds what one namespace may use: its publish rate, endpoints, deliveries
// in flight, dedicated dispatchers, storage and how long payloads are kept. A namespace has
// at most one, named default, written by the platform team (tenants may read it). Without
// one, the installation's defaults apply.
type WebhookQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   WebhookQuotaSpec   `json:"spec,omitempty"`
	Status WebhookQuotaStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// WebhookQuotaList is a list of WebhookQuotas.
type WebhookQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WebhookQuota `json:"items"`
}

func init() {
	SchemeBuilder.Register(&WebhookQuota{}, &WebhookQuotaList{})
}
