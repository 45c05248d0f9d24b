// Package dispatcher is `webhook-operator dispatcher`: it routes a namespace's events to its
// endpoints and delivers them at least once, with signing, retries, dead letters, circuit
// breaking, auto-disable and health on each WebhookEndpoint's status.
//
// One dispatcher serves either every non-dedicated endpoint of a namespace (the shared
// webhook-dispatcher Deployment) or one dedicated endpoint. Replicas pull from the same durable
// consumers; one of them (holding a lease in the key-value bucket) also routes events,
// delivers PerKey and rate-limited endpoints, folds the delivery log into health counts and
// writes statuses.
//
// # Stages
//
// The data plane is a row of stages, each a package with one concern, that meet through
// narrow interfaces declared by the stage that needs them; none holds a pointer back to a
// dispatcher object:
//
//	endpoint/  the resolved configuration of one endpoint (WebhookEndpoint, RetryPolicy,
//	           Secrets): what every other stage reads. Immutable; a change builds a new one.
//	route/     the route table (event type -> endpoints), the router (events stream ->
//	           one delivery per matching endpoint whose filter accepts the event), backfill of
//	           a new endpoint, and ingest validation: an event that cannot become a request is
//	           dead-lettered here as invalid_event, one a filter cannot decide on as
//	           filter_failed, never counted against a receiver. A rejected event leaves no
//	           record: it is counted (a metric, and health.FilterTally into the health).
//	deliver/   per endpoint: the pull loop, the gate (suspend, lease, circuit, half-open
//	           probe, rate and concurrency limits), per-key queues, the transformation of
//	           each attempt's body and headers (signed as sent; transform_failed dead-letters
//	           without an attempt), send (one HTTP attempt)
//	           and settle(outcome), which is the only place a delivery ends: ack, retry (in
//	           place or as a message schedule) or dead letter. The byte budget bounds what is
//	           held in memory across all endpoints (back-pressure, never OOM).
//	health/    the shared state of an endpoint (circuit, failure streak, disable) changed by
//	           compare-and-set in the bucket; the lease; the fold of the delivery log into
//	           counts; the status writer. Store.Change is the one place a state change and
//	           its transitions (Event, metric, immediate status write, worker wake-up, and the
//	           operational event, queued in the state's outbox by the same compare-and-set and
//	           published by the Announcer) meet.
//	metrics/   the Prometheus metrics every stage updates through one endpoint's handles.
//
// The root package is the composition: run.go builds the stages in named steps (connect:
// NATS and the bucket; kube: the informer cache and probes; assemble: the stages and their
// seams; serve: start, wait, drain) and starts, on winning the lease, the router and the fold;
// resync.go turns the informer cache into endpoint configurations, workers and a route table;
// workers.go is the set of workers, which the health stage sees as health.Endpoints.
//
// The names follow the sketch except for the stage seams, which are declared by the
// consumer (route.Holder, deliver.Health, health.Endpoints, health.FoldTarget) so no stage
// imports the root, and metrics/, which all stages share.
//
// No stage creates a consumer: a dispatcher's bus identity (a tenant's, through the auth
// callout) may not, since a push consumer's deliver subject could name any subject. It pulls
// from the durable consumers the controller creates (one per endpoint, the router's), and
// reads everything else by direct gets: route.Backfill the events stream, health.Store.Watch
// the bucket (polled), health.Folder the delivery log (by sequence, from its checkpoint).
//
// What is written to JetStream (deliveries, dead letters, delivery-log records) is made by
// internal/records only, the same code the controller's finalizer drain and the plugin's
// replay use.
//
// # How a message flows
//
//	event (WEBHOOKS_<ns>) --route--> delivery (WEBHOOKS_DELIVERIES_<ns>, one per endpoint,
//	message id = delivery id) --deliver: gate, send, settle--> one of
//	  ack:         after the outcome's delivery-log record is stored (WEBHOOKS_ATTEMPTS_<ns>)
//	  retry:       held in place (short waits, PerKey) or a message schedule (long waits)
//	  dead letter: stored in WEBHOOKS_DLQ_<ns>, logged, then acked
//
// Each attempt is an OpenTelemetry span when the dispatcher has a tracer (internal/tracing,
// from the OTEL_* environment): started in deliver's attempt, its outcome recorded where the
// outcome is logged.
//
// Every outcome is logged durably before the delivery is acknowledged, with a message id
// naming the outcome (records.LogRecord.MsgID), so a crash at any point either redelivers or
// finds the record already there; the log is the durable truth health counts come from.
//
// # Who owns what state
//
//   - run.go owns the process: NATS connection, informer cache, the set of workers, the byte
//     budget, and the order of start and stop.
//   - endpoint configurations are built by the resync from the informer cache and published
//     to route (a new table) and deliver (each worker's atomic pointer).
//   - circuit, failure streak and disabled state live in the bucket (health.<endpoint>);
//     every replica changes them by compare-and-set at once, never batched.
//   - counts (delivered, dead-lettered, attempts and failures over the window, last success
//     and failure) are a fold of the delivery log by the lease holder, written with the
//     stream sequence they were folded through, so a new or restarted holder resumes
//     exactly; they are never counted in memory only.
//   - pending is read, not counted: the consumer's pending and unacknowledged deliveries plus
//     the scheduled retries waiting in the deliveries stream.
package dispatcher
