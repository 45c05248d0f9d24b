package pull_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/pull"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// worker is a Handler that keeps what it is handed; room, when set, says what it wants of the
// source after every message (given how many it received).
type worker struct {
	mu      sync.Mutex
	msgs    []*pull.Msg
	changed atomic.Int32
	src     *pull.Source
	room    func(received int) int
}

func (w *worker) Pulled(m *pull.Msg) {
	w.mu.Lock()
	w.msgs = append(w.msgs, m)
	n, src := len(w.msgs), w.src
	w.mu.Unlock()
	if w.room != nil && src != nil {
		src.SetWant(w.room(n))
	}
}

func (w *worker) SourceChanged() { w.changed.Add(1) }

func (w *worker) received() []*pull.Msg {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*pull.Msg(nil), w.msgs...)
}

func setup(t *testing.T, n int, consumer *jetstream.ConsumerConfig) (*nats.Conn, jetstream.JetStream, *pull.Puller) {
	t.Helper()
	srv := testenv.NewNATS(t)
	nc, js, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := js.Publish(ctx, fmt.Sprintf("s.%d", i), []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	if consumer != nil {
		if _, err := js.CreateConsumer(ctx, "S", *consumer); err != nil {
			t.Fatal(err)
		}
	}
	p, err := pull.NewPuller(nc, 1<<20, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return nc, js, p
}

// A source keeps what its worker wants requested; once the worker wants nothing more it asks
// for nothing more, and what was requested still comes (a request never ends early, so nothing
// is left at the server until its ack wait), however much the consumer has.
func TestASourceRequestsWhatItsWorkerWants(t *testing.T) {
	_, _, p := setup(t, 200, &jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy})
	const want = 10
	// Wants nothing more from the first message on.
	w := &worker{room: func(int) int { return 0 }}
	src := p.Source("S", "c", w)
	w.mu.Lock()
	w.src = src
	w.mu.Unlock()
	src.SetWant(want)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(w.received()) >= want }, "the %d messages requested", want)
	time.Sleep(500 * time.Millisecond)
	if got := len(w.received()); got != want {
		t.Fatalf("received %d messages: %d were requested", got, want)
	}
	if out := src.Outstanding(); out != 0 {
		t.Fatalf("%d messages still requested with nothing wanted", out)
	}
	for i, m := range w.received() {
		if m.Meta.Sequence.Stream != uint64(i+1) || m.Source != src || m.Stamp.Again() {
			t.Fatalf("message %d: stream sequence %d, source %p (want %p), again %v", i, m.Meta.Sequence.Stream, m.Source, src, m.Stamp.Again())
		}
		if err := m.Msg.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	// Wanting again: the rest comes.
	w.mu.Lock()
	w.room = nil
	w.mu.Unlock()
	src.SetWant(50)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(w.received()) == 200 }, "all 200 messages")
}

// A consumer that does not exist yet is said to be missing, asked for again, and pulled once
// it exists; the worker hears of both changes.
func TestAMissingConsumerIsPulledOnceItExists(t *testing.T) {
	_, js, p := setup(t, 3, nil)
	w := &worker{}
	src := p.Source("S", "late", w)
	src.SetWant(10)
	testenv.Eventually(t, 10*time.Second, func() bool { return src.Missing() && w.changed.Load() >= 1 }, "the consumer said to be missing")
	if _, err := js.CreateConsumer(context.Background(), "S", jetstream.ConsumerConfig{Durable: "late", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(w.received()) == 3 }, "the three messages once the consumer exists")
	if src.Missing() || w.changed.Load() < 2 {
		t.Fatalf("missing %v after the consumer came, changes told %d", src.Missing(), w.changed.Load())
	}
}

// A message may have come again once the source saw a later one of the stream before it (a
// redelivery), or once the connection was made again after it came.
func TestAMessageThatMayHaveComeAgainIsStampedSo(t *testing.T) {
	nc, _, p := setup(t, 2, &jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
	w := &worker{}
	src := p.Source("S", "c", w)
	src.SetWant(10)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(w.received()) == 2 }, "both messages")
	first := w.received()
	if first[0].Stamp.Again() || first[1].Stamp.Again() {
		t.Fatal("a first delivery stamped as coming again")
	}
	_ = first[1].Msg.Ack()
	// Not acknowledged within its ack wait: the first comes again, after the second.
	testenv.Eventually(t, 10*time.Second, func() bool { return len(w.received()) == 3 }, "the first message again")
	again := w.received()[2]
	if again.Meta.Sequence.Stream != 1 || !again.Stamp.Again() {
		t.Fatalf("redelivered sequence %d stamped again=%v", again.Meta.Sequence.Stream, again.Stamp.Again())
	}
	if first[1].Stamp.Again() {
		t.Fatal("a message stamped as coming again before any reconnect")
	}
	reconnected := make(chan struct{})
	status := nc.StatusChanged(nats.CONNECTED)
	go func() { <-status; close(reconnected) }()
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnect")
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return first[1].Stamp.Again() }, "a message from before the reconnect stamped as coming again")
}
