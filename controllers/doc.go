// Package controllers holds the reconcilers of `webhook-operator controller`.
//
// Seven reconcilers share one manager; each has its SetupWithManager, as kubebuilder scaffolds
// them, and Setup calls them in turn (after the endpoint field indexes they share), then the
// one of RetentionSweep, a Runnable:
//
//   - EndpointReconciler, per WebhookEndpoint: a finalizer, the generated signing Secret
//     (`<endpoint>-signing`, never overwritten), the checks of what the endpoint refers to,
//     the namespace's streams (StreamSetCreator), its durable JetStream consumer on its literal
//     delivery subject, and the controller's part of its status. Steps only observe; one
//     deferred summary server-side applies the status (typed apply configurations, field
//     manager FieldManager), so the dispatcher's health and conditions are never touched, and
//     records an Event whenever Ready changes. Ready is False with a reason a
//     user can act on (NamespaceExcluded, InvalidURL, SourceNotAllowed, SigningSecretNotFound,
//     SecretNotFound, RetryPolicyNotFound, NATSUnavailable, Suspended, DispatcherUnavailable)
//     and True once the
//     consumer exists and the dispatcher Deployment reports an available replica. For kstatus
//     (Flux, Argo CD), Reconciling is True while something is awaited and Stalled while only a
//     change can help. StorageLimitReached tells every endpoint of a namespace that its
//     dead-letter stream is full or its delivery log at its bound (storageWatch: one reading
//     a namespace every 30s, endpoints reconciled only when it changes); it leaves Ready as it
//     is, and so does DispatcherCapped, while the installation's caps change the dedicated
//     dispatcher the endpoint asks for (sizing). An endpoint in a namespace the installation
//     excludes (Options.ExcludedNamespaces, and the controller's own) gets nothing. On
//     deletion the finalizer writes no dead letter: the endpoint's dispatcher, kept while the
//     finalizer is, dead-letters everything still queued for it (reason endpoint_deleted,
//     through its one dead-letter writer). The finalizer retires the endpoint's consumers (its
//     deliveries consumer widened to its scheduled retries and rewound, paused ones resumed,
//     drain consumers of earlier versions deleted), waits (Ready False Deleting, checked every
//     second) until they are empty, deletes them, and removes itself; in a namespace being
//     deleted it does not wait, as the streams go with the namespace.
//   - DispatcherReconciler, per dispatcher (namespace and Deployment name): the namespace's
//     shared `webhook-dispatcher` or an endpoint's dedicated one, with its ServiceAccount, a
//     Role reading exactly the Secrets its endpoints reference, a RoleBinding, the mirrored
//     NATS and tracing credentials (mirror), and the retirement of the router consumers of earlier versions (on
//     the namespace's events stream and the source namespaces') once every endpoint has its
//     own consumer. A deleted endpoint is served until its finalizer is gone (it dead-letters
//     what was queued for it; its consumers on source namespaces are then the finalizer's). A
//     dispatcher left without endpoints is removed with all of these, and the namespace's
//     credentials with its last dispatcher.
//   - StreamSets, per namespace: the ConfigMap `webhook-operator-streams` that stands for the
//     namespace's JetStream streams and bucket. The endpoint and dispatcher reconcilers create
//     it together with the set through a StreamSetCreator (the set only ever exists with it);
//     its finalizer deletes the set once the namespace (or the ConfigMap of a namespace
//     without endpoints) goes and no endpoint is left.
//   - RetryPolicyReconciler: whether a policy is valid, its attempts and waits, and how many
//     endpoints use it.
//   - ReplayReconciler, per WebhookReplay: runs the replay engine (internal/replay) in
//     bounded batches from a cursor kept in status (at most ratePerSecond a second), refuses
//     (Stalled EndpointDisabled) while the endpoint is disabled and goes on once it is
//     re-enabled, reports Complete/Ready/Reconciling/Stalled and the counts, and deletes a
//     complete replay --replay-ttl after it completed. A WebhookReplay has no finalizer:
//     deleting it stops it and deletes no delivery.
//   - QuotaReconciler, per WebhookQuota: the namespace's streams get its storage bounds
//     (JetStream.Ensure reads them, QuotaBounds), the endpoints whose admission changed are
//     woken (each endpoint decides its own with internal/quota.Admit in checkQuota: held back,
//     it is Ready False QuotaExceeded with QuotaLimitReached, its consumers paused, and the
//     dispatcher reconciler makes no dedicated dispatcher for it), and usage, limits and
//     LimitReached go to its status and the webhook_quota_* metrics. The auth callout withholds
//     producers' direct publishing while it sets a rate (EventPublishing).
//   - ErasureReconciler, per WebhookErasure: runs the erasure engine (internal/erasure) in
//     bounded batches from a cursor kept in status, refuses a spec naming anything outside its
//     namespace, and announces webhook_operator.erasure.completed.
//
// Beside them RetentionSweep, a Runnable on the leader, removes payloads past their retention
// (an endpoint's spec.payloadRetention, its namespace's WebhookQuota's) from the delivery log
// and the dead letters, keeping the records without them as an erasure does.
//
// The five that write a status (endpoint, retry policy, replay, quota, erasure) end every
// reconcile the same way (summarize.go, after Flux's internal/reconcile/summarize): steps only
// observe and collect problems; one deferred summary turns an error, else the problem that
// wins, else the reconciler's own account of a healthy reconcile into Ready, Reconciling and
// Stalled; and one writer applies the status when it changed and records the Events. Which
// problem wins is one rule for all: a stalling one (only a change helps) over one that waits,
// and among equals the first found (an endpoint's QuotaExceeded is one of these problems).
//
// The reconcilers never call each other: each learns of the others' objects through the API
// server, by the watches its SetupWithManager declares (the dispatcher reconciler, for
// instance, maps every endpoint change, before and after, to the dispatchers concerned). One
// source is not an object: the QuotaReconciler tells the endpoint and dispatcher reconcilers
// (their Quotas) whose admission changed, which they watch as channel sources.
//
// JetStream owns the NATS connection: it never fails for want of a server, creates a
// namespace's set when asked (and again after a reconnection or when a stream went missing),
// bounds every call by NATSTimeout, and
// re-queues every endpoint and dispatcher when the connection comes back or has stayed down,
// so status follows NATS without a restart.
package controllers
