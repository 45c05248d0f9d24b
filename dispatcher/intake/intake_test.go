package intake_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/intake"
	"github.com/webhook-operator/webhook-operator/internal/pull"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// taker is an endpoint of the tests: it holds up to share views at once, or (share 0) takes
// none, and keeps what it was given and what was parked for it.
type taker struct {
	name  string
	cfg   *endpoint.Config
	share int64
	out   atomic.Int64

	mu     sync.Mutex
	taken  []*intake.View
	parked []*intake.View
}

func (t *taker) Name() string             { return t.name }
func (t *taker) Config() *endpoint.Config { return t.cfg }
func (t *taker) Share() int64             { return t.share }
func (t *taker) Reserve() bool {
	for {
		n := t.out.Load()
		if n >= t.share {
			return false
		}
		if t.out.CompareAndSwap(n, n+1) {
			return true
		}
	}
}
func (t *taker) Take(v *intake.View) { t.mu.Lock(); t.taken = append(t.taken, v); t.mu.Unlock() }
func (t *taker) Returned()           { t.out.Add(-1) }
func (t *taker) Parked(int64)        {}
func (t *taker) Changed()            {}

// Park settles the view as a park that stored its copy does.
func (t *taker) Park(_ context.Context, _ *endpoint.Config, v *intake.View) {
	t.mu.Lock()
	t.parked = append(t.parked, v)
	t.mu.Unlock()
	v.Ack()
}

func (t *taker) counts() (taken, parked int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.taken), len(t.parked)
}

// budget is the byte budget of the tests: what is held.
type budget struct{ held atomic.Int64 }

func (b *budget) Force(n int64)   { b.held.Add(n) }
func (b *budget) Release(n int64) { b.held.Add(-n) }

// One event matching two endpoints is handed to each as a view of its own: the one with room
// takes it, the paused one has it parked at once; an event no endpoint takes is acknowledged
// at once; the others are acknowledged only once every view of them is settled, and then the
// budget holds nothing.
func TestAnEventIsAcknowledgedOnceEveryEndpointsViewIsSettled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := testenv.NewNATS(t)
	nc, js, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	layout := streams.DefaultConfig()
	set := layout.For("team-a")
	if err := set.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Minute)
	if err := set.EnsureSharedLane(ctx, js, since); err != nil {
		t.Fatal(err)
	}
	puller, err := pull.NewPuller(nc, 1<<20, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(puller.Stop)
	mem := &budget{}
	in := intake.New(intake.Parts{Settings: intake.Settings{Streams: layout, Names: set.NamespaceNames}, Puller: puller, JS: js,
		Memory: mem, Run: func(f func()) { go f() }, Log: logr.Discard()})
	cfg := func(name string) *endpoint.Config {
		return &endpoint.Config{Name: name, EventTypes: []string{"order.*"}, Lane: streams.LaneShared, SharedSince: since}
	}
	open := &taker{name: "open", cfg: cfg("open"), share: 8}
	paused := &taker{name: "paused", cfg: cfg("paused")}
	in.SetRoutes([]intake.Taker{open, paused})
	in.Start(ctx)
	defer func() { in.Stop(); in.Wait() }()

	const n = 3
	for i := range n {
		if _, err := js.Publish(ctx, set.EventSubject("order.created"), fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, set.EventSubject("invoice.paid"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		taken, _ := open.counts()
		_, parked := paused.counts()
		if taken != n || parked != n {
			return fmt.Errorf("open took %d, paused had %d parked; want %d each", taken, parked, n)
		}
		return nil
	}, "every view handed")
	cons, err := js.Consumer(ctx, set.EventsStream(), streams.IntakeConsumer("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	// Only the event no endpoint takes is acknowledged: the others have a view outstanding.
	testenv.Eventually(t, 10*time.Second, func() error {
		ci, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if ci.NumAckPending != n {
			return fmt.Errorf("%d unacknowledged, want %d", ci.NumAckPending, n)
		}
		return nil
	}, "the events with a view outstanding unacknowledged")
	if open.out.Load() != n {
		t.Errorf("open holds %d places, want %d", open.out.Load(), n)
	}
	for _, v := range open.taken {
		if string(v.Msg.Data) == "" || v.Meta == nil || v.Meta.Stream != set.EventsStream() {
			t.Errorf("a view without its message or metadata: %+v", v)
		}
		v.Ack()
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		ci, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if ci.NumAckPending != 0 || ci.AckFloor.Stream != n+1 {
			return fmt.Errorf("%d unacknowledged, acknowledged up to %d; want none and %d", ci.NumAckPending, ci.AckFloor.Stream, n+1)
		}
		return nil
	}, "every event acknowledged")
	if got := open.out.Load(); got != 0 {
		t.Errorf("open holds %d places after its views were settled", got)
	}
	if got := mem.held.Load(); got != 0 {
		t.Errorf("the budget holds %d bytes after every view was settled", got)
	}
}
