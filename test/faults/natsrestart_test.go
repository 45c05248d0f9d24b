package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// TestNATSRestart: nats-server, a process of its own with file storage, is stopped and
// started again while events are published and delivered. The producer, the dispatcher and
// the controller reconnect; what was stored survives; nothing is lost.
func TestNATSRestart(t *testing.T) {
	n, rate, restarts, down := 1500, 300, 1, 3*time.Second
	if *full {
		n, rate, restarts, down = 10000, 500, 3, 5*time.Second
	}
	tn := newTenant(t, "faults-nats")
	rcv, err := newReceiver(tn.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.close()
	// Slower than the publishers, so a backlog waits in the streams when the server stops
	// and deliveries are in flight.
	rcv.set(behaviour{MaxLatency: 40 * time.Millisecond})
	tn.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: payments}
spec:
  url: %s
  eventTypes: [payment.>]
  timeout: 2s
  maxInFlight: 4
  signing: {secretRef: {name: signing, key: secret}}
`, rcv.URL))
	tn.waitCondition("payments", v1alpha1.ConditionReady, "True", 2*time.Minute)

	prod, err := newProducer()
	if err != nil {
		t.Fatal(err)
	}
	defer prod.close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	began := time.Now()
	run := time.Duration(n) * time.Second / time.Duration(rate)
	faults := make(chan error, 1)
	go func() {
		// Restarts spread over the publishing run.
		for i := 1; i <= restarts; i++ {
			time.Sleep(time.Until(began.Add(run * time.Duration(i) / time.Duration(restarts+1)))) // pacing
			natsd.stop()
			time.Sleep(down) // the outage
			if err := natsd.start(); err != nil {
				faults <- err
				return
			}
		}
		faults <- nil
	}()
	if err := prod.publish(ctx, tn.ns, events("nats", "payment.settled", n), rate); err != nil {
		t.Fatal(err)
	}
	if err := <-faults; err != nil {
		t.Fatalf("restarting nats-server: %v", err)
	}
	f, err := settle(ctx, "nats-server restart", tn.ns, prod.publishedAt(), time.Minute, 3*time.Minute, rcv)
	if err != nil {
		t.Fatal(err)
	}
	f.RunTime = time.Since(began)
	f.Faults = fmt.Sprintf("nats-server (own process, file storage) stopped with SIGTERM and started again after %s, %d time(s), with a backlog waiting (receiver slower than the producer); the producer retried %d publishes",
		down, restarts, prod.retries.Load())
	check(t, f)
}
