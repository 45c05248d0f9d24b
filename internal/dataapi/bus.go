package dataapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/webhook-operator/webhook-operator/internal/deliveries"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Bus is the server's NATS connection and the JetStream layout it reads.
type Bus struct {
	NC      *nats.Conn
	JS      jetstream.JetStream
	Streams streams.Config
	// MaxEventBytes bounds an event's data (the installation's --max-event-bytes; 0: 1 MiB).
	MaxEventBytes int
	// Purger, when set, connects as namespace ns's purger for one purge and returns that
	// connection, which done closes: through the auth callout the server's own identity may
	// delete nothing (natsauth.RoleDataAPI), and a purge connects as the namespace's purger
	// (natsauth.PurgeUser). Nil: the server's connection purges.
	Purger func(ctx context.Context, ns string) (nc *nats.Conn, js jetstream.JetStream, done func(), err error)
}

// purger is the connection a purge of namespace ns uses.
func (b *Bus) purger(ctx context.Context, ns string) (*nats.Conn, jetstream.JetStream, func(), error) {
	if b.Purger == nil {
		return b.NC, b.JS, func() {}, nil
	}
	return b.Purger(ctx, ns)
}

// SyncQueueLen bounds the channel of each synchronous subscription on the server's NATS
// connection. Every stored-message read subscribes for its replies (internal/streamread), and
// nats.go gives each such subscription a channel of 65,536 messages by default: 512 KiB
// allocated with every read, for replies that are at most a batch of 256 messages, its end, and
// up to 1,000 stray replies a read drops. ConnectOptions sets it.
const SyncQueueLen = 2048

// ConnectOptions are the options of the server's NATS connection, besides the installation's.
func ConnectOptions() []nats.Option {
	return []nats.Option{nats.SyncQueueLen(SyncQueueLen)}
}

// MaxConcurrentReads bounds the requests reading the streams at once (lists, gets, payloads):
// each holds up to a page's messages, so the server's memory stays bounded whatever the number
// of clients; the others wait their turn, at most until their request's time runs out.
const MaxConcurrentReads = 4

// readSlots are the turns to read the streams (MaxConcurrentReads), made once per process.
var readSlots = make(chan struct{}, MaxConcurrentReads)

// read waits for a turn to read the streams and returns its release; a request whose time
// runs out first is a 429 that says so.
func (b *Bus) read(ctx context.Context) (func(), error) {
	select {
	case readSlots <- struct{}{}:
		return func() { <-readSlots }, nil
	case <-ctx.Done():
		return nil, apierrors.NewTooManyRequests(fmt.Sprintf("the server reads the streams for %d requests at once and this one waited its whole time for a turn; retry", MaxConcurrentReads), 1)
	}
}

// maxPayload is the server's maximum message size.
func (b *Bus) maxPayload() int64 {
	if b.NC == nil {
		return 0
	}
	return b.NC.MaxPayload()
}

// reader is the deliveries reader on the bus.
func (b *Bus) reader() *deliveries.Reader {
	return &deliveries.Reader{NC: b.NC, JS: b.JS, Streams: b.Streams}
}

// available answers 503 while the connection is down (it reconnects by itself).
func (b *Bus) available() error {
	if b.NC == nil || b.NC.IsConnected() {
		return nil
	}
	why := "disconnected"
	if err := b.NC.LastError(); err != nil {
		why = err.Error()
	}
	return unavailable(fmt.Sprintf("NATS is unreachable (%s); the server reconnects by itself, retry in a few seconds", why))
}

// unavailable is a 503 with a reason. It has no Retry-After: client-go (and so kubectl) would
// retry such an answer by itself, ten times, and the caller would wait a minute for the reason
// instead of reading it at once; the message says when to retry.
func unavailable(msg string) error {
	return apierrors.NewServiceUnavailable(msg)
}

// apiError turns an error of reading the streams into the API's answer: bad queries 400,
// connection trouble 503, anything else 500 with its text.
func (b *Bus) apiError(err error, gr schema.GroupResource) error {
	var broad *deliveries.TooBroadError
	var status apierrors.APIStatus
	switch {
	case err == nil:
		return nil
	case errors.As(err, &status):
		return err
	case errors.Is(err, deliveries.ErrBadQuery), errors.As(err, &broad):
		return apierrors.NewBadRequest(err.Error())
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrNoServers),
		errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrNoResponders), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, nats.ErrJetStreamNotEnabled):
		if a := b.available(); a != nil {
			return a
		}
		return unavailable(fmt.Sprintf("reading the streams did not complete (%v); retry in a few seconds", err))
	}
	return apierrors.NewGenericServerResponse(http.StatusInternalServerError, "list", gr, "", err.Error(), 0, false)
}
