package counts

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// memTarget keeps counts in memory as the bucket would, and can stop the fold right after it
// applied a delta (before the checkpoint moves), as a crash would.
type memTarget struct {
	mu        sync.Mutex
	delivered map[string]int64
	through   map[string]uint64
	crash     func()
}

func (m *memTarget) FoldedThrough(_ context.Context, ep string) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.through[ep], nil
}

func (m *memTarget) ApplyFold(_ context.Context, ep string, d *Delta) error {
	m.mu.Lock()
	if m.through[ep] >= d.From {
		m.mu.Unlock()
		return ErrFoldOverlap
	}
	m.delivered[ep] += d.Delivered
	m.through[ep] = d.Through
	crash := m.crash
	m.mu.Unlock()
	if crash != nil {
		crash()
	}
	return nil
}

func (m *memTarget) get(ep string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.delivered[ep]
}

// logStream makes the delivery log stream LOG (log.>; duplicates: its de-duplication window, 0
// for the server's default) and the bucket the fold keeps its checkpoint in.
func logStream(t *testing.T, duplicates time.Duration) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js := testenv.NewJetStream(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log.>"}, Duplicates: duplicates}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// The fold counts every success once, even when it stops between applying counts and moving
// its checkpoint, and when a new fold resumes from the checkpoint.
func TestFolderResumesExactlyAfterAStop(t *testing.T) {
	js, kv := logStream(t, 0)
	ctx := context.Background()
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			for _, ep := range []string{"a", "b", "other"} {
				rec := records.LogRecord{DeliveryID: fmt.Sprintf("whdl_%s%d", ep, i), Endpoint: ep, State: records.StateSucceeded, Attempt: 1, Time: time.Now()}
				if _, err := js.PublishMsg(ctx, records.LogMessage("log."+ep, &rec, nil)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	target := &memTarget{delivered: map[string]int64{}, through: map[string]uint64{}}
	folder := func() *Folder {
		return &Folder{JS: js, Stream: "LOG", Filter: "log.>", KV: kv, CheckpointKey: "fold", Target: target,
			Serves: func(ep string) bool { return ep != "other" }, Interval: 50 * time.Millisecond, Log: logr.Discard()}
	}
	run := func(stopWhen func() bool, crash bool) {
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if crash {
			target.mu.Lock()
			target.crash = func() {
				if stopWhen() {
					cancel()
				}
			}
			target.mu.Unlock()
		}
		done := make(chan error, 1)
		go func() { done <- folder().Run(rctx) }()
		_ = testenv.Poll(20*time.Second, stopWhen) // on a timeout, the assertions below say what is missing
		cancel()
		<-done
		target.mu.Lock()
		target.crash = nil
		target.mu.Unlock()
	}
	publish(0, 300)
	// The first fold stops right after it applied counts, before its checkpoint moved.
	run(func() bool { return target.get("a") > 0 }, true)
	publish(300, 500)
	run(func() bool { return target.get("a") == 500 && target.get("b") == 500 }, false)
	if a, b := target.get("a"), target.get("b"); a != 500 || b != 500 {
		t.Fatalf("delivered a=%d b=%d, want 500 each", a, b)
	}
	// Another fold from the checkpoint adds nothing that was counted.
	until := time.Now().Add(time.Second)
	run(func() bool { return time.Now().After(until) }, false)
	if a, b := target.get("a"), target.get("b"); a != 500 || b != 500 {
		t.Fatalf("after a third fold delivered a=%d b=%d, want 500 each", a, b)
	}
	if target.get("other") != 0 {
		t.Error("an endpoint this dispatcher does not serve was counted")
	}
}

// An endpoint whose first deliveries were logged before this dispatcher served it (another
// replica knew it sooner) is counted once it is served, new records of its own or none, and
// across a restart meanwhile; one served elsewhere is never counted.
func TestFolderCountsAnEndpointServedLate(t *testing.T) {
	js, kv := logStream(t, 0)
	ctx := context.Background()
	n := 0
	publish := func(ep string, count int) {
		for range count {
			n++
			rec := records.LogRecord{DeliveryID: fmt.Sprintf("whdl_%s%d", ep, n), Endpoint: ep, State: records.StateSucceeded, Attempt: 1, Time: time.Now()}
			if _, err := js.PublishMsg(ctx, records.LogMessage("log."+ep, &rec, nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	var mu sync.Mutex
	served := map[string]bool{"a": true}
	serve := func(ep string) {
		mu.Lock()
		served[ep] = true
		mu.Unlock()
	}
	target := &memTarget{delivered: map[string]int64{}, through: map[string]uint64{}}
	start := func() (stop func()) {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- (&Folder{JS: js, Stream: "LOG", Filter: "log.>", KV: kv, CheckpointKey: "fold", Target: target,
				Serves: func(ep string) bool {
					mu.Lock()
					defer mu.Unlock()
					return served[ep]
				},
				Elsewhere: func(ep string) bool { return ep == "dedicated" },
				Subject:   func(ep string) string { return "log." + ep },
				Interval:  50 * time.Millisecond, Log: logr.Discard()}).Run(rctx)
		}()
		return func() { cancel(); <-done }
	}
	want := func(ep string, n int64) {
		t.Helper()
		testenv.Eventually(t, 20*time.Second, func() bool { return target.get(ep) == n }, "%s counted %v, want %d", ep, lazyCount{target, ep}, n)
	}
	stop := start()
	publish("a", 5)
	publish("late", 3)      // logged by a replica that knew it first
	publish("quiet", 2)     // served later, and nothing more of it comes
	publish("dedicated", 4) // another dispatcher's
	publish("a", 5)
	want("a", 10)
	serve("late")
	publish("late", 2)
	want("late", 5)
	// A restart before "quiet" is served: its records are still read again.
	stop()
	stop = start()
	defer func() { stop() }()
	publish("a", 1)
	want("a", 11)
	serve("quiet")
	want("quiet", 2)
	publish("a", 1)
	want("a", 12)
	if got := target.get("late"); got != 5 {
		t.Fatalf("late counted %d after the restart, want 5", got)
	}
	if got := target.get("dedicated"); got != 0 {
		t.Fatalf("an endpoint served elsewhere was counted %d times", got)
	}
}

type lazyCount struct {
	m  *memTarget
	ep string
}

func (l lazyCount) String() string { return fmt.Sprint(l.m.get(l.ep)) }

// A log message stored twice under one message id (a write retried to a new stream leader that
// had not applied the first yet, which de-duplication misses) is counted once, whether the
// fold reads both in one run or the copy after a restart from a checkpoint past the original.
func TestFolderCountsAMessageStoredTwiceOnce(t *testing.T) {
	// A short de-duplication window lets the test store the same message twice, as the lost
	// leader does.
	js, kv := logStream(t, 100*time.Millisecond)
	ctx := context.Background()
	batch := func(from, to int) []records.LogEntry {
		var out []records.LogEntry
		for i := from; i < to; i++ {
			rec := records.LogRecord{DeliveryID: fmt.Sprintf("whdl_a%d", i), Endpoint: "a", State: records.StateSucceeded, Attempt: 1, Time: time.Now()}
			out = append(out, records.EncodeLog(&rec, nil))
		}
		return out
	}
	// storeTwice stores the message, then again once the window let it through.
	storeTwice := func(entries []records.LogEntry) {
		if _, err := js.PublishMsg(ctx, records.LogBatch("log.a", entries)); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, func() bool {
			ack, err := js.PublishMsg(ctx, records.LogBatch("log.a", entries))
			return err == nil && !ack.Duplicate
		}, "the copy was never stored")
	}
	target := &memTarget{delivered: map[string]int64{}, through: map[string]uint64{}}
	run := func(want int64) {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- (&Folder{JS: js, Stream: "LOG", Filter: "log.>", KV: kv, CheckpointKey: "fold", Target: target,
				Serves: func(string) bool { return true }, Interval: 50 * time.Millisecond, Log: logr.Discard()}).Run(rctx)
		}()
		info := func() uint64 {
			s, err := js.Stream(ctx, "LOG")
			if err != nil {
				return 0
			}
			return s.CachedInfo().State.LastSeq
		}
		last := info()
		_ = testenv.Poll(20*time.Second, func() bool {
			e, err := kv.Get(ctx, "fold")
			return err == nil && string(e.Value()) == fmt.Sprint(last)
		})
		cancel()
		<-done
		if got := target.get("a"); got != want {
			t.Fatalf("delivered %d, want %d", got, want)
		}
	}
	storeTwice(batch(0, 10))
	run(10)
	// The copy of a message the checkpoint passed already.
	if _, err := js.PublishMsg(ctx, records.LogBatch("log.a", batch(10, 15))); err != nil {
		t.Fatal(err)
	}
	run(15)
	testenv.Eventually(t, 10*time.Second, func() bool {
		ack, err := js.PublishMsg(ctx, records.LogBatch("log.a", batch(10, 15)))
		return err == nil && !ack.Duplicate
	}, "the copy was never stored")
	run(15)
}

// The fold's memory of recent message ids forgets the oldest beyond its bound, and grows with
// what it remembers: made for 2^15 ids, it kept about 2 MiB before a single record was folded.
func TestRecentIDsRememberTheLastOnesAndGrowWithThem(t *testing.T) {
	r := newRecentIDs(3)
	for _, id := range []string{"a", "b", "c"} {
		if !r.add(id) {
			t.Fatalf("%s is new", id)
		}
	}
	if r.add("a") || r.add("c") || !r.add("") || !r.add("") {
		t.Fatal("a and c are remembered; an empty id is always new")
	}
	if !r.add("d") || r.add("b") || r.add("d") || !r.add("a") {
		t.Fatal("d pushed a out: a is new again, b and d are remembered")
	}
	if len(r.set) != 3 || len(r.ring) != 3 {
		t.Fatalf("remembers %d ids in a ring of %d, want 3", len(r.set), len(r.ring))
	}
	big := newRecentIDs(foldRecentIDs)
	for i := range 10 {
		big.add(fmt.Sprint(i))
	}
	if c := cap(big.ring); c > 64 {
		t.Fatalf("a ring holding 10 ids has room for %d", c)
	}
}
