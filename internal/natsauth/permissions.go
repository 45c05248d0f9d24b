package natsauth

import (
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"
)

// Role is one set of bus permissions in a namespace. A connection gets the union of its roles.
type Role string

// Roles, from what Kubernetes says an identity may do in the namespace.
const (
	// RoleDispatcher is the namespace's dispatcher (its ServiceAccount, made by the controller,
	// with a token of the NATS audience): consume and acknowledge its endpoints' events and
	// deliveries, write deliveries, retries, the log and dead letters, read and write the
	// namespace's key-value bucket.
	RoleDispatcher Role = "dispatcher"
	// RoleProducer may publish events: create on webhookevents.
	RoleProducer Role = "producer"
	// RoleReader may read the delivery log, dead letters, pending counts and health: get or
	// list on webhookdeliveries.
	RoleReader Role = "reader"
	// RoleReplayer may write deliveries (replays) and their idempotency keys: create on
	// webhookdeliveries.
	RoleReplayer Role = "replayer"
	// RoleIngress is the operator's HTTP ingress (its ServiceAccount, named by the installer,
	// with a token of the NATS audience): it publishes events of every namespace on behalf of
	// callers it has authorized itself (create on webhookevents there), and may do nothing
	// else: no stream or consumer API, no operator subject, no operational event.
	RoleIngress Role = "ingress"
	// RolePurger may read and delete the namespace's dead letters and publish the
	// operational event that records a purge: delete on webhookdeliveries. Only a connection
	// that asks for it (PurgeUser) gets it, and then no other role.
	RolePurger Role = "purger"
)

// Stream is one stream of a namespace: its name and the subjects it stores.
type Stream struct {
	Name     string
	Subjects []string
}

// Bus is everything one namespace owns on the bus: its streams and key-value bucket. The
// controller fills it from the JetStream layout (internal/streams), so permissions always name
// what really exists.
type Bus struct {
	Namespace   string
	Events      Stream
	Deliveries  Stream
	Attempts    Stream
	DeadLetters Stream
	// Bucket is the namespace's key-value bucket.
	Bucket string
	// ReplaySubjects are where a replay writes a new delivery (the endpoints' delivery
	// subjects, not the scheduled retries').
	ReplaySubjects []string
	// ReplayKeyPrefix starts the bucket's keys that remember replays (e.g. "replay.").
	ReplayKeyPrefix string
	// OpsEvents is the subject of the namespace's operational events (among its events):
	// only its dispatcher may publish there.
	OpsEvents string
	// AllEvents matches the events of every namespace (webhooks.*.>), AllOpsEvents their
	// operational events: what the ingress may, and may not, publish.
	AllEvents, AllOpsEvents string
	// PurgeEvents is the one operational event a purger publishes: the record of a purge.
	PurgeEvents string
}

// Grant is what a connection is given: its roles in one namespace, and for a dispatcher the
// names of its endpoints' consumers on source namespaces' events streams.
type Grant struct {
	Roles []Role
	// SourceConsumers are the dispatcher's endpoints' consumers on the events streams of the
	// source namespaces they read (each name is the same on every events stream and names the
	// reading namespace, streams.EndpointConsumerOf); empty for other roles.
	SourceConsumers []string
	// SourceStreams are the events streams of the source namespaces that consented to be read
	// by the dispatcher's endpoints: it may read their state (how far their limits reach).
	SourceStreams []string
	// Inbox is the connection's own inbox prefix; it may subscribe to nothing else. Empty:
	// it may subscribe to nothing and so cannot make requests.
	Inbox string
}

// Has reports whether g includes r.
func (g Grant) Has(r Role) bool { return slices.Contains(g.Roles, r) }

const (
	jsAPI = "$JS.API."
	jsAck = "$JS.ACK."
)

// Permissions are the allow-lists of g on bus. They never include creating, updating,
// deleting or purging a stream, creating or deleting a consumer (a push consumer's deliver
// subject could name anything in the account), deleting a message (but a purger's of its
// namespace's dead letters), listing streams, or any subject of another namespace. Subscriptions are allowed only on the connection's inbox.
// Both lists are always set: an absent list would allow everything.
func Permissions(bus Bus, g Grant) jwt.Permissions {
	var pub []string
	add := func(s ...string) {
		for _, x := range s {
			if x != "" && !slices.Contains(pub, x) {
				pub = append(pub, x)
			}
		}
	}
	streamInfo := func(streams ...string) {
		for _, s := range streams {
			add(jsAPI + "STREAM.INFO." + s)
		}
	}
	// Stored-message reads: direct gets (batched or by subject) and the plain get.
	reads := func(streams ...string) {
		for _, s := range streams {
			add(jsAPI+"DIRECT.GET."+s, jsAPI+"DIRECT.GET."+s+".>", jsAPI+"STREAM.MSG.GET."+s)
		}
	}
	kvStream := "KV_" + bus.Bucket
	kvSubjects := "$KV." + bus.Bucket + "."

	if g.Has(RoleDispatcher) {
		d := bus.Deliveries.Name
		streamInfo(bus.Events.Name, d, bus.Attempts.Name, bus.DeadLetters.Name, kvStream)
		// Every consumer of the deliveries stream is one of the namespace's endpoints'.
		add(jsAPI+"CONSUMER.INFO."+d+".*", jsAPI+"CONSUMER.MSG.NEXT."+d+".*", jsAck+d+".>")
		// Endpoints take their events through their own consumers on the events stream. On the
		// namespace's own stream these are its endpoints' and those of namespaces it lets read
		// its events (sourceNamespaces): whoever writes a namespace's events decides what those
		// readers get anyway.
		ev := bus.Events.Name
		add(jsAPI+"CONSUMER.INFO."+ev+".*", jsAPI+"CONSUMER.MSG.NEXT."+ev+".*", jsAck+ev+".>")
		// On source namespaces' streams, only its own endpoints' consumers, by name (the
		// controller creates them only where the source consented).
		for _, c := range g.SourceConsumers {
			if c != "" && !strings.ContainsAny(c, ".*> ") {
				add(jsAPI+"CONSUMER.INFO.*."+c, jsAPI+"CONSUMER.MSG.NEXT.*."+c, jsAck+"*."+c+".>")
			}
		}
		for _, s := range g.SourceStreams {
			if s != "" && !strings.ContainsAny(s, ".*> ") {
				streamInfo(s)
			}
		}
		// The fold reads the delivery log, the health watch and the leases the bucket, the
		// plugin-like reads the events: all by direct gets, through no consumer.
		reads(bus.Events.Name, bus.Attempts.Name, kvStream)
		add(bus.Deliveries.Subjects...)
		add(bus.Attempts.Subjects...)
		add(bus.DeadLetters.Subjects...)
		add(kvSubjects + ">")
		add(bus.OpsEvents)
	}
	if g.Has(RoleProducer) {
		streamInfo(bus.Events.Name)
		add(bus.Events.Subjects...)
	}
	if g.Has(RoleIngress) {
		add(bus.AllEvents)
	}
	if g.Has(RoleReader) {
		// The log also lists the events waiting for an endpoint: on the events stream, above
		// its consumer's acknowledgement floor.
		streamInfo(bus.Events.Name, bus.Deliveries.Name, bus.Attempts.Name, bus.DeadLetters.Name, kvStream)
		add(jsAPI+"CONSUMER.INFO."+bus.Deliveries.Name+".*", jsAPI+"CONSUMER.INFO."+bus.Events.Name+".*")
		reads(bus.Events.Name, bus.Attempts.Name, bus.DeadLetters.Name, kvStream)
	}
	if g.Has(RoleReplayer) {
		streamInfo(kvStream)
		add(bus.ReplaySubjects...)
		if bus.ReplayKeyPrefix != "" {
			keys := kvSubjects + bus.ReplayKeyPrefix + ">"
			add(keys, jsAPI+"DIRECT.GET."+kvStream+"."+keys)
		}
	}
	if g.Has(RolePurger) {
		streamInfo(bus.DeadLetters.Name)
		reads(bus.DeadLetters.Name)
		add(jsAPI+"STREAM.MSG.DELETE."+bus.DeadLetters.Name, bus.PurgeEvents)
	}

	var p jwt.Permissions
	if len(pub) == 0 {
		p.Pub.Deny.Add(">")
	} else {
		p.Pub.Allow.Add(pub...)
		if g.Has(RoleProducer) && !g.Has(RoleDispatcher) && bus.OpsEvents != "" {
			// A producer's events are the namespace's, but the operator's operational events
			// (webhook_operator.*) are not a producer's to forge.
			p.Pub.Deny.Add(bus.OpsEvents)
		}
		if g.Has(RoleIngress) && bus.AllOpsEvents != "" {
			p.Pub.Deny.Add(bus.AllOpsEvents)
		}
	}
	if g.Inbox == "" {
		p.Sub.Deny.Add(">")
	} else {
		p.Sub.Allow.Add(g.Inbox + ".>")
	}
	return p
}
