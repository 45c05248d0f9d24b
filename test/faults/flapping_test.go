package faults

import (
	"fmt"
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestFlappingReceiver: the receiver fails half the requests with 503, answers after a random
// latency and now and then hangs past the endpoint's timeout. Two replicas deliver and share
// the circuit: deliveries retry with backoff, the circuit opens and closes again; an event
// that exhausts its attempts is dead-lettered.
func TestFlappingReceiver(t *testing.T) {
	n, rate := 1000, 200
	if *full {
		n, rate = 5000, 250
	}
	tn := newTenant(t, "faults-flapping")
	rcv, err := newReceiver(tn.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	flap := testenv.Behaviour{FailRatio: 0.5, MaxLatency: 50 * time.Millisecond, HangRatio: 0.01, Hang: 3 * time.Second}
	rcv.SetResponder(testenv.Misbehave(flap))
	tn.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: flapping}
spec:
  maxAttempts: 8
  backoff: {initialInterval: 200ms, factor: 2, maxInterval: 3s}
  circuitBreaker: {consecutiveFailures: 10, openDuration: 2s, rampUp: 2s}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: flaky}
spec:
  url: %s
  eventTypes: [shipment.*]
  timeout: 1s
  retryPolicyRef: {name: flapping}
  signing: {secretRef: {name: signing, key: secret}}
  dispatcher: {dedicated: true, replicas: 2}
`, rcv.URL()))
	tn.waitCondition("flaky", v1alpha1.ConditionReady, "True", 2*time.Minute)

	prod, ctx := startProducer(t, tn)
	began := time.Now()
	if err := prod.publish(ctx, tn.ns, events("flap", "shipment.sent", n), rate); err != nil {
		t.Fatal(err)
	}
	f, err := settle(ctx, "receiver flapping", tn, prod.publishedAt(), time.Minute, 5*time.Minute, rcv)
	if err != nil {
		t.Fatal(err)
	}
	f.RunTime = time.Since(began)
	f.Faults = fmt.Sprintf("receiver: %.0f%% 503, latency up to %s, %.0f%% hang %s (timeout 1s); %d requests, %d refused, %d abandoned by the dispatcher (hung); 8 attempts, backoff 200ms..3s, circuit opens after 10 failures in a row",
		100*flap.FailRatio, flap.MaxLatency, 100*flap.HangRatio, flap.Hang, rcv.Stats().Requests, rcv.Stats().Refused, rcv.Stats().Abandoned)
	check(t, f)
	checkHealthCounts(t, tn, "flaky", rcv, f, time.Minute)
}
