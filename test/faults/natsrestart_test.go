package faults

import (
	"fmt"
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestNATSRestart: nats-server, a process of its own with file storage, is stopped (SIGTERM)
// or killed (SIGKILL), in turns, and started again while events are published and delivered. The producer, the dispatcher and
// the controller reconnect; what was stored survives; nothing is lost.
func TestNATSRestart(t *testing.T) {
	n, rate, restarts, down := 1500, 300, 2, 2*time.Second
	if *full {
		n, rate, restarts, down = 10000, 250, 4, 5*time.Second
	}
	tn := newTenant(t, "faults-nats")
	rcv, err := newReceiver(tn.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	// Slower than the publishers, so a backlog waits in the streams when the server stops and
	// deliveries are in flight; failing now and then, so retries wait as message schedules
	// (waits of 2s or more) across the restarts.
	rcv.SetResponder(testenv.Misbehave(testenv.Behaviour{MaxLatency: 40 * time.Millisecond, FailRatio: 0.1}))
	tn.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: scheduled}
spec:
  schedule: [0s, 2s, 3s, 5s, 10s]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: payments}
spec:
  url: %s
  eventTypes: [payment.>]
  timeout: 2s
  maxInFlight: 4
  retryPolicyRef: {name: scheduled}
  signing: {secretRef: {name: signing, key: secret}}
`, rcv.URL()))
	tn.waitCondition("payments", v1alpha1.ConditionReady, "True", 2*time.Minute)

	prod, ctx := startProducer(t, tn)

	began := time.Now()
	run := time.Duration(n) * time.Second / time.Duration(rate)
	faults := make(chan error, 1)
	go func() {
		// Restarts spread over the publishing run, each server up for a while first.
		up := began
		for i := 1; i <= restarts; i++ {
			at := began.Add(run * time.Duration(i) / time.Duration(restarts+1))
			time.Sleep(max(time.Until(at), time.Until(up.Add(3*time.Second)))) // pacing
			// Stopped cleanly and killed, in turns.
			if i%2 == 1 {
				natsd.Stop()
			} else {
				natsd.Kill()
			}
			time.Sleep(down) // the outage
			if err := natsd.Start(); err != nil {
				faults <- err
				return
			}
			up = time.Now()
		}
		faults <- nil
	}()
	if err := prod.publish(ctx, tn.ns, events("nats", "payment.settled", n), rate); err != nil {
		t.Fatal(err)
	}
	if err := <-faults; err != nil {
		t.Fatalf("restarting nats-server: %v", err)
	}
	f, err := settle(ctx, "nats-server restart", tn, prod.publishedAt(), time.Minute, 3*time.Minute, rcv)
	if err != nil {
		t.Fatal(err)
	}
	f.RunTime = time.Since(began)
	f.Faults = fmt.Sprintf("nats-server (own process, file storage) stopped %d times, with SIGTERM and SIGKILL in turns, and started again after %s each time, with a backlog waiting (receiver slower than the producer) and retries scheduled (10%% of attempts fail; waits 2s..10s); %d requests, %d refused; the producer retried %d publishes",
		restarts, down, rcv.Stats().Requests, rcv.Stats().Refused, prod.retries.Load())
	check(t, f)
	// Exact: a delivery whose acknowledgement a restart lost is settled from the delivery log
	// when it comes back, not sent (and counted) again.
	checkHealthCounts(t, tn, "payments", rcv, f, time.Minute)

	// The controller reconnected too: it wires a new endpoint (its consumer) after the restarts.
	tn.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: refunds}
spec:
  url: %s
  eventTypes: [refund.>]
  signing: {secretRef: {name: signing, key: secret}}
`, rcv.URL()))
	tn.waitCondition("refunds", v1alpha1.ConditionReady, "True", 2*time.Minute)
}
