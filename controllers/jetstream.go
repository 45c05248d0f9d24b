package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// NATSTimeout bounds every JetStream call of a reconcile, so an unreachable or slow server
// holds one worker for at most this long and never the others.
const NATSTimeout = 5 * time.Second

// disconnectGrace is how long the connection must stay down before every endpoint is
// re-reconciled to report NATSUnavailable; a blip shorter than this rewrites no status.
const disconnectGrace = 3 * time.Second

// ErrNATSUnavailable wraps every failure to reach JetStream.
var ErrNATSUnavailable = errors.New("NATS is unavailable")

// JetStream is the controller's connection to NATS. It never fails for want of a server:
// it connects in the background, reconnects forever, creates the streams and bucket once
// connected (again after every reconnect, in case the server lost them), and tells the
// reconcilers when the connection comes or goes, so status follows without a restart.
type JetStream struct {
	cfg streams.Config
	url string
	nc  *nats.Conn
	js  jetstream.JetStream

	ensured atomic.Bool
	ensure  sync.Mutex

	changed chan struct{}
	mu      sync.Mutex
	subs    []chan connectionEvent
}

// ConnectJetStream connects to NATS as the controller. It returns at once even when no
// server answers; only a bad configuration (an unreadable CA file) is an error.
func ConnectJetStream(cfg *opconfig.Config) (*JetStream, error) {
	j := &JetStream{cfg: cfg.Streams, url: cfg.NATS.URL, changed: make(chan struct{}, 1)}
	nc, js, err := cfg.Connect("webhook-operator-controller",
		nats.ConnectHandler(func(*nats.Conn) { j.signal() }),
		nats.ReconnectHandler(func(*nats.Conn) { j.ensured.Store(false); j.signal() }),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { j.signal() }),
	)
	if err != nil {
		return nil, err
	}
	j.nc, j.js = nc, js
	return j, nil
}

// Close closes the connection.
func (j *JetStream) Close() { j.nc.Close() }

// Config is the JetStream layout.
func (j *JetStream) Config() streams.Config { return j.cfg }

// Connected reports whether the connection is up right now.
func (j *JetStream) Connected() bool { return j.nc.IsConnected() }

func (j *JetStream) signal() {
	select {
	case j.changed <- struct{}{}:
	default:
	}
}

// connectionEvent says the connection came up, or has been down for disconnectGrace.
type connectionEvent = event.TypedGenericEvent[string]

// subscribe returns a channel that receives an event whenever the connection came up or has
// been down for disconnectGrace. Call before Start.
func (j *JetStream) subscribe() <-chan connectionEvent {
	j.mu.Lock()
	defer j.mu.Unlock()
	c := make(chan connectionEvent, 1)
	j.subs = append(j.subs, c)
	return c
}

func (j *JetStream) notify() {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, c := range j.subs {
		select {
		case c <- connectionEvent{Object: "nats"}:
		default:
		}
	}
}

// Start creates the streams as soon as the server answers and relays connection changes
// until ctx ends. It is a manager Runnable: it runs on the leader only.
func (j *JetStream) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("jetstream")
	j.signal()
	var grace <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-j.changed:
			if !j.Connected() {
				grace = time.After(disconnectGrace)
				continue
			}
			grace = nil
			if err := j.Ensure(ctx); err != nil {
				log.Error(err, "creating streams; retrying when reconciling")
			}
			j.notify()
		case <-grace:
			grace = nil
			if !j.Connected() {
				log.Info("NATS has been unreachable for a while; reporting it on every endpoint", "url", j.url)
				j.notify()
			}
		}
	}
}

// Ensure creates or updates the streams and the bucket unless that was done since the last
// (re)connection.
func (j *JetStream) Ensure(ctx context.Context) error {
	if j.ensured.Load() {
		return nil
	}
	j.ensure.Lock()
	defer j.ensure.Unlock()
	if j.ensured.Load() {
		return nil
	}
	if !j.Connected() {
		return fmt.Errorf("%w: not connected to %s", ErrNATSUnavailable, j.url)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*NATSTimeout)
	defer cancel()
	if err := streams.Ensure(ctx, j.js, j.cfg); err != nil {
		return fmt.Errorf("%w: %w", ErrNATSUnavailable, err)
	}
	j.ensured.Store(true)
	return nil
}

// Do runs f with a bounded context once the streams exist. It fails fast when the connection
// is down, and creates the streams again when f finds one missing. Every failure wraps
// ErrNATSUnavailable except f's own not-found errors, returned as they are.
func (j *JetStream) Do(ctx context.Context, f func(ctx context.Context, js jetstream.JetStream) error) error {
	for attempt := 0; ; attempt++ {
		if !j.Connected() {
			return fmt.Errorf("%w: not connected to %s", ErrNATSUnavailable, j.url)
		}
		if err := j.Ensure(ctx); err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, NATSTimeout)
		err := f(cctx, j.js)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, jetstream.ErrStreamNotFound) && attempt == 0:
			j.ensured.Store(false)
			continue
		case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrMsgNotFound):
			return err
		case errors.Is(err, ErrNATSUnavailable):
			return err
		default:
			return fmt.Errorf("%w: %w", ErrNATSUnavailable, err)
		}
	}
}
