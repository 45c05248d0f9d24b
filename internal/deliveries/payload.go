package deliveries

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
)

// Payload is the personal data of a delivery: the event's body and headers as stored, the
// request headers of its last attempt as sent (secrets redacted) and the last response's body.
type Payload struct {
	// Event is the event's body; nil when it is not found (the events stream no longer holds
	// it) or was removed.
	Event []byte
	// EventHeaders are the producer's headers of the event (no JetStream or operator header).
	EventHeaders nats.Header
	// EventFound is false when the event's body could not be found.
	EventFound     bool
	RequestHeaders map[string]string
	Response       *records.Response
	// Removed says why the payload is gone (records.PayloadExpired, PayloadErased).
	Removed string
}

// Payload reads the payload of e, an entry of namespace ns this package read: the message that
// holds a live delivery (its copy in the deliveries stream, or its event), else the event the
// delivery-log record points at, if the events stream still holds it.
func (r *Reader) Payload(ctx context.Context, ns string, e *Entry) (Payload, error) {
	p := Payload{RequestHeaders: e.RequestHeaders, Removed: e.PayloadRemoved}
	if e.LastResponse != nil && e.LastResponse.Body != "" {
		resp := *e.LastResponse
		p.Response = &resp
	}
	if p.Removed != "" {
		return p, nil
	}
	names := r.Streams.For(ns)
	var stream, filter string
	seq := e.Seq
	switch e.From {
	case FromDeliveries, FromRetries:
		stream, filter = names.DeliveriesStream(), ">"
	case FromEvents:
		stream, filter = names.EventsStream(), names.EventsFilter()
	default:
		stream, filter, seq = names.EventsStream(), names.EventsFilter(), e.EventSeq
	}
	if seq == 0 {
		return p, nil
	}
	st, err := streamread.Open(ctx, r.NC, r.JS, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return p, nil
	}
	if err != nil {
		return p, err
	}
	msgs, err := st.Forward(ctx, filter, seq, 1)
	if err != nil {
		return p, fmt.Errorf("reading the payload of %s: %w", e.ID, err)
	}
	if len(msgs) == 0 || msgs[0].Seq != seq {
		return p, nil
	}
	m := &msgs[0]
	if e.From == FromLog && records.EventID(stream, seq, m.Header) != e.EventID {
		return p, nil // another event: the one logged is gone
	}
	p.Event, p.EventFound = m.Data, true
	p.EventHeaders = nats.Header{}
	records.CopyEventHeaders(p.EventHeaders, m.Header)
	return p, nil
}
