package deliver

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pulled is a JetStream message brought by the Puller: a jetstream.Msg over the core message,
// acknowledged through its reply subject. Its metadata (parsed from the reply subject) is read
// once.
type pulled struct {
	msg *nats.Msg
	md  *jetstream.MsgMetadata
	// src is the source it came from.
	src *Source
	// resent says the source received a message of this stream sequence or a later one
	// before: this one is delivered again (see Source.maxSeq).
	resent bool
}

var _ jetstream.Msg = (*pulled)(nil)

func (m *pulled) Metadata() (*jetstream.MsgMetadata, error) {
	if m.md != nil {
		return m.md, nil
	}
	md, err := m.msg.Metadata()
	if err != nil {
		return nil, err
	}
	m.md = &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: md.Sequence.Stream, Consumer: md.Sequence.Consumer},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp, Stream: md.Stream,
		Consumer: md.Consumer, Domain: md.Domain}
	return m.md, nil
}

func (m *pulled) Data() []byte                           { return m.msg.Data }
func (m *pulled) Headers() nats.Header                   { return m.msg.Header }
func (m *pulled) Subject() string                        { return m.msg.Subject }
func (m *pulled) Reply() string                          { return m.msg.Reply }
func (m *pulled) Ack() error                             { return m.msg.Ack() }
func (m *pulled) DoubleAck(ctx context.Context) error    { return m.msg.AckSync(nats.Context(ctx)) }
func (m *pulled) Nak() error                             { return m.msg.Nak() }
func (m *pulled) NakWithDelay(delay time.Duration) error { return m.msg.NakWithDelay(delay) }
func (m *pulled) InProgress() error                      { return m.msg.InProgress() }
func (m *pulled) Term() error                            { return m.msg.Term() }
func (m *pulled) TermWithReason(reason string) error     { return m.msg.Term() }
