package counts

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A delivery-log message rewritten without its payload (retention, erasure) replaces one the
// counts already include: the fold passes over it, so removing payloads changes no count.
func TestFolderPassesOverRewrittenRecords(t *testing.T) {
	js := testenv.NewJetStream(t)
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOG", Subjects: []string{"log.>"}})
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(id string) uint64 {
		rec := records.LogRecord{DeliveryID: id, EventID: "evt_" + id, Endpoint: "a", State: records.StateSucceeded, Attempt: 1, Time: time.Now(),
			RequestHeaders: map[string]string{"X-Customer": "ana"}, Response: records.Response{StatusCode: 200, Body: "ana"}}
		ack, err := js.PublishMsg(ctx, records.LogMessage("log.a", &rec, nil))
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence
	}
	target := &memTarget{delivered: map[string]int64{}, through: map[string]uint64{}}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- (&Folder{JS: js, Stream: "LOG", Filter: "log.>", KV: kv, CheckpointKey: "fold", Target: target,
			Serves: func(string) bool { return true }, Interval: 20 * time.Millisecond, Log: logr.Discard()}).Run(rctx)
	}()
	defer func() { cancel(); <-done }()

	first := publish("whdl_1")
	publish("whdl_2")
	testenv.Eventually(t, 20*time.Second, func() bool { return target.get("a") == 2 }, "the fold counted %d of 2", target.get("a"))
	orig, err := st.GetMsg(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	rw, n := records.RewriteLog("LOG", first, orig.Subject, orig.Data, func(*records.LogRecord) bool { return true }, records.PayloadExpired)
	if n != 1 {
		t.Fatalf("rewrote %d records", n)
	}
	if _, err := js.PublishMsg(ctx, rw); err != nil {
		t.Fatal(err)
	}
	if err := st.SecureDeleteMsg(ctx, first); err != nil {
		t.Fatal(err)
	}
	publish("whdl_3")
	last := publish("whdl_4")
	through := func() uint64 { t, _ := target.FoldedThrough(ctx, "a"); return t }
	testenv.Eventually(t, 20*time.Second, func() bool { return through() >= last }, "the fold is at %d of %d", through(), last)
	if got := target.get("a"); got != 4 {
		t.Errorf("delivered %d, want 4: the rewritten record was counted again", got)
	}
}
