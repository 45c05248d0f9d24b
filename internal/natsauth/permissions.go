package natsauth

import (
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/webhook-operator/webhook-operator/internal/streams"
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
	// RoleReplayer may write deliveries (replays) and their idempotency keys: create on
	// webhookdeliveries.
	RoleReplayer Role = "replayer"
	// RoleIngress is the operator's HTTP ingress (its ServiceAccount, named by the installer,
	// with a token of the NATS audience): it publishes events of every namespace on behalf of
	// callers it has authorized itself (create on webhookevents there), and may do nothing
	// else: no stream or consumer API, no operator subject, no operational event.
	RoleIngress Role = "ingress"
	// RoleDataAPI is the data API server (webhook-operator apiserver: its ServiceAccount, named
	// by the installer, with a token of the NATS audience), which serves every namespace's
	// deliveries, dead letters and events to callers the Kubernetes API server authorized: it
	// may read every stream's stored messages, stream and consumer state (direct and plain
	// gets, stream and consumer info), and publish the events of every namespace but their
	// operational ones. It changes nothing else: a purge connects as the namespace's purger.
	RoleDataAPI Role = "data-api"
	// RolePurger may read and delete the namespace's dead letters and publish the
	// operational event that records a purge: the data API server's connection that asks for
	// it (PurgeUser), when RBAC allows it delete on webhookdeliveries there, and then no other
	// role. No tenant gets it: tenants purge through the data API.
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

// Grant is what a connection is given: its roles in one namespace, and for a dispatcher its
// endpoints' consumers on source namespaces' events streams.
type Grant struct {
	Roles []Role
	// Sources are the dispatcher's endpoints' consumers on the events streams of the source
	// namespaces that consent to them, each granted as its (stream, consumer) pair, with the
	// state of those streams (how far their limits reach); empty for other roles.
	Sources []SourceConsumer
	// Inbox is the connection's own inbox prefix (InboxOf the nkey it proved); it may
	// subscribe to nothing else. Empty: it may subscribe to nothing and so cannot make
	// requests.
	Inbox string
	// RateLimited says the namespace's WebhookQuota sets a publish rate, which NATS cannot
	// hold: a producer may not publish the namespace's events (the ingress holds the rate) and
	// a replayer may not write deliveries (test deliveries, replays; a WebhookReplay, which the
	// controller writes within the rate, still replays).
	RateLimited bool
}

// Has reports whether g includes r.
func (g Grant) Has(r Role) bool { return slices.Contains(g.Roles, r) }

const (
	jsAPI = "$JS.API."
	jsAck = "$JS.ACK."
)

// MaxSourceGrantBytes bounds the subjects a dispatcher's source consumers add to its user JWT,
// so that the callout's answer, which carries that JWT encoded twice (and encrypted), stays
// within NATS's default max_payload of 1 MiB with room for the rest. It holds 780 (endpoint,
// source) pairs when every name is the longest allowed, about 2,900 with names of a usual
// length; FitSources says how many fit. A dedicated dispatcher has a grant of its own.
const MaxSourceGrantBytes = 448 << 10

// FitSources is how many of sources, from the first, one grant holds: those whose subjects fit
// MaxSourceGrantBytes, cut between two endpoints' consumers, never inside one endpoint's (an
// endpoint is granted all its sources or none). Sources come endpoint by endpoint, oldest
// first (SourceConsumerLookup), so an endpoint created later never pushes an earlier one out.
func FitSources(sources []SourceConsumer) int {
	size, groupStart := 0, 0
	streams := map[string]bool{}
	for i, sc := range sources {
		if i > 0 && sc.Consumer != sources[i-1].Consumer {
			groupStart = i
		}
		for _, subj := range sourceSubjects([]SourceConsumer{sc}) {
			if strings.HasPrefix(subj, jsAPI+"STREAM.INFO.") {
				if streams[subj] {
					continue
				}
				streams[subj] = true
			}
			size += len(subj) + len(`"",`)
		}
		if size > MaxSourceGrantBytes {
			return groupStart
		}
	}
	return len(sources)
}

// sourceSubjects are what a dispatcher may publish for its source consumers.
func sourceSubjects(sources []SourceConsumer) []string {
	var out []string
	seen := map[string]bool{}
	for _, sc := range sources {
		if !validToken(sc.Stream) || !validToken(sc.Consumer) {
			continue
		}
		if !seen[sc.Stream] {
			seen[sc.Stream] = true
			out = append(out, jsAPI+"STREAM.INFO."+sc.Stream)
		}
		out = append(out, jsAPI+"CONSUMER.MSG.NEXT."+sc.Stream+"."+sc.Consumer, jsAck+sc.Stream+"."+sc.Consumer+".>")
	}
	return out
}

// validToken reports whether s is one literal subject token.
func validToken(s string) bool { return s != "" && !strings.ContainsAny(s, ".*> \t\r\n") }

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
	kvStream := streams.BucketStream(bus.Bucket)
	kvSubjects := streams.BucketSubjects(bus.Bucket)

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
		// On source namespaces' streams, only its own endpoints' consumers on the streams of
		// the sources that consent now, each as its (stream, consumer) pair: pulled and
		// acknowledged, and the stream's state.
		add(sourceSubjects(g.Sources)...)
		// The fold reads the delivery log, the health watch and the leases the bucket, the
		// plugin-like reads the events, the shared lane its endpoints' parks: all by direct
		// gets, through no consumer. A parked delivery settled is deleted, as an acknowledged
		// one leaves the work queue: only on its own namespace's deliveries stream.
		reads(bus.Events.Name, bus.Attempts.Name, kvStream, d)
		add(jsAPI + "STREAM.MSG.DELETE." + d)
		add(bus.Deliveries.Subjects...)
		add(bus.Attempts.Subjects...)
		add(bus.DeadLetters.Subjects...)
		add(kvSubjects + ">")
		add(bus.OpsEvents)
	}
	if g.Has(RoleProducer) {
		streamInfo(bus.Events.Name)
		if !g.RateLimited {
			add(bus.Events.Subjects...)
		}
	}
	if g.Has(RoleIngress) {
		add(bus.AllEvents)
	}
	if g.Has(RoleDataAPI) {
		add(jsAPI+"STREAM.INFO.*", jsAPI+"CONSUMER.INFO.*.*", jsAPI+"DIRECT.GET.*", jsAPI+"DIRECT.GET.*.>", jsAPI+"STREAM.MSG.GET.*", bus.AllEvents)
	}
	if g.Has(RoleReplayer) && !g.RateLimited {
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
		if (g.Has(RoleIngress) || g.Has(RoleDataAPI)) && bus.AllOpsEvents != "" {
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
