package streams

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// Lanes: how an endpoint's deliveries reach its dispatcher.
//
// Most endpoints ride the shared lane: their namespace's dispatcher reads the namespace's
// events through one intake consumer (IntakeConsumer) and its due deliveries (retries,
// replays, test deliveries) through one queue consumer (QueueConsumer), whatever the number of
// endpoints, and hands each message to the endpoints it is for. An endpoint that cannot take a
// message now (its circuit is open, it is suspended, it is busy beyond its share) parks it on
// its own park subject (ParkSubject), which no consumer reads: nothing waiting there holds a
// consumer's slot, so a dead or slow endpoint backs up only itself. Scheduled retries wait on
// the endpoint's schedule subjects (ScheduleSubject) until the server publishes them onto its
// queue subject.
//
// An endpoint that asks for its own lane (a dedicated dispatcher, or per-key ordering, which
// needs its events in stream order in one place) keeps durable consumers of its own on the
// events stream (EndpointConsumerOf) and the deliveries stream (EndpointConsumer, on
// DeliverySubject, its retries on RetrySubject), as every endpoint had before the shared lane.
// Those are bounded by the namespace's quota.

// Lane is how an endpoint's deliveries reach its dispatcher.
type Lane int

const (
	// LaneShared: the namespace's intake and queue consumers, parking and schedules.
	LaneShared Lane = iota
	// LaneOwn: the endpoint's own consumers on the events and deliveries streams.
	LaneOwn
)

// String is the lane as the endpoint's status.lane shows it.
func (l Lane) String() string {
	if l == LaneOwn {
		return "Own"
	}
	return "Shared"
}

// ParseLane reads status.lane; ok is false when it names no lane (not yet set).
func ParseLane(s string) (l Lane, ok bool) {
	switch s {
	case "Own":
		return LaneOwn, true
	case "Shared":
		return LaneShared, true
	}
	return LaneShared, false
}

// LaneOf is the lane of an endpoint with spec: its own when it is dedicated or orders per key.
func LaneOf(spec *v1alpha1.WebhookEndpointSpec) Lane {
	if spec == nil {
		return LaneShared
	}
	if spec.Dispatcher != nil && spec.Dispatcher.Dedicated {
		return LaneOwn
	}
	if spec.Ordering != nil && spec.Ordering.Mode == v1alpha1.OrderingPerKey {
		return LaneOwn
	}
	return LaneShared
}

// LaneNow is the lane endpoint ep's deliveries take now: what its status says (the controller
// moves an endpoint between lanes), else what its spec asks for.
func LaneNow(ep *v1alpha1.WebhookEndpoint) Lane {
	if l, ok := ParseLane(ep.Status.Lane); ok {
		return l
	}
	return LaneOf(&ep.Spec)
}

// QueueSubject is where the deliveries of a shared-lane endpoint are published (replays,
// test deliveries, retries when due, deliveries brought back from its park).
func (n NamespaceNames) QueueSubject(endpoint string) string {
	return n.names.InternalPrefix + ".q." + n.ns + "." + EndpointToken(endpoint)
}

// QueueFilter matches the queue subjects of every shared-lane endpoint of the namespace: the
// queue consumer's filter.
func (n NamespaceNames) QueueFilter() string {
	return n.names.InternalPrefix + ".q." + n.ns + ".>"
}

// ParkSubject is where a shared-lane endpoint keeps what it cannot deliver now, in order, read
// by no consumer; its dispatcher moves it back to the queue subject when the endpoint can
// deliver again.
func (n NamespaceNames) ParkSubject(endpoint string) string {
	return n.names.InternalPrefix + ".h." + n.ns + "." + EndpointToken(endpoint)
}

// ParkFilter matches the park subjects of every endpoint of the namespace.
func (n NamespaceNames) ParkFilter() string {
	return n.names.InternalPrefix + ".h." + n.ns + ".>"
}

// ScheduleSubject is where one scheduled retry of a shared-lane endpoint waits until due (the
// server then publishes it onto QueueSubject).
func (n NamespaceNames) ScheduleSubject(endpoint, deliveryID string) string {
	return n.names.InternalPrefix + ".s." + n.ns + "." + EndpointToken(endpoint) + "." + deliveryID
}

// ScheduleFilter matches every scheduled retry of one shared-lane endpoint.
func (n NamespaceNames) ScheduleFilter(endpoint string) string {
	return n.names.InternalPrefix + ".s." + n.ns + "." + EndpointToken(endpoint) + ".>"
}

// DeliveryTarget is where deliveries of an endpoint in lane are published: its queue subject
// on the shared lane, its delivery subject on its own.
func (n NamespaceNames) DeliveryTarget(endpoint string, lane Lane) string {
	if lane == LaneOwn {
		return n.DeliverySubject(endpoint)
	}
	return n.QueueSubject(endpoint)
}

// RetryTarget is where one scheduled retry of an endpoint in lane waits, and the subject the
// server publishes it onto when due.
func (n NamespaceNames) RetryTarget(endpoint, deliveryID string, lane Lane) (wait, target string) {
	if lane == LaneOwn {
		return n.RetrySubject(endpoint, deliveryID), n.DeliverySubject(endpoint)
	}
	return n.ScheduleSubject(endpoint, deliveryID), n.QueueSubject(endpoint)
}

// DeliveryTargets are every subject a delivery of the namespace's endpoints may be published
// to by a writer that knows only the endpoint (one token per endpoint): the delivery subjects
// of the own lane and the queue subjects of the shared one.
func (n NamespaceNames) DeliveryTargets() []string {
	return []string{n.DeliverySubject("*"), n.QueueSubject("*")}
}

// WaitingFilter matches what waits for endpoint on the deliveries stream, whatever its lane:
// its delivery subject (own lane), its queue and its park (shared lane); every endpoint of the
// namespace when endpoint is empty.
func (n NamespaceNames) WaitingFilter(endpoint string) string {
	token := "*"
	if endpoint != "" {
		token = EndpointToken(endpoint)
	}
	return n.names.InternalPrefix + ".*." + n.ns + "." + token
}

// ScheduledFilter matches the scheduled retries on the deliveries stream, whatever their lane
// (RetrySubject, ScheduleSubject): of endpoint (every endpoint when empty) and of delivery id
// (every delivery when empty).
func (n NamespaceNames) ScheduledFilter(endpoint, deliveryID string) string {
	token, last := "*", ">"
	if endpoint != "" {
		token = EndpointToken(endpoint)
	}
	if deliveryID != "" {
		last = deliveryID
	}
	return n.names.InternalPrefix + ".*." + n.ns + "." + token + "." + last
}

// Kind is the kind token of a subject of the namespace's deliveries stream ("d", "r", "q",
// "h", "s"), empty for any other subject.
func (n NamespaceNames) Kind(subject string) string {
	rest, ok := strings.CutPrefix(subject, n.names.InternalPrefix+".")
	if !ok {
		return ""
	}
	kind, _, _ := strings.Cut(rest, ".")
	return kind
}

// IsParked reports whether subject is a park subject (ParkSubject).
func (n NamespaceNames) IsParked(subject string) bool { return n.Kind(subject) == "h" }

// IsQueued reports whether subject is a queue subject (QueueSubject).
func (n NamespaceNames) IsQueued(subject string) bool { return n.Kind(subject) == "q" }

// IntakeConsumer is the durable consumer through which the shared dispatcher of namespace
// reader reads an events stream: its own namespace's, and each source namespace's its
// endpoints read (spec.sourceNamespaces). One per (reader, stream), whatever the number of
// endpoints.
func IntakeConsumer(reader string) string { return consumerName("in_", reader, "") }

// QueueConsumer is the durable consumer of the namespace's queue subjects (QueueFilter) on its
// deliveries stream, pulled by its shared dispatcher.
func (n NamespaceNames) QueueConsumer() string { return consumerName("q_", n.ns, "") }

// Shared-lane consumers' settings.
const (
	// IntakeMaxAckPending bounds the events one intake consumer has out at once, across the
	// dispatcher's replicas. The dispatcher parks what an endpoint cannot take soon, so a slow
	// or dead endpoint holds at most a small share of it.
	IntakeMaxAckPending = 20000
	// QueueMaxAckPending bounds the deliveries the queue consumer has out at once.
	QueueMaxAckPending = 10000
	// SharedAckWait is the shared consumers' ack wait. A dispatcher reports every message it
	// still works on in progress well within it (an attempt may take up to two minutes), so it
	// bounds how long a message a crashed replica held waits before another replica gets it.
	SharedAckWait = 30 * time.Second
)

// IntakeConsumerConfig is the configuration of the intake consumer of namespace reader on this
// namespace's events stream: every event of the namespace, from start on.
func (s Set) IntakeConsumerConfig(reader string, start ConsumerStart) jetstream.ConsumerConfig {
	desc := "webhook-operator: intake of " + reader + "'s shared dispatcher"
	if reader != s.ns {
		desc += ", reading the events of " + s.ns
	}
	cc := jetstream.ConsumerConfig{
		Durable:       IntakeConsumer(reader),
		Description:   desc,
		FilterSubject: s.EventsFilter(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       SharedAckWait,
		MaxDeliver:    -1,
		MaxAckPending: IntakeMaxAckPending,
	}
	start.apply(&cc)
	return cc
}

// QueueConsumerConfig is the configuration of the namespace's queue consumer on its deliveries
// stream.
func (s Set) QueueConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       s.QueueConsumer(),
		Description:   "webhook-operator: due deliveries of " + s.ns + "'s shared-lane endpoints",
		FilterSubject: s.QueueFilter(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       SharedAckWait,
		MaxDeliver:    -1,
		MaxAckPending: QueueMaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// EnsureIntakeConsumer creates the intake consumer of namespace reader on this namespace's
// events stream, unless it exists (its position is then left alone). It starts with the events
// stored since earliest, when the first of the reader's shared-lane endpoints joined the
// shared lane (status.sharedSince: its creation, so what was published while it was being
// wired reaches it; or when it left consumers of its own, which deliver what came before), or
// right after what the router of an older version settled when that one is still there.
func (s Set) EnsureIntakeConsumer(ctx context.Context, js jetstream.JetStream, reader string, earliest time.Time) error {
	stream := s.EventsStream()
	name := IntakeConsumer(reader)
	if _, err := js.Consumer(ctx, stream, name); err == nil {
		return nil
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return err
	}
	start := ConsumerStart{Time: earliest}
	if r, err := js.Consumer(ctx, stream, RouterConsumer(reader, "")); err == nil {
		// The router of an earlier version wrote the deliveries of what it settled.
		start = ConsumerStart{Seq: r.CachedInfo().AckFloor.Stream + 1}
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return err
	}
	if start.Seq == 0 && start.Time.IsZero() {
		start.Time = time.Now()
	}
	_, err := js.CreateConsumer(ctx, stream, s.IntakeConsumerConfig(reader, start))
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return nil
	}
	return err
}

// EnsureQueueConsumer creates or updates the namespace's queue consumer.
func (s Set) EnsureQueueConsumer(ctx context.Context, js jetstream.JetStream) error {
	_, err := js.CreateOrUpdateConsumer(ctx, s.DeliveriesStream(), s.QueueConsumerConfig())
	return err
}

// EnsureSharedLane creates the namespace's queue consumer and its intake consumer on its own
// events stream (EnsureIntakeConsumer, earliest the oldest shared-lane endpoint's creation).
func (s Set) EnsureSharedLane(ctx context.Context, js jetstream.JetStream, earliest time.Time) error {
	if err := s.EnsureQueueConsumer(ctx, js); err != nil {
		return err
	}
	return s.EnsureIntakeConsumer(ctx, js, s.ns, earliest)
}

// SharedLaneResidue is how many deliveries of one shared-lane endpoint wait in the deliveries
// stream: queued (due), parked, and scheduled retries.
func (s Set) SharedLaneResidue(ctx context.Context, js jetstream.JetStream, endpoint string) (uint64, error) {
	st, err := js.Stream(ctx, s.DeliveriesStream())
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, f := range []string{s.QueueSubject(endpoint), s.ParkSubject(endpoint), s.ScheduleFilter(endpoint)} {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return 0, err
		}
		for _, c := range info.State.Subjects {
			n += c
		}
	}
	return n, nil
}

// MoveRetries moves the retries endpoint's own lane scheduled (on RetrySubject, due onto its
// delivery subject) to the shared lane (ScheduleSubject, due onto its queue subject), keeping
// each one's due time, so that its own deliveries consumer can be drained and deleted. It
// reports how many are left to move (a retry due meanwhile goes its old way).
func (s Set) MoveRetries(ctx context.Context, js jetstream.JetStream, endpoint string) (left int, err error) {
	st, err := js.Stream(ctx, s.DeliveriesStream())
	if err != nil {
		return 0, err
	}
	filter := s.RetryFilter(endpoint)
	from := uint64(1)
	for {
		msgs, err := nextMessages(ctx, st, filter, from, 64)
		if err != nil || len(msgs) == 0 {
			return 0, err
		}
		for _, m := range msgs {
			from = m.Sequence + 1
			id := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
			out := &nats.Msg{Subject: s.ScheduleSubject(endpoint, id), Header: nats.Header{}, Data: m.Data}
			for k, v := range m.Header {
				if !storeHeader(k) {
					out.Header[k] = v
				}
			}
			out.Header.Set("Nats-Schedule-Target", s.QueueSubject(endpoint))
			out.Header.Set(jetstream.MsgIDHeader, out.Header.Get(jetstream.MsgIDHeader)+"/shared")
			if _, err := js.PublishMsg(ctx, out); err != nil {
				return 1, err
			}
			if err := st.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				return 1, err
			}
		}
	}
}

// storeHeader says header k is one the server adds to a message it returns (a direct get's
// stream, subject, sequence and time), not one of the message's own: copied into a new
// message it would name the old subject, and a reader would take the copy for the original.
func storeHeader(k string) bool {
	switch k {
	case jetstream.StreamHeader, jetstream.SubjectHeader, jetstream.SequenceHeader, jetstream.TimeStampHeaer,
		jetstream.LastSequenceHeader, "Nats-Num-Pending", "Nats-UpTo-Sequence":
		return true
	}
	return false
}

// nextMessages reads up to n messages of st matching filter from sequence from on.
func nextMessages(ctx context.Context, st jetstream.Stream, filter string, from uint64, n int) ([]*jetstream.RawStreamMsg, error) {
	var out []*jetstream.RawStreamMsg
	for len(out) < n {
		m, err := st.GetMsg(ctx, from, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, m)
		from = m.Sequence + 1
	}
	return out, nil
}
