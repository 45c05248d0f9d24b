package faults

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestAutoDisableAndReplay: mid-run the receiver goes down; consecutive failures disable the
// endpoint (two replicas share its state: either may disable it, the lease holder reports it),
// and what arrives meanwhile is dead-lettered as endpoint_disabled. The receiver
// comes back, `kubectl webhooks enable` re-enables the endpoint while events keep coming, and
// `kubectl webhooks replay --all --wait` (a WebhookReplay the controller runs) replays the
// dead letters, then, if more arrive, a replay of those since: in the end the receiver has
// every event.
func TestAutoDisableAndReplay(t *testing.T) {
	n, rate := 1000, 100
	if *full {
		n, rate = 5000, 250
	}
	tn := newTenant(t, "faults-disable")
	rcv, err := newReceiver(tn.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	tn.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: strict}
spec:
  schedule: [0s, 500ms]
  circuitBreaker: {consecutiveFailures: 0}
  autoDisable: {consecutiveFailures: 20}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: fragile}
spec:
  url: %s
  eventTypes: [invoice.*]
  timeout: 2s
  retryPolicyRef: {name: strict}
  signing: {secretRef: {name: signing, key: secret}}
  dispatcher: {dedicated: true, replicas: 2}
`, rcv.URL()))
	tn.waitCondition("fragile", v1alpha1.ConditionReady, "True", 2*time.Minute)

	prod, ctx := startProducer(t, tn)
	began := time.Now()
	run := time.Duration(n) * time.Second / time.Duration(rate)
	published := make(chan error, 1)
	go func() { published <- prod.publish(ctx, tn.ns, events("inv", "invoice.issued", n), rate) }()

	time.Sleep(run / 5) // pacing: the receiver goes down a fifth into the run
	rcv.SetResponder(testenv.Misbehave(testenv.Behaviour{Down: true}))
	downAt := time.Since(began)
	tn.waitCondition("fragile", v1alpha1.ConditionDisabled, "True", time.Minute)
	disabledAt := time.Since(began)
	// Events keep arriving while it is disabled: they are dead-lettered without an attempt.
	time.Sleep(run / 10) // pacing: it stays disabled a while
	if err := testenv.Poll(time.Minute, func() error {
		dls, err := deadLetters(ctx, tn)
		if err != nil {
			return err
		}
		for _, reasons := range dls {
			if slices.Contains(reasons, records.ReasonEndpointDisabled) {
				return nil
			}
		}
		return fmt.Errorf("no %s dead letter yet (%d dead letters)", records.ReasonEndpointDisabled, len(dls))
	}); err != nil {
		t.Fatal(err)
	}
	rcv.SetResponder(testenv.Misbehave(testenv.Behaviour{}))
	tn.plugin("enable", "fragile")
	tn.waitCondition("fragile", v1alpha1.ConditionDisabled, "False", time.Minute)
	enabledAt := time.Since(began)
	if err := <-published; err != nil {
		t.Fatal(err)
	}

	// Everything is received or dead-lettered; then the dead letters are replayed.
	all := prod.publishedAt()
	before, err := settle(ctx, "auto-disable, replay", tn, all, time.Minute, 3*time.Minute, rcv)
	if err != nil {
		t.Fatal(err)
	}
	if before.Missing > 0 {
		check(t, before)
		t.FailNow()
	}
	var replayed, skipped, replays int
	since := ""
	err = testenv.Poll(3*time.Minute, func() error {
		if got := rcv.Stats().Unique; got >= len(all) {
			return nil
		}
		// Each run is a WebhookReplay of its own: its name (the idempotency key) replays a dead
		// letter once, and after the first it selects only what was dead-lettered since the
		// previous one began.
		args := []string{"replay", "fragile", "--idempotency-key", fmt.Sprintf("faults-after-enable-%d", replays), "--wait", "-o", "json"}
		if since == "" {
			args = append(args, "--all")
		} else {
			args = append(args, "--since", since)
		}
		began := time.Now().Add(-2 * time.Second).UTC().Format(time.RFC3339)
		var rep struct {
			Replayed int `json:"replayed"`
			Skipped  int `json:"skipped"`
			Failed   int `json:"failed"`
		}
		out := tn.plugin(args...)
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			return testenv.Stop(fmt.Errorf("replay -o json: %v\n%s", err, out))
		}
		replays++
		replayed += rep.Replayed
		skipped = rep.Skipped
		since = began
		return testenv.Poll(time.Minute, func() error {
			if got := rcv.Stats().Unique; got < len(all) {
				return fmt.Errorf("%d of %d received after %d replays", got, len(all), replays)
			}
			return nil
		})
	})
	if err != nil {
		t.Error(err)
	}
	f, err := account(ctx, "auto-disable, replay", tn, all, rcv)
	if err != nil {
		t.Fatal(err)
	}
	f.RunTime = time.Since(began)
	f.Faults = fmt.Sprintf("receiver down at %s, endpoint disabled at %s, re-enabled with the plugin at %s; before the replay %d received, %d dead-lettered; `kubectl webhooks replay --wait` run %d time(s): %d replayed (%d skipped on the last run)",
		downAt.Round(time.Millisecond), disabledAt.Round(time.Millisecond), enabledAt.Round(time.Millisecond), before.Received, before.DeadLettered, replays, replayed, skipped)
	// After the replay nothing may be left only in the dead-letter stream.
	if f.DeadLettered > 0 {
		f.Missing += f.DeadLettered
		t.Errorf("%d dead-lettered events were not delivered by the replay", f.DeadLettered)
	}
	check(t, f)
	checkHealthCounts(t, tn, "fragile", rcv, f, time.Minute)
}
