package follow

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Keys reads a bucket whose keys do not change less and less often (up to idlePoll), and still
// brings a change made after a long quiet.
func TestKeysReadsAQuietBucketRarely(t *testing.T) {
	js := testenv.NewJetStream(t)
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "follow-test", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), "h.first", []byte("1")); err != nil {
		t.Fatal(err)
	}

	var reads atomic.Int64
	var mu sync.Mutex
	seen := map[string]string{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	const poll = 50 * time.Millisecond
	go func() {
		done <- Keys(ctx, js, "follow-test", "h.", poll, func(key string, m streamread.Msg, deleted bool) {
			mu.Lock()
			seen[key] = string(m.Data)
			mu.Unlock()
		}, func() { reads.Add(1) })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Keys: %v", err)
		}
	}()
	value := func(key string) string {
		mu.Lock()
		defer mu.Unlock()
		return seen[key]
	}
	if err := testenv.Poll(10*time.Second, func() bool { return value("first") == "1" }); err != nil {
		t.Fatalf("the key there at the start was not read: %v", err)
	}

	// Three seconds without a change: at a fixed 50 ms that is 60 reads; doubling from 50 ms
	// to 2 s, about 6.
	r0 := reads.Load()
	time.Sleep(3 * time.Second)
	if got := reads.Load() - r0; got > 10 {
		t.Fatalf("a quiet bucket was read %d times in 3s; want at most 10 (the wait doubles up to %s)", got, idlePoll)
	}

	if _, err := kv.Put(t.Context(), "h.later", []byte("2")); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Poll(10*time.Second, func() bool { return value("later") == "2" }); err != nil {
		t.Fatalf("a change after the quiet was not read: %v", err)
	}
}
