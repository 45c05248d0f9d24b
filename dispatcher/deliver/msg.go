package deliver

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/pull"
)

// pulled is a JetStream message a worker takes, as a jetstream.Msg: its settlement (Ack, Nak,
// InProgress) is the only thing that differs between where it came from.
//
//   - brought by the pull.Puller from one of the worker's own consumers: a message over the core
//     message, acknowledged through its reply subject (src is its source);
//   - one endpoint's view of a message of the shared lane's intake or queue consumer (share
//     is set): many endpoints may see one message, which is acknowledged once every view is
//     settled; a view handed back is parked for its endpoint instead (see Intake);
//   - a message read from an endpoint's park (parked is set): acknowledged by deleting it.
//
// Its metadata (parsed from the reply subject, or made by the park reader) is read once.
type pulled struct {
	msg *nats.Msg
	md  *jetstream.MsgMetadata
	// src is the source it came from (its own consumers only).
	src *pull.Source
	// stamp is how it came (see again).
	stamp pull.Stamp
	// share is the shared-lane message this is a view of, for the worker owner; handed says
	// the worker holds it (counted in its sharedOut), parking that it is being parked.
	share   *shared
	owner   *Worker
	handed  bool
	parking bool
	// parked is the park this message was read from.
	parked *parkRef
}

var _ jetstream.Msg = (*pulled)(nil)

// received is a message a source brought, with its metadata.
func received(m *pull.Msg) *pulled {
	return &pulled{msg: m.Msg, src: m.Source, stamp: m.Stamp, md: jsMetadata(m.Meta)}
}

// jsMetadata is a message's metadata as jetstream.Msg gives it.
func jsMetadata(md *nats.MsgMetadata) *jetstream.MsgMetadata {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: md.Sequence.Stream, Consumer: md.Sequence.Consumer},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp, Stream: md.Stream,
		Consumer: md.Consumer, Domain: md.Domain}
}

func (m *pulled) Metadata() (*jetstream.MsgMetadata, error) {
	if m.md != nil {
		return m.md, nil
	}
	md, err := m.msg.Metadata()
	if err != nil {
		return nil, err
	}
	m.md = jsMetadata(md)
	return m.md, nil
}

func (m *pulled) Data() []byte                        { return m.msg.Data }
func (m *pulled) Headers() nats.Header                { return m.msg.Header }
func (m *pulled) Subject() string                     { return m.msg.Subject }
func (m *pulled) Reply() string                       { return m.msg.Reply }
func (m *pulled) DoubleAck(ctx context.Context) error { return m.Ack() }

// Ack settles the message: acknowledged (a view: one fewer outstanding; parked: deleted).
func (m *pulled) Ack() error {
	switch {
	case m.share != nil:
		m.share.settled(m, false, 0)
		return nil
	case m.parked != nil:
		return m.parked.delete()
	}
	return m.msg.Ack()
}

// Nak hands the message back (a view: parked for its endpoint; parked: left where it is).
func (m *pulled) Nak() error { return m.NakWithDelay(0) }

// NakWithDelay hands the message back, to come again after delay.
func (m *pulled) NakWithDelay(delay time.Duration) error {
	switch {
	case m.share != nil:
		m.share.handedBack(m, delay)
		return nil
	case m.parked != nil:
		m.parked.handBack()
		return nil
	}
	if delay > 0 {
		return m.msg.NakWithDelay(delay)
	}
	return m.msg.Nak()
}

// InProgress says the message is still being worked on.
func (m *pulled) InProgress() error {
	switch {
	case m.share != nil:
		m.share.progress()
		return nil
	case m.parked != nil:
		return nil // read by direct get: nothing times out
	}
	return m.msg.InProgress()
}

// Term ends the message for good (the shared lane's: acknowledged).
func (m *pulled) Term() error {
	if m.share != nil || m.parked != nil {
		return m.Ack()
	}
	return m.msg.Term()
}

func (m *pulled) TermWithReason(reason string) error { return m.Term() }
