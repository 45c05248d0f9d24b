package state

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Change carries out nothing: it returns to each caller the transitions its own change caused,
// with the state written, and what it found of another replica's change when its
// compare-and-set lost. Refresh says what it found too.
func TestChangeReturnsWhatItCaused(t *testing.T) {
	js := testenv.NewJetStream(t)
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	if err != nil {
		t.Fatal(err)
	}
	a := NewStore(kv, "ns", 0, logr.Discard())
	b := NewStore(kv, "ns", 0, logr.Discard()) // another replica
	p := policy.Default()
	p.Circuit.Threshold = 2

	// Two changes at once on one replica: one commit or two, each caller gets its own
	// transitions (the second failure opens the circuit) and the state written.
	var wg sync.WaitGroup
	updates := make([]Update, 2)
	for i := range updates {
		wg.Go(func() {
			u, err := a.Change(ctx, "crm", func(s *State, now time.Time) []Transition { return s.OnFailure(p, now) })
			if err != nil {
				t.Error(err)
			}
			updates[i] = u
		})
	}
	wg.Wait()
	opened := 0
	for _, u := range updates {
		if !u.Made || u.Seen.Changed {
			t.Fatalf("update %+v: want made, nothing seen", u)
		}
		opened += len(u.Transitions)
	}
	if st := a.Snapshot("crm"); opened != 1 || st.Consecutive != 2 || st.CircuitState() != v1alpha1.CircuitOpen {
		t.Fatalf("%d transitions returned, state %+v: want the circuit opened once, by one caller", opened, st)
	}
	if st := a.Snapshot("crm"); len(st.Outbox) != 1 || st.Outbox[0].Type != records.OpsCircuitOpened {
		t.Fatalf("outbox %+v: want the circuit's operational event, queued by the same compare-and-set", st.Outbox)
	}

	// The other replica has not read the state: its compare-and-set loses, it reads the
	// newer state, says so, and applies its change on it.
	u, err := b.Change(ctx, "crm", func(s *State, now time.Time) []Transition { return s.OnFailure(p, now) })
	if err != nil {
		t.Fatal(err)
	}
	if !u.Made || !u.Seen.Changed || !u.Seen.Transition || u.State.Consecutive != 3 || len(u.Transitions) != 0 {
		t.Fatalf("update %+v: want the other replica's change seen (the circuit opened), then a third failure", u)
	}

	// The first replica finds that change when it reads the bucket.
	seen, err := a.Refresh(ctx, "crm")
	if err != nil {
		t.Fatal(err)
	}
	if !seen.Changed || seen.Transition {
		t.Fatalf("refresh saw %+v: want a change that is no transition", seen)
	}
	if seen, _ := a.Refresh(ctx, "crm"); seen.Changed {
		t.Fatal("a second refresh saw a change again")
	}
}
