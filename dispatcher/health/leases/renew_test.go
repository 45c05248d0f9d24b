package leases

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// countingKV is a real bucket whose reads are counted.
type countingKV struct {
	jetstream.KeyValue
	gets atomic.Int64
}

func (c *countingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	c.gets.Add(1)
	return c.KeyValue.Get(ctx, key)
}

// bucket starts a nats-server and makes a bucket on it.
func bucket(t *testing.T) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js := testenv.NewJetStream(t)
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "leases-test", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// revisions are the revisions of partitions' leases now (0: none).
func revisions(t *testing.T, kv jetstream.KeyValue, n int) []uint64 {
	t.Helper()
	out := make([]uint64, n)
	for p := range n {
		if e, err := kv.Get(t.Context(), streams.LeaseKey("", p)); err == nil {
			out[p] = e.Revision()
		}
	}
	return out
}

// A replica renewing the leases it holds writes them without reading them first; a lease
// another replica wrote since is read again, and not renewed while that replica's is fresh.
func TestHeldLeasesAreRenewedWithoutReadingThem(t *testing.T) {
	js, real := bucket(t)
	kv := &countingKV{KeyValue: real}
	const n = 12
	ttl := 3 * time.Second // a round every second
	ps := NewPartitions(js, kv, "", "replica-a", n, 1, ttl, logr.Discard())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ps.Run(ctx, func(int, bool) {}, func(int) bool { return false })
	}()
	defer func() { cancel(); <-done }()
	heldAll := func() bool {
		for p := range n {
			if !ps.held[p].Load() {
				return false
			}
		}
		return true
	}
	if err := testenv.Poll(30*time.Second, heldAll); err != nil {
		t.Fatalf("the replica did not take its %d partitions: %v", n, err)
	}

	// Two renewals of every lease, and not one read of a lease.
	before := revisions(t, real, n)
	gets := kv.gets.Load()
	if err := testenv.Poll(30*time.Second, func() bool {
		now := revisions(t, real, n)
		for p := range n {
			if now[p] < before[p]+2*n {
				// Each round writes every lease once (and the member key): two rounds move
				// a lease's revision on by at least 2n.
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatalf("the leases were not renewed twice: %v", err)
	}
	if got := kv.gets.Load() - gets; got != 0 {
		t.Fatalf("renewing held leases read them %d times; want none (a conditional write on the revision written last)", got)
	}
	if !heldAll() {
		t.Fatal("a partition was let go of while its lease was renewed")
	}

	// Another replica takes partition 3 (as if this one's lease had expired): the next
	// renewal fails, the lease is read, and the partition let go of while the other's is fresh.
	if _, err := real.Put(t.Context(), streams.LeaseKey("", 3), []byte("replica-b")); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Poll(30*time.Second, func() bool { return !ps.held[3].Load() }); err != nil {
		t.Fatalf("the replica kept partition 3 after another wrote its lease: %v", err)
	}
	if e, err := real.Get(t.Context(), streams.LeaseKey("", 3)); err != nil || string(e.Value()) != "replica-b" {
		t.Fatalf("partition 3's lease is %v (%v); want replica-b's, untouched", e, err)
	}
}
