package route

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/jsread"
)

// storedMsg is a message read from a stream (not delivered by a consumer) seen as a
// jetstream.Msg, so that the router's code reads it as it reads a delivered event. It cannot
// be acknowledged: nothing delivered it.
type storedMsg struct {
	m      jsread.Msg
	stream string
}

var errNotDelivered = errors.New("a stored message read directly cannot be acknowledged")

func (s storedMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Stream: s.stream, Sequence: jetstream.SequencePair{Stream: s.m.Seq}, Timestamp: s.m.Time}, nil
}
func (s storedMsg) Data() []byte                     { return s.m.Data }
func (s storedMsg) Headers() nats.Header             { return s.m.Header }
func (s storedMsg) Subject() string                  { return s.m.Subject }
func (s storedMsg) Reply() string                    { return "" }
func (s storedMsg) Ack() error                       { return errNotDelivered }
func (s storedMsg) DoubleAck(context.Context) error  { return errNotDelivered }
func (s storedMsg) Nak() error                       { return errNotDelivered }
func (s storedMsg) NakWithDelay(time.Duration) error { return errNotDelivered }
func (s storedMsg) InProgress() error                { return errNotDelivered }
func (s storedMsg) Term() error                      { return errNotDelivered }
func (s storedMsg) TermWithReason(string) error      { return errNotDelivered }
