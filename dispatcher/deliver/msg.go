package deliver

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/intake"
	"github.com/webhook-operator/webhook-operator/internal/pull"
)

// pulled is a JetStream message a worker takes, as a jetstream.Msg: its settlement (Ack, Nak,
// InProgress) is the only thing that differs between where it came from.
//
//   - brought by the pull.Puller from one of the worker's own consumers: a message over the core
//     message, acknowledged through its reply subject (src is its source);
//   - one endpoint's view of a message of the shared lane's intake or queue consumer (view
//     is set): many endpoints may see one message, which is acknowledged once every view is
//     settled; a view handed back is parked for its endpoint instead (see dispatcher/intake);
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
	// view is the shared lane's view this is, for this worker.
	view *intake.View
	// parked is the park this message was read from.
	parked *parkRef
}

var _ jetstream.Msg = (*pulled)(nil)

// received is a message a source brought, with its metadata.
func received(m *pull.Msg) *pulled {
	return &pulled{msg: m.Msg, src: m.Source, stamp: m.Stamp, md: pull.JetStreamMeta(m.Meta)}
}

// viewed is a view of the shared lane a worker takes (or parks).
func viewed(v *intake.View) *pulled {
	return &pulled{msg: v.Msg, md: v.Meta, stamp: v.Stamp, view: v}
}

func (m *pulled) Metadata() (*jetstream.MsgMetadata, error) {
	if m.md != nil {
		return m.md, nil
	}
	md, err := m.msg.Metadata()
	if err != nil {
		return nil, err
	}
	m.md = pull.JetStreamMeta(md)
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
	case m.view != nil:
		m.view.Ack()
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
	case m.view != nil:
		m.view.HandBack(delay)
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
	case m.view != nil:
		m.view.Progress()
		return nil
	case m.parked != nil:
		return nil // read by direct get: nothing times out
	}
	return m.msg.InProgress()
}

// Term ends the message for good (the shared lane's: acknowledged).
func (m *pulled) Term() error {
	if m.view != nil || m.parked != nil {
		return m.Ack()
	}
	return m.msg.Term()
}

func (m *pulled) TermWithReason(reason string) error { return m.Term() }
