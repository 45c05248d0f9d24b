// Package streams holds the JetStream layout every part of webhook-operator agrees on: stream
// and bucket names, subjects, consumer names, and the code that creates and removes them.
//
// Every namespace with endpoints has its own set of streams and its own key-value bucket, so
// that a namespace's identity on the bus is "these streams, this bucket", its storage is
// bounded per stream, and de-duplication never crosses namespaces. The set of namespace <ns>
// (with the default prefixes):
//
//	WEBHOOKS_<ns>             events, published by producers on webhooks.<ns>.<event-type>;
//	                          each endpoint reads them through its own durable consumer
//	                          (EndpointConsumer), filtered by its event types
//	WEBHOOKS_DELIVERIES_<ns>  deliveries on whk.d.<ns>.<endpoint>: replays, test deliveries
//	                          and the events an endpoint holds while it cannot deliver them;
//	                          scheduled retries wait on whk.r.<ns>.<endpoint>.<delivery-id>
//	                          and are published back onto whk.d.... by the server when due.
//	                          Work-queue retention: an acknowledged delivery is gone. Each
//	                          endpoint has a consumer of the same name here too.
//	WEBHOOKS_ATTEMPTS_<ns>    the delivery log, whk.log.<ns>.<endpoint>, kept 30 days
//	WEBHOOKS_DLQ_<ns>         dead letters, whk.dlq.<ns>.<endpoint>.<delivery-id>
//	webhook-operator-<ns>     key-value bucket: health.<endpoint> (shared health and circuit
//	                          state), lease.<scope>.p<n> (the leases of a dispatcher's
//	                          partitions), member.<scope>.<identity> (its live replicas),
//	                          replay.<endpoint>.<hash> (idempotent replays, expiring)
//
// Namespaces are DNS labels (lowercase letters, digits and '-', at most 63 characters): they
// contain no '_' or '.', so a stream name splits at its last '_' into prefix and namespace,
// and no namespace's name can be mistaken for another's or for another kind of stream.
// Names.Validate checks that the configured prefixes keep it that way.
//
// Endpoint names may contain dots, which NATS uses as token separators; EndpointToken
// replaces them with underscores, which Kubernetes names never contain, so the mapping is
// one-to-one.
package streams

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Names are the configurable prefixes of the per-namespace stream and bucket names, and the
// first tokens of subjects.
type Names struct {
	// EventsStream prefixes the events streams: <EventsStream>_<namespace> (default WEBHOOKS).
	EventsStream string
	// EventsSubjectPrefix is the first token of event subjects (default "webhooks").
	EventsSubjectPrefix string
	// DeliveriesStream prefixes the deliveries streams (default WEBHOOKS_DELIVERIES).
	DeliveriesStream string
	// AttemptsStream prefixes the delivery-log streams (default WEBHOOKS_ATTEMPTS).
	AttemptsStream string
	// DeadLetterStream prefixes the dead-letter streams (default WEBHOOKS_DLQ).
	DeadLetterStream string
	// Bucket prefixes the key-value buckets: <Bucket>-<namespace> (default webhook-operator).
	Bucket string
	// InternalPrefix is the first token of every subject the operator writes (default "whk").
	InternalPrefix string
}

// DefaultNames returns the default names.
func DefaultNames() Names {
	return Names{
		EventsStream:        "WEBHOOKS",
		EventsSubjectPrefix: "webhooks",
		DeliveriesStream:    "WEBHOOKS_DELIVERIES",
		AttemptsStream:      "WEBHOOKS_ATTEMPTS",
		DeadLetterStream:    "WEBHOOKS_DLQ",
		Bucket:              "webhook-operator",
		InternalPrefix:      "whk",
	}
}

// MaxNamespaceLength is the longest Kubernetes namespace name (a DNS label).
const MaxNamespaceLength = 63

// MaxPrefixLength bounds every configured prefix, so that a full name (prefix, separator,
// namespace; "KV_" before a bucket's stream) stays far below nats-server's 255-character limit
// on stream names, which are also directory names on its disk.
const MaxPrefixLength = 64

var (
	dnsLabel    = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	streamToken = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
)

// ValidateNamespace reports why ns cannot name a set of streams: it must be a Kubernetes
// namespace name (a DNS label of at most 63 characters).
func ValidateNamespace(ns string) error {
	if len(ns) == 0 || len(ns) > MaxNamespaceLength || !dnsLabel.MatchString(ns) {
		return fmt.Errorf("namespace %q is not a DNS label (lowercase letters, digits and '-', at most %d characters)", ns, MaxNamespaceLength)
	}
	return nil
}

// Validate checks the prefixes: valid in stream names and subjects, bounded, and unable to
// produce one name for two namespaces or two kinds of stream.
func (n Names) Validate() error {
	var errs []error
	streamsByPrefix := map[string]string{
		"events stream": n.EventsStream, "deliveries stream": n.DeliveriesStream,
		"attempts stream": n.AttemptsStream, "dead-letter stream": n.DeadLetterStream,
	}
	seen := map[string]string{}
	for _, what := range []string{"events stream", "deliveries stream", "attempts stream", "dead-letter stream"} {
		p := streamsByPrefix[what]
		if !streamToken.MatchString(p) || len(p) > MaxPrefixLength {
			errs = append(errs, fmt.Errorf("%s prefix %q: want 1 to %d letters, digits, '_' or '-'", what, p, MaxPrefixLength))
		}
		// Distinct prefixes are enough: <p>_<ns> = <q>_<ns'> with p shorter than q would put
		// the '_' that follows p in q inside ns, and namespaces have none.
		if other, dup := seen[p]; dup {
			errs = append(errs, fmt.Errorf("the %s and the %s have the same prefix %q: they must differ", other, what, p))
		}
		seen[p] = what
		// Key-value buckets are streams named KV_<bucket>: keep clear of them.
		if p == "KV" || strings.HasPrefix(p, "KV_") || p == "OBJ" || strings.HasPrefix(p, "OBJ_") {
			errs = append(errs, fmt.Errorf("%s prefix %q: KV and OBJ are reserved for key-value and object stores", what, p))
		}
	}
	if !streamToken.MatchString(n.Bucket) || len(n.Bucket) > MaxPrefixLength {
		errs = append(errs, fmt.Errorf("bucket prefix %q: want 1 to %d letters, digits, '_' or '-'", n.Bucket, MaxPrefixLength))
	}
	for what, p := range map[string]string{"events subject prefix": n.EventsSubjectPrefix, "internal subject prefix": n.InternalPrefix} {
		if p == "" || strings.ContainsAny(p, ".*> \t\r\n") {
			errs = append(errs, fmt.Errorf("%s %q: want one subject token (no '.', '*', '>' or spaces)", what, p))
		}
	}
	if n.EventsSubjectPrefix == n.InternalPrefix {
		errs = append(errs, fmt.Errorf("the events subject prefix and the internal subject prefix are both %q: they must differ", n.InternalPrefix))
	}
	return errors.Join(errs...)
}

// For returns the names of namespace ns's set. ns must be a namespace name (ValidateNamespace).
func (n Names) For(ns string) NamespaceNames { return NamespaceNames{names: n, ns: ns} }

// NamespaceNames are the stream, bucket, subject and consumer names of one namespace's set.
// Every name it gives belongs to that namespace, so callers cannot mix namespaces up.
type NamespaceNames struct {
	names Names
	ns    string
}

// Namespace is the namespace whose names these are.
func (n NamespaceNames) Namespace() string { return n.ns }

// EventsStream is the name of the namespace's events stream.
func (n NamespaceNames) EventsStream() string { return n.names.EventsStream + "_" + n.ns }

// DeliveriesStream is the name of the namespace's deliveries stream.
func (n NamespaceNames) DeliveriesStream() string { return n.names.DeliveriesStream + "_" + n.ns }

// AttemptsStream is the name of the namespace's delivery log.
func (n NamespaceNames) AttemptsStream() string { return n.names.AttemptsStream + "_" + n.ns }

// DeadLetterStream is the name of the namespace's dead-letter stream.
func (n NamespaceNames) DeadLetterStream() string { return n.names.DeadLetterStream + "_" + n.ns }

// Bucket is the name of the namespace's key-value bucket.
func (n NamespaceNames) Bucket() string { return n.names.Bucket + "-" + n.ns }

// BucketStream is the stream that stores key-value bucket bucket (nats-server's naming).
func BucketStream(bucket string) string { return "KV_" + bucket }

// BucketSubjects prefixes the subjects of key-value bucket bucket's keys (nats-server's
// naming): $KV.<bucket>.<key>.
func BucketSubjects(bucket string) string { return "$KV." + bucket + "." }

// Streams are the names of the namespace's four streams.
func (n NamespaceNames) Streams() []string {
	return []string{n.EventsStream(), n.DeliveriesStream(), n.AttemptsStream(), n.DeadLetterStream()}
}

// EventSubject is where producers publish an event of eventType in the namespace.
func (n NamespaceNames) EventSubject(eventType string) string {
	return n.names.EventsSubjectPrefix + "." + n.ns + "." + eventType
}

// EventsFilter matches every event of the namespace: the events stream's subject.
func (n NamespaceNames) EventsFilter() string {
	return n.names.EventsSubjectPrefix + "." + n.ns + ".>"
}

// EventType returns the event type of an event subject of the namespace, or false.
func (n NamespaceNames) EventType(subject string) (string, bool) {
	p := n.names.EventsSubjectPrefix + "." + n.ns + "."
	if !strings.HasPrefix(subject, p) || len(subject) == len(p) {
		return "", false
	}
	return subject[len(p):], true
}

// DeliverySubject is the literal subject of one endpoint's deliveries.
func (n NamespaceNames) DeliverySubject(endpoint string) string {
	return n.names.InternalPrefix + ".d." + n.ns + "." + EndpointToken(endpoint)
}

// RetrySubject is where one delivery's scheduled retry waits until due.
func (n NamespaceNames) RetrySubject(endpoint, deliveryID string) string {
	return n.names.InternalPrefix + ".r." + n.ns + "." + EndpointToken(endpoint) + "." + deliveryID
}

// RetryFilter matches every scheduled retry of one endpoint.
func (n NamespaceNames) RetryFilter(endpoint string) string {
	return n.names.InternalPrefix + ".r." + n.ns + "." + EndpointToken(endpoint) + ".>"
}

// DeliveriesSubjects are the deliveries stream's subjects: the own lane's deliveries and
// scheduled retries, and the shared lane's queue, park and scheduled retries (shared.go).
func (n NamespaceNames) DeliveriesSubjects() []string {
	p := n.names.InternalPrefix
	return []string{p + ".d." + n.ns + ".>", p + ".r." + n.ns + ".>", p + ".q." + n.ns + ".>", p + ".h." + n.ns + ".>", p + ".s." + n.ns + ".>"}
}

// AttemptSubject is one endpoint's delivery-log subject.
func (n NamespaceNames) AttemptSubject(endpoint string) string {
	return n.names.InternalPrefix + ".log." + n.ns + "." + EndpointToken(endpoint)
}

// AttemptsSubjects are the delivery log's subjects.
func (n NamespaceNames) AttemptsSubjects() []string {
	return []string{n.names.InternalPrefix + ".log." + n.ns + ".>"}
}

// DeadLetterSubject is the subject of one dead letter.
func (n NamespaceNames) DeadLetterSubject(endpoint, deliveryID string) string {
	return n.names.InternalPrefix + ".dlq." + n.ns + "." + EndpointToken(endpoint) + "." + deliveryID
}

// DeadLetterFilter matches the dead letters of one endpoint, or of the whole namespace when
// endpoint is empty.
func (n NamespaceNames) DeadLetterFilter(endpoint string) string {
	if endpoint == "" {
		return n.names.InternalPrefix + ".dlq." + n.ns + ".>"
	}
	return n.names.InternalPrefix + ".dlq." + n.ns + "." + EndpointToken(endpoint) + ".>"
}

// DeadLetterIDFilter matches the dead letter with deliveryID, whatever its endpoint.
func (n NamespaceNames) DeadLetterIDFilter(deliveryID string) string {
	return n.names.InternalPrefix + ".dlq." + n.ns + ".*." + deliveryID
}

// DeadLetterSubjects are the dead-letter stream's subjects.
func (n NamespaceNames) DeadLetterSubjects() []string { return []string{n.DeadLetterFilter("")} }

// EndpointConsumer is the durable consumer (on the deliveries stream) delivering one endpoint.
func (n NamespaceNames) EndpointConsumer(endpoint string) string {
	return EndpointConsumerOf(n.ns, endpoint)
}

// EndpointConsumerOf is the name of the durable consumers of endpoint of namespace reader: the
// same on its namespace's deliveries stream and on each events stream it reads (its own
// namespace's and its source namespaces').
func EndpointConsumerOf(reader, endpoint string) string {
	return consumerName("ep_", reader, endpoint)
}

// DrainConsumer is the name of the temporary consumers through which the controller of earlier
// versions moved what was left for a deleted endpoint of this namespace to the dead-letter
// stream: on the deliveries stream, and on each events stream the endpoint read. The
// controller only deletes them now (its dispatcher dead-letters what was left).
func (n NamespaceNames) DrainConsumer(endpoint string) string {
	return consumerName("drain_", n.ns, endpoint)
}

// EndpointOfSubject is the endpoint a subject of the namespace's deliveries, retries, delivery
// log or dead letters names (whk.<kind>.<ns>.<endpoint>[.<delivery-id>]), or "".
func (n NamespaceNames) EndpointOfSubject(subject string) string {
	rest, ok := strings.CutPrefix(subject, n.names.InternalPrefix+".")
	if !ok {
		return ""
	}
	_, rest, ok = strings.Cut(rest, ".") // the kind
	if !ok {
		return ""
	}
	rest, ok = strings.CutPrefix(rest, n.ns+".")
	if !ok {
		return ""
	}
	token, _, _ := strings.Cut(rest, ".")
	return EndpointName(token)
}

// EndpointToken is an endpoint's name as one subject token: dots become underscores.
func EndpointToken(name string) string { return strings.ReplaceAll(name, ".", "_") }

// EndpointName reverses EndpointToken.
func EndpointName(token string) string { return strings.ReplaceAll(token, "_", ".") }

// Key-value keys of a namespace's bucket. The bucket is the namespace's own, so no key names
// the namespace.
const (
	// HealthKeyPrefix starts every health key.
	HealthKeyPrefix = "health."
	// LeaseKeyPrefix starts every lease key.
	LeaseKeyPrefix = "lease."
	// ReplayKeyPrefix starts every replay key.
	ReplayKeyPrefix = "replay."
	// FoldKeyPrefix starts every fold checkpoint key.
	FoldKeyPrefix = "fold."
	// MemberKeyPrefix starts the keys live dispatcher replicas renew.
	MemberKeyPrefix = "member."
)

// HealthKey is the key of one endpoint's shared health and circuit state.
func HealthKey(endpoint string) string { return HealthKeyPrefix + EndpointToken(endpoint) }

// DispatcherScope names one dispatcher in the bucket's keys: "_shared" for the namespace's
// shared dispatcher (dedicated empty), else the dedicated endpoint's token.
func DispatcherScope(dedicated string) string {
	if dedicated == "" {
		return "_shared"
	}
	return EndpointToken(dedicated)
}

// LeaseKey is the key of the lease of partition p of one dispatcher (see the dispatcher's
// partitions): whoever holds it delivers the partition's single-active endpoints, folds
// their delivery log and writes their status.
func LeaseKey(dedicated string, p int) string {
	return LeaseKeyPrefix + DispatcherScope(dedicated) + ".p" + strconv.Itoa(p)
}

// MemberKey is the key a live replica of one dispatcher renews, so the replicas know each
// other and share the partitions.
func MemberKey(dedicated, identity string) string {
	return MemberKeyPrefix + DispatcherScope(dedicated) + "." + identity
}

// MembersFilter matches the member keys of one dispatcher.
func MembersFilter(dedicated string) string {
	return MemberKeyPrefix + DispatcherScope(dedicated) + ".>"
}

// FoldKey is the key of the checkpoint of one dispatcher's fold of the delivery log into
// health counts: the last attempts-stream sequence whose records are all counted.
func FoldKey(dedicated string) string { return FoldKeyPrefix + DispatcherScope(dedicated) }

// ReplayKey is the key remembering one idempotent replay.
func ReplayKey(endpoint, idempotencyKey string) string {
	sum := sha256.Sum256([]byte(idempotencyKey))
	return ReplayKeyPrefix + EndpointToken(endpoint) + "." + hex.EncodeToString(sum[:12])
}

// maxConsumerName keeps consumer names short enough to be file names on any server.
const maxConsumerName = 200

func consumerName(prefix, namespace, endpoint string) string {
	name := prefix + namespace
	if endpoint != "" {
		name += "_" + EndpointToken(endpoint)
	}
	if len(name) <= maxConsumerName {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:maxConsumerName-17] + "-" + hex.EncodeToString(sum[:8])
}

// RouterConsumer is the durable consumer of the router of earlier versions inside a
// dispatcher of namespace reader (its shared dispatcher, dedicatedEndpoint empty, or one
// endpoint's dedicated one), on every events stream that router read: its own namespace's,
// and those of the source namespaces its endpoints read. Endpoints' own consumers start where
// it had got to, and the controller deletes it.
func RouterConsumer(reader, dedicatedEndpoint string) string {
	return consumerName("router_", reader, dedicatedEndpoint)
}

// SplitEventSubject splits an event subject <prefix>.<namespace>.<type> (both "" when it is not
// one).
func SplitEventSubject(subject, prefix string) (ns, typ string) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return "", ""
	}
	ns, typ, ok = strings.Cut(rest, ".")
	if !ok || typ == "" {
		return "", ""
	}
	return ns, typ
}
