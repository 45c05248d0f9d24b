package settle

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

// Records written while an endpoint's previous message is being stored go out together, in
// fewer messages than records; a record that must go alone gets a message of its own with its
// record's id; every record is stored once and every writer is told.
func TestLogWriterBatchesWhatMayBeBatched(t *testing.T) {
	js := testenv.NewJetStream(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log.>"}, Storage: jetstream.MemoryStorage,
		Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	l := NewLogWriter(js, js.Conn().MaxPayload(), logr.Discard())
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Run(runCtx, ctx) }()
	const n = 2000
	var wg sync.WaitGroup
	var mu sync.Mutex
	stored := 0
	for i := range n {
		wg.Add(1)
		rec := &records.LogRecord{DeliveryID: fmt.Sprintf("whdl_%d", i), Endpoint: "orders", State: records.StateSucceeded, Attempt: 1, Time: time.Now()}
		l.Write("log.orders", rec, i%100 == 0, func(ok bool) {
			defer wg.Done()
			if ok {
				mu.Lock()
				stored++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	stop()
	<-done
	if stored != n {
		t.Fatalf("%d of %d records stored", stored, n)
	}
	st, err := js.Stream(ctx, "LOG")
	if err != nil {
		t.Fatal(err)
	}
	msgs := st.CachedInfo().State.Msgs
	t.Logf("%d records in %d messages", n, msgs)
	if msgs >= n/2 {
		t.Errorf("%d records took %d messages: nothing was batched", n, msgs)
	}
	c, err := js.OrderedConsumer(ctx, "LOG", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for read := uint64(0); read < msgs; {
		b, err := c.Fetch(int(msgs-read), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			read++
			recs := records.LogRecords(m.Data())
			for _, r := range recs {
				seen[r.DeliveryID]++
			}
			var alone int
			fmt.Sscanf(recs[0].DeliveryID, "whdl_%d", &alone)
			if alone%100 == 0 && (len(recs) != 1 || m.Headers().Get(records.HeaderMsgID) != recs[0].MsgID()) {
				t.Errorf("a record that goes alone is in a message of %d with id %q", len(recs), m.Headers().Get(records.HeaderMsgID))
			}
		}
	}
	for i := range n {
		if seen[fmt.Sprintf("whdl_%d", i)] != 1 {
			t.Fatalf("whdl_%d stored %d times", i, seen[fmt.Sprintf("whdl_%d", i)])
		}
	}
	// After the writer stopped, a write fails at once.
	failed := make(chan bool, 1)
	l.Write("log.orders", &records.LogRecord{DeliveryID: "late", Endpoint: "orders", State: records.StateSucceeded}, false, func(ok bool) { failed <- ok })
	if <-failed {
		t.Error("a write after the writer stopped succeeded")
	}
}
