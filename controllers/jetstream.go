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
// it connects in the background, reconnects forever, creates a namespace's streams and bucket
// when asked (again after every reconnect, in case the server lost them), and tells the
// reconcilers when the connection comes or goes, so status follows without a restart.
type JetStream struct {
	cfg streams.Config
	url string
	nc  *nats.Conn
	js  jetstream.JetStream

	// made holds when what each namespace needs of the broker was last made sure of since
	// the last (re)connection (see ensureOnce): its set (Ensure) and its shared lane
	// (EnsureSharedLane). generation counts reconnections, so a call that raced one is not
	// remembered.
	ensureMu   sync.Mutex
	made       map[madeKey]time.Time
	generation atomic.Uint64
	// making holds what is being made sure of now: a concurrent reconcile of the same
	// namespace waits for it instead of asking the meta leader the same again (a thousand
	// endpoints applied at once start sixteen reconciles, most of them in the same few
	// namespaces).
	making map[madeKey]*making

	changed chan struct{}
	mu      sync.Mutex
	subs    []chan connectionEvent

	// bounds, when set, reads a namespace's own storage bounds (its WebhookQuota's), which
	// Ensure gives its streams in place of the installation's.
	bounds func(ctx context.Context, ns string) (streams.Bounds, error)
}

// ConnectJetStream connects to NATS as the controller. It returns at once even when no
// server answers; only a bad configuration (an unreadable CA file) is an error.
func ConnectJetStream(cfg *opconfig.Config) (*JetStream, error) {
	j := &JetStream{cfg: cfg.Streams, url: cfg.NATS.URL, changed: make(chan struct{}, 1), made: map[madeKey]time.Time{}, making: map[madeKey]*making{}}
	nc, js, err := cfg.Connect("webhook-operator-controller",
		nats.ConnectHandler(func(*nats.Conn) { j.signal() }),
		nats.ReconnectHandler(func(*nats.Conn) { j.forgetAll(); j.signal() }),
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

// Start relays connection changes until ctx ends. It is a manager Runnable: it runs on the
// leader only.
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

func (j *JetStream) forgetAll() {
	j.ensureMu.Lock()
	defer j.ensureMu.Unlock()
	j.generation.Add(1)
	clear(j.made)
}

func (j *JetStream) forget(ns string) {
	j.ensureMu.Lock()
	defer j.ensureMu.Unlock()
	delete(j.made, madeKey{madeSet, ns})
	delete(j.made, madeKey{madeLane, ns})
}

// madeKey names one thing made sure of for a namespace.
type madeKey struct {
	what madeWhat
	ns   string
}

type madeWhat int

const (
	madeSet  madeWhat = iota // its streams and bucket
	madeLane                 // its shared lane's queue and intake consumers
)

// making is one making sure of something for a namespace, under way: done is closed once
// err is set.
type making struct {
	done chan struct{}
	err  error
}

// ensureOnce runs do unless what was made sure of for ns less than fresh ago (0: at any
// time) since the last (re)connection, and remembers when it succeeds. While one call runs do
// for what and ns, the others wait for it and share its failure, or look again after its
// success.
func (j *JetStream) ensureOnce(what madeWhat, ns string, fresh time.Duration, do func() error) error {
	key := madeKey{what, ns}
	for {
		j.ensureMu.Lock()
		at, ok := j.made[key]
		if ok && (fresh == 0 || time.Since(at) < fresh) {
			j.ensureMu.Unlock()
			return nil
		}
		if m := j.making[key]; m != nil {
			j.ensureMu.Unlock()
			<-m.done
			if m.err != nil {
				return m.err
			}
			continue
		}
		m := &making{done: make(chan struct{})}
		j.making[key] = m
		gen := j.generation.Load()
		j.ensureMu.Unlock()

		m.err = do()
		j.ensureMu.Lock()
		delete(j.making, key)
		if m.err == nil && j.generation.Load() == gen {
			j.made[key] = time.Now()
		}
		j.ensureMu.Unlock()
		close(m.done)
		return m.err
	}
}

// laneRecheck is how long a namespace's shared lane, once made sure of, is taken as there: a
// consumer deleted by hand meanwhile is made again by a reconcile after it (or at once when a
// call finds a stream missing, or NATS reconnects). Every shared-lane endpoint's reconcile
// needs the lane, and thousands of endpoints applied at once need not ask the meta leader
// each time.
const laneRecheck = time.Minute

// EnsureSharedLane makes sure of namespace ns's shared lane with js (set.EnsureSharedLane,
// earliest the oldest shared-lane endpoint's creation) unless that was done in the last
// laneRecheck since the last (re)connection.
func (j *JetStream) EnsureSharedLane(ctx context.Context, js jetstream.JetStream, ns string, earliest time.Time) error {
	return j.ensureOnce(madeLane, ns, laneRecheck, func() error { return j.cfg.For(ns).EnsureSharedLane(ctx, js, earliest) })
}

// Ensure creates or updates namespace ns's streams and bucket unless that was done since the
// last (re)connection. Only the owner of the namespace's streams ConfigMap calls it (see
// StreamSets), so that every set created is removed with its namespace. A stream of another
// layout in the way is a *streams.ConflictError.
func (j *JetStream) Ensure(ctx context.Context, ns string) error {
	return j.ensureOnce(madeSet, ns, 0, func() error {
		if !j.Connected() {
			return fmt.Errorf("%w: not connected to %s", ErrNATSUnavailable, j.url)
		}
		set, err := j.set(ctx, ns)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, 2*NATSTimeout)
		defer cancel()
		if err := set.Ensure(ctx, j.js); err != nil {
			var conflict *streams.ConflictError
			var full *streams.StorageFullError
			if errors.As(err, &conflict) || errors.As(err, &full) {
				return err // NATS answers, but the installation must change
			}
			return fmt.Errorf("%w: %w", ErrNATSUnavailable, err)
		}
		return nil
	})
}

// set is namespace ns's set with its own storage bounds (its WebhookQuota's).
func (j *JetStream) set(ctx context.Context, ns string) (streams.Set, error) {
	set := j.cfg.For(ns)
	if j.bounds == nil {
		return set, nil
	}
	b, err := j.bounds(ctx, ns)
	if err != nil {
		return set, fmt.Errorf("reading the storage bounds of namespace %s: %w", ns, err)
	}
	return set.WithBounds(b), nil
}

// DeleteSet removes namespace ns's streams and bucket with everything they hold.
func (j *JetStream) DeleteSet(ctx context.Context, ns string) error {
	err := j.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error {
		return j.cfg.For(ns).Delete(ctx, js)
	})
	j.forget(ns)
	return err
}

// Do runs f with a bounded context. It fails fast when the connection is down. Every failure
// wraps ErrNATSUnavailable except f's own not-found errors (consumer, message), returned as
// they are; a missing stream of namespace ns (the server lost it, or the set is gone) makes
// the next Ensure of ns create it again, and wraps jetstream.ErrStreamNotFound.
func (j *JetStream) Do(ctx context.Context, ns string, f func(ctx context.Context, js jetstream.JetStream) error) error {
	return j.DoWithin(ctx, ns, NATSTimeout, f)
}

// DoWithin is Do with another bound than NATSTimeout, for work of many calls (a batch of a
// replay).
func (j *JetStream) DoWithin(ctx context.Context, ns string, timeout time.Duration, f func(ctx context.Context, js jetstream.JetStream) error) error {
	if !j.Connected() {
		return fmt.Errorf("%w: not connected to %s", ErrNATSUnavailable, j.url)
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	err := f(cctx, j.js)
	cancel()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		j.forget(ns)
		return fmt.Errorf("%w: %w", ErrNATSUnavailable, err)
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrMsgNotFound):
		return err
	case errors.Is(err, ErrNATSUnavailable):
		return err
	default:
		return fmt.Errorf("%w: %w", ErrNATSUnavailable, err)
	}
}

// EnsureAndDo ensures namespace ns's set, then runs f as Do does; when f finds a stream of
// ns missing, the set is created again and f runs once more.
func (j *JetStream) EnsureAndDo(ctx context.Context, ns string, f func(ctx context.Context, js jetstream.JetStream) error) error {
	for attempt := 0; ; attempt++ {
		if err := j.Ensure(ctx, ns); err != nil {
			return err
		}
		err := j.Do(ctx, ns, f)
		if attempt == 0 && errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		return err
	}
}
