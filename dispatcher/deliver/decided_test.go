package deliver

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Lookups of many deliveries at once share their reads of the delivery log (a read that
// began after a lookup came serves it), and each still finds its delivery's outcome,
// including one logged after the first reads.
func TestLookupsThatComeTogetherShareTheirReads(t *testing.T) {
	js := testenv.NewJetStream(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ATTEMPTS", Subjects: []string{"att.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Second)
	logged := func(id string) {
		t.Helper()
		rec := &records.LogRecord{DeliveryID: id, State: records.StateSucceeded, Attempt: 1, Time: time.Now()}
		if _, err := js.PublishMsg(ctx, records.LogMessage("att.ep", rec, nil)); err != nil {
			t.Fatal(err)
		}
	}
	const lookups = 64
	for i := range lookups {
		logged(fmt.Sprintf("d%d", i))
	}

	d := &decided{js: js, stream: "ATTEMPTS", subject: "att.ep"}
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, lookups)
	for i := range lookups {
		wg.Go(func() {
			<-start
			id := fmt.Sprintf("d%d", i)
			dec, ok, err := d.lookup(context.Background(), id, since)
			switch {
			case err != nil:
				errs <- err
			case !ok || !dec.Terminal() || dec.Attempt != 1:
				errs <- fmt.Errorf("delivery %s: found %v, %+v; want its succeeded first attempt", id, ok, dec)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if d.reads > lookups/2 {
		t.Fatalf("%d lookups that came together read the log %d times; want them to share reads (at most %d)", lookups, d.reads, lookups/2)
	}
	t.Logf("%d lookups, %d reads of the log", lookups, d.reads)

	// An outcome logged after those reads is found by the next lookup, which reads again.
	logged("later")
	dec, ok, err := d.lookup(ctx, "later", since)
	if err != nil || !ok || !dec.Terminal() {
		t.Fatalf("the outcome logged later: %v, %+v, %v; want it found", ok, dec, err)
	}
}
