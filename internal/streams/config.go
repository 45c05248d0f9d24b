package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/match"
)

// Config is the operator's JetStream configuration: names, placement, retention and the
// storage bounds of each namespace's set.
type Config struct {
	Names

	// Replicas of every stream and the bucket (1 for a single server, 3 for a cluster).
	Replicas int
	// Placement of every stream and the bucket: a cluster of a supercluster and/or server
	// tags. Nil lets JetStream place them in the cluster of the server the controller is
	// connected to.
	Placement *jetstream.Placement
	// Storage of every stream: file (default) or memory.
	Storage jetstream.StorageType
	// EventsMaxAge keeps published events this long (default 72h).
	EventsMaxAge time.Duration
	// AttemptsMaxAge keeps the delivery log this long (default 30 days).
	AttemptsMaxAge time.Duration
	// DeadLetterMaxAge keeps dead letters this long; 0 keeps them until removed (default).
	DeadLetterMaxAge time.Duration
	// MaxConsumers of the events and deliveries streams (nats-server defaults to 1,000; each
	// endpoint needs one).
	MaxConsumers int
	// DuplicateWindow de-duplicates events by Nats-Msg-Id, deliveries by delivery id, and
	// delivery-log records by outcome (it must outlast a redelivery after a crash, so a record
	// written again is dropped and health counts, a fold of the log, stay exact).
	DuplicateWindow time.Duration

	// EventsMaxBytes bounds a namespace's events stream; the oldest events go first.
	EventsMaxBytes int64
	// AttemptsMaxBytes bounds a namespace's delivery log; the oldest records go first.
	AttemptsMaxBytes int64
	// DeliveriesMaxBytes and DeliveriesMaxMsgs bound a namespace's deliveries stream (retries,
	// replays, test deliveries and held events). See DeliveriesStreamConfig for how nothing
	// held there is lost to them.
	DeliveriesMaxBytes int64
	DeliveriesMaxMsgs  int64
	// DeadLetterMaxBytes bounds a namespace's dead letters. A full dead-letter stream refuses
	// new dead letters (nothing already there is lost): the delivery stays queued and writing
	// its dead letter is retried.
	DeadLetterMaxBytes int64
	// BucketMaxBytes bounds a namespace's key-value bucket.
	BucketMaxBytes int64
	// BucketMaxValueSize bounds one value in the bucket.
	BucketMaxValueSize int32
	// ReplayKeyTTL is how long an idempotency key of a replay is remembered (0: forever).
	ReplayKeyTTL time.Duration
}

// Storage bounds of one namespace's set, by default. JetStream reserves a stream's MaxBytes
// in the server's (or the account's) storage when the stream is created, so the defaults add
// up to a modest 416 MiB a namespace.
const (
	DefaultEventsMaxBytes     = 128 << 20
	DefaultDeliveriesMaxBytes = 64 << 20
	DefaultDeliveriesMaxMsgs  = 100000
	DefaultAttemptsMaxBytes   = 128 << 20
	DefaultDeadLetterMaxBytes = 64 << 20
	DefaultBucketMaxBytes     = 32 << 20
	DefaultBucketMaxValueSize = 64 << 10
	DefaultReplayKeyTTL       = 30 * 24 * time.Hour
)

// bucketMarkerTTL is how long the bucket keeps the marker of a key that expired (its TTL).
const bucketMarkerTTL = time.Minute

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Names:              DefaultNames(),
		Replicas:           1,
		Storage:            jetstream.FileStorage,
		EventsMaxAge:       72 * time.Hour,
		AttemptsMaxAge:     30 * 24 * time.Hour,
		MaxConsumers:       100000,
		DuplicateWindow:    10 * time.Minute,
		EventsMaxBytes:     DefaultEventsMaxBytes,
		DeliveriesMaxBytes: DefaultDeliveriesMaxBytes,
		DeliveriesMaxMsgs:  DefaultDeliveriesMaxMsgs,
		AttemptsMaxBytes:   DefaultAttemptsMaxBytes,
		DeadLetterMaxBytes: DefaultDeadLetterMaxBytes,
		BucketMaxBytes:     DefaultBucketMaxBytes,
		BucketMaxValueSize: DefaultBucketMaxValueSize,
		ReplayKeyTTL:       DefaultReplayKeyTTL,
	}
}

// Validate checks the names and the bounds.
func (c Config) Validate() error {
	errs := []error{c.Names.Validate()}
	for what, v := range map[string]int64{
		"events max bytes": c.EventsMaxBytes, "attempts max bytes": c.AttemptsMaxBytes,
		"deliveries max bytes": c.DeliveriesMaxBytes, "deliveries max messages": c.DeliveriesMaxMsgs,
		"dead-letter max bytes": c.DeadLetterMaxBytes, "bucket max bytes": c.BucketMaxBytes,
	} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s is %d: want 0 (unbounded) or more", what, v))
		}
	}
	if c.BucketMaxValueSize < 0 {
		errs = append(errs, fmt.Errorf("bucket max value size is %d: want 0 (unbounded) or more", c.BucketMaxValueSize))
	}
	if c.ReplayKeyTTL != 0 && c.ReplayKeyTTL < time.Second {
		errs = append(errs, fmt.Errorf("replay key TTL is %s: want 0 (forever) or at least 1s", c.ReplayKeyTTL))
	}
	return errors.Join(errs...)
}

// For returns the set of namespace ns. ns must be a namespace name (ValidateNamespace).
func (c Config) For(ns string) Set { return Set{NamespaceNames: c.Names.For(ns), cfg: c} }

// Set is one namespace's streams and bucket: their names (NamespaceNames), configurations and
// consumers.
type Set struct {
	NamespaceNames
	cfg Config
	// bounds are the namespace's own storage bounds (WithBounds), applied by Ensure.
	bounds Bounds
}

// maxBytes is a bound as JetStream wants it: -1 for unbounded (bytes or messages).
func maxBytes(v int64) int64 {
	if v <= 0 {
		return -1
	}
	return v
}

// EventsStreamConfig is the configuration of the namespace's events stream. Its
// de-duplication (Nats-Msg-Id) covers this namespace's events only. Direct gets let a
// dispatcher read events by time without creating a consumer (which its bus identity may not).
func (s Set) EventsStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:         s.EventsStream(),
		Description:  "webhook-operator: events published in namespace " + s.ns,
		Subjects:     []string{s.EventsFilter()},
		Retention:    jetstream.LimitsPolicy,
		MaxAge:       s.cfg.EventsMaxAge,
		MaxBytes:     maxBytes(s.cfg.EventsMaxBytes),
		MaxConsumers: s.cfg.MaxConsumers,
		Storage:      s.cfg.Storage,
		Replicas:     s.cfg.Replicas,
		Placement:    s.cfg.Placement,
		Duplicates:   s.cfg.DuplicateWindow,
		Discard:      jetstream.DiscardOld,
		AllowDirect:  true,
	}
}

// DeliveriesStreamConfig is the configuration of the namespace's deliveries stream: a work
// queue with message scheduling for retries, bounded in bytes and messages so that one
// namespace cannot fill the storage every namespace shares.
//
// Its discard policy is DiscardOld although nothing held there may be lost: nats-server (2.15)
// refuses DiscardNew on a stream that allows message schedules, and the retries need them.
// The bound is kept from being reached instead: a dispatcher stops copying held events (an
// endpoint suspended or with its circuit open) into the stream once it is at
// DeliveriesHoldPercent of its bound, and leaves them in the events stream until there is
// room; the rest of the bound is headroom for retries, replays and test deliveries. The
// endpoints show StorageLimitReached (DeliveriesStreamFull) meanwhile.
func (s Set) DeliveriesStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              s.DeliveriesStream(),
		Description:       "webhook-operator: per-endpoint deliveries and scheduled retries of namespace " + s.ns,
		Subjects:          s.DeliveriesSubjects(),
		Retention:         jetstream.WorkQueuePolicy,
		MaxBytes:          maxBytes(s.cfg.DeliveriesMaxBytes),
		MaxMsgs:           maxBytes(s.cfg.DeliveriesMaxMsgs),
		MaxConsumers:      s.cfg.MaxConsumers,
		Storage:           s.cfg.Storage,
		Replicas:          s.cfg.Replicas,
		Placement:         s.cfg.Placement,
		Duplicates:        s.cfg.DuplicateWindow,
		Discard:           jetstream.DiscardOld,
		AllowMsgSchedules: true,
		AllowRollup:       true,
		// A shared-lane endpoint's park is read by direct gets (no consumer).
		AllowDirect: true,
	}
}

// AttemptsStreamConfig is the configuration of the namespace's delivery log: bounded in age
// and size, the oldest records go first.
func (s Set) AttemptsStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        s.AttemptsStream(),
		Description: "webhook-operator: delivery log of namespace " + s.ns + ", one record per attempt",
		Subjects:    s.AttemptsSubjects(),
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      s.cfg.AttemptsMaxAge,
		MaxBytes:    maxBytes(s.cfg.AttemptsMaxBytes),
		Storage:     s.cfg.Storage,
		Replicas:    s.cfg.Replicas,
		Placement:   s.cfg.Placement,
		Duplicates:  attemptsDuplicates(s.cfg.DuplicateWindow, s.cfg.AttemptsMaxAge),
		Discard:     jetstream.DiscardOld,
		AllowDirect: true,
	}
}

// attemptsDuplicates is the delivery log's de-duplication window: the installation's window
// (it outlasts a redelivery after a crash, so an outcome logged again is dropped), or the
// log's MaxAge when that is shorter (the server refuses a window longer than MaxAge).
func attemptsDuplicates(window, maxAge time.Duration) time.Duration {
	if maxAge > 0 && maxAge < window {
		return maxAge
	}
	return window
}

// DeadLetterStreamConfig is the configuration of the namespace's dead-letter stream. When it
// is full it refuses new dead letters rather than dropping old ones (DiscardNew).
func (s Set) DeadLetterStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        s.DeadLetterStream(),
		Description: "webhook-operator: dead letters of namespace " + s.ns + ", kept until removed",
		Subjects:    s.DeadLetterSubjects(),
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      s.cfg.DeadLetterMaxAge,
		MaxBytes:    maxBytes(s.cfg.DeadLetterMaxBytes),
		Storage:     s.cfg.Storage,
		Replicas:    s.cfg.Replicas,
		Placement:   s.cfg.Placement,
		Duplicates:  s.cfg.DuplicateWindow,
		Discard:     jetstream.DiscardNew,
		AllowDirect: true,
	}
}

// StreamConfigs are the configurations of the namespace's four streams.
func (s Set) StreamConfigs() []jetstream.StreamConfig {
	return []jetstream.StreamConfig{s.EventsStreamConfig(), s.DeliveriesStreamConfig(), s.AttemptsStreamConfig(), s.DeadLetterStreamConfig()}
}

// BucketConfig is the configuration of the namespace's key-value bucket. Keys may expire
// (per-key TTL, used by replay keys).
func (s Set) BucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         s.Bucket(),
		Description:    "webhook-operator: endpoint health, circuit state, leases and replay keys of namespace " + s.ns,
		History:        1,
		MaxBytes:       maxBytes(s.cfg.BucketMaxBytes),
		MaxValueSize:   max(s.cfg.BucketMaxValueSize, 0),
		Storage:        s.cfg.Storage,
		Replicas:       s.cfg.Replicas,
		Placement:      s.cfg.Placement,
		LimitMarkerTTL: bucketMarkerTTL,
	}
}

// ReplayKeyTTL is the options of a new replay key: its time to live.
func (s Set) ReplayKeyTTL() []jetstream.KVCreateOpt {
	if s.cfg.ReplayKeyTTL <= 0 {
		return nil
	}
	return []jetstream.KVCreateOpt{jetstream.KeyTTL(s.cfg.ReplayKeyTTL)}
}

// jsErrSubjectOverlap is nats-server's error code for "subjects overlap with an existing stream".
const jsErrSubjectOverlap jetstream.ErrorCode = 10065

// nats-server's error codes of a stream whose bound does not fit in the storage left: a server
// alone says "insufficient storage resources available" (10047) or "insufficient resources"
// (10023); a cluster "no suitable peers for placement" (10005) with "insufficient storage".
const (
	jsErrStorageExceeded      jetstream.ErrorCode = 10047
	jsErrInsufficientResource jetstream.ErrorCode = 10023
	jsErrNoPeers              jetstream.ErrorCode = 10005
)

// StorageFullError says the NATS servers have no room left to reserve a namespace's stream
// bounds: JetStream reserves each stream's byte bound in a server's max_file_store (or the
// JetStream account's storage limit) when it makes the stream, so a set needs Reservation free
// on every server that holds a replica of it.
type StorageFullError struct {
	// Namespace and Stream (or bucket) say what could not be made; Reservation is what the
	// namespace's set reserves in all.
	Namespace, Stream string
	Reservation       int64
	Err               error
}

func (e *StorageFullError) Error() string {
	return fmt.Sprintf("the NATS servers have no room left to reserve the stream bounds of namespace %s (%d MiB a namespace, %s could not be made): "+
		"raise each server's max_file_store (or the JetStream account's storage limit), or lower the installation's stream bounds "+
		"(streams.*MaxBytes) or this namespace's WebhookQuota spec.storage: %v",
		e.Namespace, e.Reservation>>20, e.Stream, e.Err)
}

func (e *StorageFullError) Unwrap() error { return e.Err }

// storageFull says err is the server's refusal of a stream bound that does not fit.
func storageFull(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jsErrStorageExceeded, jsErrInsufficientResource:
		return true
	case jsErrNoPeers:
		return strings.Contains(apiErr.Description, "insufficient storage")
	}
	return false
}

// Reservation is what the set reserves in each server's storage that holds a replica of it:
// the byte bounds of its streams and bucket (0 for one without a bound, which reserves nothing).
func (s Set) Reservation() int64 {
	var sum int64
	for _, sc := range s.StreamConfigs() {
		sum += max(s.bounded(sc).MaxBytes, 0)
	}
	return sum + max(s.BucketConfig().MaxBytes, 0)
}

// ConflictError says a stream of another layout (the shared streams of an earlier version, or
// another application's) already captures a namespace's subjects, so its set cannot be created.
type ConflictError struct {
	// Stream is the set's stream that could not be created, Subject one of its subjects.
	Stream, Subject string
	// Existing is the stream that captures Subject already ("" when the server did not say).
	Existing string
}

func (e *ConflictError) Error() string {
	existing := "an existing stream"
	if e.Existing != "" {
		existing = "stream " + e.Existing
	}
	return fmt.Sprintf("stream %s cannot be created: %s already captures its subject %s; "+
		"if it is the shared stream of an earlier webhook-operator version, deliver or move what it holds and delete it "+
		"(nats stream rm %s; see \"Upgrading from the shared streams\" in docs/install.md)",
		e.Stream, existing, e.Subject, orDefault(e.Existing, "<stream>"))
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// Ensure creates the namespace's streams and bucket, or updates them to this configuration.
// A stream of another layout that captures the namespace's subjects is a *ConflictError.
func (s Set) Ensure(ctx context.Context, js jetstream.JetStream) error {
	for _, sc := range s.StreamConfigs() {
		sc = s.bounded(sc)
		if sc.Name == s.DeliveriesStream() {
			if err := keepDeliveries(ctx, js, &sc); err != nil {
				return err
			}
		}
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrSubjectOverlap {
				ce := &ConflictError{Stream: sc.Name, Subject: sc.Subjects[0]}
				ce.Existing, _ = js.StreamNameBySubject(ctx, sc.Subjects[0])
				return ce
			}
			if storageFull(err) {
				return &StorageFullError{Namespace: s.ns, Stream: "stream " + sc.Name, Reservation: s.Reservation(), Err: err}
			}
			return fmt.Errorf("stream %s: %w", sc.Name, err)
		}
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, s.BucketConfig()); err != nil {
		if storageFull(err) {
			return &StorageFullError{Namespace: s.ns, Stream: "key-value bucket " + s.Bucket(), Reservation: s.Reservation(), Err: err}
		}
		return fmt.Errorf("key-value bucket %s: %w", s.Bucket(), err)
	}
	return nil
}

// keepDeliveries raises the bounds of sc, the deliveries stream's configuration, when the
// stream already holds more than they let it hold (a bound lowered, by the installation or the
// namespace's WebhookQuota): the stream discards its oldest messages beyond its bounds
// (DiscardOld, see DeliveriesStreamConfig), which would lose held deliveries and retries. The
// raised bound puts what the stream holds at DeliveriesHoldPercent, so nothing more is held
// and retries keep their headroom; the wanted bound applies once the set is ensured again
// after the stream has drained.
func keepDeliveries(ctx context.Context, js jetstream.JetStream, sc *jetstream.StreamConfig) error {
	if sc.MaxBytes <= 0 && sc.MaxMsgs <= 0 {
		return nil
	}
	st, err := js.Stream(ctx, sc.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", sc.Name, err)
	}
	held := st.CachedInfo().State
	sc.MaxBytes = keepBound(sc.MaxBytes, int64(held.Bytes))
	sc.MaxMsgs = keepBound(sc.MaxMsgs, int64(held.Msgs))
	return nil
}

// keepBound is bound, or more when held is past its DeliveriesHoldPercent.
func keepBound(bound, held int64) int64 {
	if bound <= 0 || held*100 < bound*DeliveriesHoldPercent {
		return bound
	}
	return held * 100 / DeliveriesHoldPercent
}

// Delete removes the namespace's streams and bucket with everything they hold; what is
// already gone is no error.
func (s Set) Delete(ctx context.Context, js jetstream.JetStream) error {
	for _, name := range s.Streams() {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("deleting stream %s: %w", name, err)
		}
	}
	if err := js.DeleteKeyValue(ctx, s.Bucket()); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("deleting key-value bucket %s: %w", s.Bucket(), err)
	}
	return nil
}

// EndpointConsumerOptions are the endpoint settings that shape its consumer.
type EndpointConsumerOptions struct {
	// MaxInFlight is the endpoint's concurrency across all replicas.
	MaxInFlight int
	// Timeout of one attempt.
	Timeout time.Duration
	// PerKey ordering holds later deliveries of a busy key in the dispatcher, so the consumer
	// lets more than MaxInFlight be outstanding; the dispatcher enforces MaxInFlight itself.
	PerKey bool
}

// PerKeyMaxAckPending is how many deliveries a PerKey endpoint may hold while keys wait.
const PerKeyMaxAckPending = 10000

// EndpointConsumerConfig returns the durable consumer of one endpoint on the deliveries
// stream. For best-effort endpoints MaxAckPending is maxInFlight: no consumer holds more
// outstanding than the endpoint may have in flight. maxInFlight itself, across the endpoint's
// consumers and the dispatcher's replicas, is the dispatcher's to keep: each replica has a
// share of it (the partitions' parts it holds) and one semaphore for all the endpoint's
// consumers.
func (s Set) EndpointConsumerConfig(endpoint string, o EndpointConsumerOptions) jetstream.ConsumerConfig {
	maxAck := max(o.MaxInFlight, 1)
	if o.PerKey {
		maxAck = max(maxAck, PerKeyMaxAckPending)
	}
	return jetstream.ConsumerConfig{
		Durable:       s.EndpointConsumer(endpoint),
		Description:   "webhook-operator: deliveries of " + s.ns + "/" + endpoint,
		FilterSubject: s.DeliverySubject(endpoint),
		AckPolicy:     jetstream.AckExplicitPolicy,
		// The dispatcher keeps a message alive (in progress) while it waits for a token or a
		// held retry, so the ack wait only has to cover one attempt and its bookkeeping.
		AckWait:       o.Timeout + 15*time.Second,
		MaxDeliver:    -1,
		MaxAckPending: maxAck,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// Pull requests may ask for many messages at once; the server bounds them by MaxAckPending.
		MaxRequestBatch: 0,
	}
}

// EventFilters are the filter subjects of an endpoint's consumer on this namespace's events
// stream: its event-type patterns under the namespace's events prefix, made disjoint
// (match.Disjoint: JetStream refuses overlapping filters). exact is false when the patterns
// overlap in a way no disjoint set expresses ("order.*" and "*.created"): the filter is then
// every event of the namespace, and the dispatcher matches the patterns itself.
func (s Set) EventFilters(patterns []string) (filters []string, exact bool) {
	ps, ok := match.Disjoint(patterns)
	if !ok || len(ps) == 0 {
		return []string{s.EventsFilter()}, false
	}
	for _, p := range ps {
		filters = append(filters, s.EventSubject(p))
	}
	return filters, true
}

// ConsumerStart is where a new consumer on an events stream starts: after a stream sequence
// (Seq, when not 0), at a time, or with the events published from now on (both zero).
type ConsumerStart struct {
	Seq  uint64
	Time time.Time
}

// apply sets where consumer cc starts: at Seq, else at Time, else with what is stored next.
func (start ConsumerStart) apply(cc *jetstream.ConsumerConfig) {
	switch {
	case start.Seq > 0:
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start.Seq
	case !start.Time.IsZero():
		t := start.Time.UTC()
		cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	default:
		cc.DeliverPolicy = jetstream.DeliverNewPolicy
	}
}

// EndpointEventsConsumerConfig returns the durable consumer through which endpoint of
// namespace reader reads this namespace's events: its own namespace's (reader is s's
// namespace) or a source namespace's (spec.sourceNamespaces). The dispatcher delivers each
// event it brings straight from the events stream; the deliveries stream only holds retries,
// replays, test deliveries and the deliveries an endpoint that cannot deliver now holds there
// (see the dispatcher). Its filters are the endpoint's patterns (EventFilters), so each
// endpoint has its own position and pending count on the one stream of events: a slow or
// failing endpoint holds up nobody else. MaxAckPending is as on the deliveries consumer.
func (s Set) EndpointEventsConsumerConfig(reader, endpoint string, patterns []string, o EndpointConsumerOptions, start ConsumerStart) jetstream.ConsumerConfig {
	cc := s.EndpointConsumerConfig(endpoint, o)
	cc.Durable = EndpointConsumerOf(reader, endpoint)
	cc.Description = "webhook-operator: events of " + s.ns + " for " + reader + "/" + endpoint
	cc.FilterSubject = ""
	cc.FilterSubjects, _ = s.EventFilters(patterns)
	if len(cc.FilterSubjects) == 1 {
		cc.FilterSubject, cc.FilterSubjects = cc.FilterSubjects[0], nil
	}
	start.apply(&cc)
	return cc
}

// RouterConsumerConfig returns the durable consumer, on this namespace's events stream, of
// the router of earlier versions (kept for tests of the upgrade) of a dispatcher in namespace
// reader: this namespace's own router, or the router
// of another namespace whose endpoints read this one's events (spec.sourceNamespaces). Events
// published after start are routed; start is when the first endpoint it serves was created,
// so events published while the wiring was being made are not missed.
func (s Set) RouterConsumerConfig(reader, dedicatedEndpoint string, start time.Time) jetstream.ConsumerConfig {
	desc := "webhook-operator: router of " + reader
	if dedicatedEndpoint != "" {
		desc += "/" + dedicatedEndpoint
	}
	if reader != s.ns {
		desc += ", reading the events of " + s.ns
	}
	cc := jetstream.ConsumerConfig{
		Durable:       RouterConsumer(reader, dedicatedEndpoint),
		Description:   desc,
		FilterSubject: s.EventsFilter(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       10 * time.Second, // the router settles an event within milliseconds
		MaxDeliver:    -1,
		MaxAckPending: 20000,
		DeliverPolicy: jetstream.DeliverNewPolicy,
	}
	if !start.IsZero() {
		t := start
		cc.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		cc.OptStartTime = &t
	}
	return cc
}

// IsNotFound reports whether err says a stream, consumer or key does not exist.
func IsNotFound(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrMsgNotFound) ||
		errors.Is(err, jetstream.ErrBucketNotFound)
}

// SourceNamespaces are the namespaces whose events the endpoints of namespace own read, given its
// endpoints' spec.sourceNamespaces: own first, then the others sorted, each once.
func SourceNamespaces(own string, sources []string) []string {
	others := make([]string, 0, len(sources))
	for _, ns := range sources {
		if ns != "" && ns != own && !slices.Contains(others, ns) {
			others = append(others, ns)
		}
	}
	slices.Sort(others)
	return append([]string{own}, others...)
}
