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

// The fold counts every success once, even when it stops between applying counts and moving
// its checkpoint, and when a new fold resumes from the checkpoint.
func TestFolderResumesExactlyAfterAStop(t *testing.T) {
	js := testenv.NewJetStream(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log.>"}}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	if err != nil {
		t.Fatal(err)
	}
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
