// Package dispatcher is `webhook-operator dispatcher`: it delivers a namespace's events to its
// endpoints at least once, with signing, retries, dead letters, circuit breaking, auto-disable
// and health on each WebhookEndpoint's status.
//
// One dispatcher serves either every non-dedicated endpoint of a namespace (the shared
// webhook-dispatcher Deployment) or one dedicated endpoint. There is no router: each endpoint
// has its own durable consumer on the events stream, filtered by its event types, and one on
// the deliveries stream; every replica pulls from the consumers of every endpoint it serves.
// What only one replica may do for an endpoint (deliver a PerKey or rate-limited one, write
// its status) belongs to the holder of the endpoint's partition (leases.Partitions: N
// partitions by a hash of the endpoint's name, each with a lease, spread evenly over the live
// replicas); the holder of partition 0 also folds the delivery log into the health counts.
// An endpoint's maxInFlight is divided among the partitions (leases.ShareOf): each replica
// delivers within the parts of the partitions it holds, one semaphore for all the endpoint's
// consumers, and a partition it lets go of keeps its lease until the requests started under it
// have ended, so the replicas together never exceed it.
//
// # Stages
//
// The data plane is a row of stages, each a package with one concern, that meet through
// narrow interfaces declared by the stage that needs them; none holds a pointer back to a
// dispatcher object:
//
//	endpoint/  the resolved configuration of one endpoint (WebhookEndpoint, RetryPolicy,
//	           Secrets): what every other stage reads. Immutable; a change builds a new one.
//	decide/    every decision about a message: pure functions over one input returning a
//	           Verdict (route, admit, check, failed, logged again, paused), tested as tables.
//	attempt/   one HTTP attempt: the request and its headers (signed as sent), the
//	           endpoint's transport (guard, egress proxy, mTLS), the outcome, bounded.
//	deliver/   per endpoint: the sources of its consumers (pulled through internal/pull, one
//	           inbox subscription per replica for every consumer), admission of an event (ingest checks: an
//	           event that cannot become a request is dead-lettered as invalid_event, one a
//	           filter cannot decide on as filter_failed, never counted against a receiver; a
//	           rejected event leaves no record and is counted by counts.FilterTally), the
//	           hold (an endpoint that is suspended, whose circuit is open or that lags behind
//	           the events stream's limits copies its events into the deliveries stream), the
//	           gate (suspend, partition, circuit, half-open probe, rate and concurrency
//	           limits), per-key queues, the transformation of each attempt's body and headers
//	           (transform_failed dead-letters without an attempt), the attempt (attempt.Send)
//	           and settle(outcome), which is the only place a delivery ends:
//	           ack, retry (in place or as a message schedule) or dead letter. The LogWriter
//	           writes the outcomes to the delivery log in batches; the byte budget bounds what
//	           is held in memory across all endpoints (back-pressure, never OOM).
//	health/    an endpoint's health, in packages of one concern each: state/ (the shared
//	           state of an endpoint: circuit, failure streak, disable, counts, the outbox of
//	           operational events; changed by compare-and-set in the bucket), leases/ (the
//	           partitions and their leases), counts/ (the fold of the delivery log, the filter
//	           tally), report/ (the status writer, the announcer of operational events,
//	           Kubernetes Events), follow/ (reading the bucket's keys without a consumer).
//	           state.Store.Change returns what a change caused (its transitions, another
//	           replica's change found on the way); health.Health, the state as every stage
//	           changes it, carries that out in one place: the worker's wake-up, the circuit
//	           and disabled metrics, the status write (at once for a transition), the
//	           publication of the operational events the same compare-and-set queued in the
//	           outbox, and a Kubernetes Event per transition.
//	metrics/   the Prometheus metrics every stage updates through one endpoint's handles.
//
// The root package is the composition: run.go builds the stages in named steps (connect:
// NATS and the bucket; informers: the manager, its informer cache and probes; assemble: every
// stage in dependency order, each given what it needs at construction and nothing set
// afterwards; serve: start, wait, drain) and starts the fold on taking partition 0; resync.go
// turns the informer cache into endpoint configurations and workers (and their consumers; a
// deleted endpoint keeps its worker, which dead-letters what is queued for it, until its
// finalizer lets it go); workers.go is the set of workers, which the health stage sees as report.Endpoints.
//
// The stage seams are declared by the consumer (deliver.Health, report.Endpoints,
// counts.FoldTarget, counts.TallyTarget, report.NewsStore) so no stage imports the root, and
// metrics/ is shared by all stages.
//
// No stage creates a consumer: a dispatcher's bus identity (a tenant's, through the auth
// callout) may not, since a push consumer's deliver subject could name any subject. It pulls
// from the durable consumers the controller creates (each endpoint's, on the events stream
// and on the deliveries stream), and reads everything else by direct gets: state.Store.Watch
// and leases.Partitions the bucket (polled, follow.Keys), counts.Folder the delivery log (by
// sequence, from its checkpoint).
//
// What is written to JetStream (held deliveries, dead letters, delivery-log records) is made
// by internal/records only, the same code the controller's finalizer drain and the plugin's
// replay use.
//
// # How a message flows
//
//	event (WEBHOOKS_<ns>) --the endpoint's consumer there--> deliver: admit, gate, send, settle
//	  (or hold: a copy in WEBHOOKS_DELIVERIES_<ns> with the same delivery id, then the event
//	  is acked; it comes back through the endpoint's consumer on the deliveries stream)
//	--> one of
//	  ack:         after the outcome's delivery-log record is stored (WEBHOOKS_ATTEMPTS_<ns>)
//	  retry:       held in place (short waits, PerKey) or a message schedule (long waits)
//	  dead letter: stored in WEBHOOKS_DLQ_<ns>, logged, then acked
//
// Each attempt is an OpenTelemetry span when the dispatcher has a tracer (internal/tracing,
// from the OTEL_* environment): started in deliver's attempt, its outcome recorded where the
// outcome is logged.
//
// Every outcome is logged durably before the delivery is acknowledged, so a crash at any point
// either redelivers or finds the record already there; the log is the durable truth health
// counts come from. The LogWriter publishes asynchronously and, while an endpoint's previous
// message is being stored, gathers its next records into one message (one JSON record per
// line, an outcome header per record); each delivery is acked once the message holding its
// record is stored. Only first deliveries are batched, under a message id naming the records:
// a delivery that may have been logged before (redelivered, held, retried from a redelivery)
// is logged alone under its own record's id (records.LogRecord.MsgID), so a crash never
// writes an outcome twice. A redelivered message (its acknowledgement lost to a nats-server
// restart, a leader change or a crash after the log write: its delivery count is above 1, or
// its stream sequence is at or below the highest its source received, as when a consumer's new
// leader counts from 1 again) is looked up in the endpoint's log
// before it is attempted again, by its delivery id, through an index the worker builds from
// the message's stored time on only while redeliveries come; an outcome found there is settled
// without a request, so the receiver sees no duplicate and the fold counts it once. A copy of a
// delivery the worker is attempting or logging at that moment waits for it; the log's newest
// part is read from the stream's leader, which a lagging replica cannot hide. The fold counts a
// log message stored twice under one message id (a write retried to a new leader) once.
//
// # Who owns what state
//
//   - run.go owns the process: NATS connection, informer cache, the set of workers, the
//     puller, the log writer, the byte budget, and the order of start and stop.
//   - endpoint configurations are built by the resync from the informer cache and published
//     to deliver (each worker's atomic pointer); the workers ensure their consumers. A resync
//     after a change resolves only the endpoints whose object or retry policy changed (the
//     periodic one resolves all), so an idle endpoint costs its worker and its configuration;
//     what only a busy, rate-limited, PerKey or deleted endpoint needs is made when first
//     needed.
//   - circuit, failure streak and disabled state live in the bucket (health.<endpoint>);
//     every replica changes them by compare-and-set at once, never batched.
//   - counts (delivered, dead-lettered, attempts and failures over the window, last success
//     and failure) are a fold of the delivery log by the holder of partition 0, written with
//     the stream sequence they were folded through, so a new or restarted holder resumes
//     exactly; they are never counted in memory only. The fold reads the log headers-only:
//     each record's outcome is in a header (a record written before those headers is read
//     whole).
//   - pending is read, not counted: the consumers' pending and unacknowledged messages plus
//     the scheduled retries waiting in the deliveries stream.
//   - a status is written by the holder of the endpoint's partition, when its health changed
//     (an unchanged one is not written again, so a restart does not rewrite every status).
package dispatcher
