package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Config is the operator's JetStream configuration: names, placement and retention.
type Config struct {
	Names

	// Replicas of every stream and the bucket (1 for a single server, 3 for a cluster).
	Replicas int
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
	// DuplicateWindow de-duplicates events by Nats-Msg-Id and deliveries by delivery id.
	DuplicateWindow time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Names:           DefaultNames(),
		Replicas:        1,
		Storage:         jetstream.FileStorage,
		EventsMaxAge:    72 * time.Hour,
		AttemptsMaxAge:  30 * 24 * time.Hour,
		MaxConsumers:    100000,
		DuplicateWindow: 10 * time.Minute,
	}
}

// EventsStream is the configuration of the events stream.
func (c Config) EventsStream() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:         c.Names.EventsStream,
		Description:  "webhook-operator: published events",
		Subjects:     c.EventsSubjects(),
		Retention:    jetstream.LimitsPolicy,
		MaxAge:       c.EventsMaxAge,
		MaxConsumers: c.MaxConsumers,
		Storage:      c.Storage,
		Replicas:     c.Replicas,
		Duplicates:   c.DuplicateWindow,
		Discard:      jetstream.DiscardOld,
	}
}

// DeliveriesStream is the configuration of the deliveries stream: a work queue with
// message scheduling for retries.
func (c Config) DeliveriesStream() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              c.Names.DeliveriesStream,
		Description:       "webhook-operator: per-endpoint deliveries and scheduled retries",
		Subjects:          c.DeliveriesSubjects(),
		Retention:         jetstream.WorkQueuePolicy,
		MaxConsumers:      c.MaxConsumers,
		Storage:           c.Storage,
		Replicas:          c.Replicas,
		Duplicates:        c.DuplicateWindow,
		Discard:           jetstream.DiscardOld,
		AllowMsgSchedules: true,
		AllowRollup:       true,
	}
}

// AttemptsStream is the configuration of the delivery log.
func (c Config) AttemptsStream() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        c.Names.AttemptsStream,
		Description: "webhook-operator: delivery log, one record per attempt",
		Subjects:    c.AttemptsSubjects(),
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      c.AttemptsMaxAge,
		Storage:     c.Storage,
		Replicas:    c.Replicas,
		Duplicates:  attemptsDuplicates(c.AttemptsMaxAge),
		Discard:     jetstream.DiscardOld,
		AllowDirect: true,
	}
}

// attemptsDuplicates is the delivery log's de-duplication window: a minute, or the log's
// MaxAge when that is shorter (the server refuses a window longer than MaxAge).
func attemptsDuplicates(maxAge time.Duration) time.Duration {
	if maxAge > 0 && maxAge < time.Minute {
		return maxAge
	}
	return time.Minute
}

// DeadLetterStream is the configuration of the dead-letter stream.
func (c Config) DeadLetterStream() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        c.Names.DeadLetterStream,
		Description: "webhook-operator: dead letters, kept until removed",
		Subjects:    c.DeadLetterSubjects(),
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      c.DeadLetterMaxAge,
		Storage:     c.Storage,
		Replicas:    c.Replicas,
		Duplicates:  c.DuplicateWindow,
		Discard:     jetstream.DiscardOld,
		AllowDirect: true,
	}
}

// BucketConfig is the configuration of the key-value bucket.
func (c Config) BucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      c.Bucket,
		Description: "webhook-operator: endpoint health, circuit state, replay keys",
		History:     1,
		Storage:     c.Storage,
		Replicas:    c.Replicas,
	}
}

// Ensure creates the streams and the bucket, or updates them to this configuration.
func Ensure(ctx context.Context, js jetstream.JetStream, c Config) error {
	for _, sc := range []jetstream.StreamConfig{c.EventsStream(), c.DeliveriesStream(), c.AttemptsStream(), c.DeadLetterStream()} {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("stream %s: %w", sc.Name, err)
		}
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, c.BucketConfig()); err != nil {
		return fmt.Errorf("key-value bucket %s: %w", c.Bucket, err)
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

// EndpointConsumer returns the durable consumer of one endpoint. For best-effort endpoints
// MaxAckPending is maxInFlight, so the server itself bounds concurrency across replicas.
func (c Config) EndpointConsumer(namespace, endpoint string, o EndpointConsumerOptions) jetstream.ConsumerConfig {
	maxAck := max(o.MaxInFlight, 1)
	if o.PerKey {
		maxAck = max(maxAck, PerKeyMaxAckPending)
	}
	return jetstream.ConsumerConfig{
		Durable:       EndpointConsumer(namespace, endpoint),
		Description:   "webhook-operator: deliveries of " + namespace + "/" + endpoint,
		FilterSubject: c.DeliverySubject(namespace, endpoint),
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

// RouterConsumer returns the durable consumer of a dispatcher's router on its namespace's
// events. Events published after start are routed; start is when the first endpoint it
// serves was created, so events published while the wiring was being made are not missed.
func (c Config) RouterConsumer(namespace, dedicatedEndpoint string, start time.Time) jetstream.ConsumerConfig {
	cc := jetstream.ConsumerConfig{
		Durable:       RouterConsumer(namespace, dedicatedEndpoint),
		Description:   "webhook-operator: router of " + namespace,
		FilterSubject: c.EventsFilter(namespace),
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
	if dedicatedEndpoint != "" {
		cc.Description = "webhook-operator: router of " + namespace + "/" + dedicatedEndpoint
	}
	return cc
}

// IsNotFound reports whether err says a stream, consumer or key does not exist.
func IsNotFound(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrMsgNotFound) ||
		errors.Is(err, jetstream.ErrBucketNotFound)
}

// RouterConsumerFor is RouterConsumer for a router whose endpoints also receive the events of
// sourceNamespaces (spec.sourceNamespaces, when the installer allows cross-namespace
// sources): one filter subject per namespace, its own first, duplicates removed.
func (c Config) RouterConsumerFor(namespace, dedicatedEndpoint string, start time.Time, sourceNamespaces []string) jetstream.ConsumerConfig {
	cc := c.RouterConsumer(namespace, dedicatedEndpoint, start)
	if filters := c.RouterFilters(namespace, sourceNamespaces); len(filters) > 1 {
		cc.FilterSubject, cc.FilterSubjects = "", filters
	}
	return cc
}

// RouterFilters are the filter subjects of a router in namespace whose endpoints also receive
// the events of sourceNamespaces: its own namespace's first, then the others sorted, each once.
func (c Config) RouterFilters(namespace string, sourceNamespaces []string) []string {
	others := make([]string, 0, len(sourceNamespaces))
	for _, ns := range sourceNamespaces {
		if ns != "" && ns != namespace && !slices.Contains(others, ns) {
			others = append(others, ns)
		}
	}
	slices.Sort(others)
	filters := []string{c.EventsFilter(namespace)}
	for _, ns := range others {
		filters = append(filters, c.EventsFilter(ns))
	}
	return filters
}

// ConsumerFilters returns the filter subjects of a consumer configuration, whichever of
// FilterSubject and FilterSubjects holds them.
func ConsumerFilters(cc jetstream.ConsumerConfig) []string {
	if len(cc.FilterSubjects) > 0 {
		return cc.FilterSubjects
	}
	if cc.FilterSubject != "" {
		return []string{cc.FilterSubject}
	}
	return nil
}

// DrainInactiveThreshold removes a drain consumer left behind by a controller that stopped
// mid-drain; the next attempt creates it again.
const DrainInactiveThreshold = 10 * time.Minute

// DrainConsumerConfig is the temporary consumer that moves everything still waiting for a
// deleted endpoint (its deliveries and its scheduled retries) to the dead-letter stream. The
// endpoint's own consumer must be deleted first: on a work-queue stream two consumers may not
// overlap.
func (c Config) DrainConsumerConfig(namespace, endpoint string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:           DrainConsumer(namespace, endpoint),
		Description:       "webhook-operator: dead-lettering what is left for deleted " + namespace + "/" + endpoint,
		FilterSubjects:    []string{c.DeliverySubject(namespace, endpoint), c.RetryFilter(namespace, endpoint)},
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           30 * time.Second,
		MaxDeliver:        -1,
		MaxAckPending:     1000,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: DrainInactiveThreshold,
	}
}
