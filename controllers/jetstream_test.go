package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// With no server to reach, the controller still starts, and every JetStream call fails at
// once with ErrNATSUnavailable instead of waiting.
func TestJetStreamWithoutAServer(t *testing.T) {
	cfg := opconfig.Default()
	cfg.NATS.URL = "nats://127.0.0.1:1"
	start := time.Now()
	js, err := ConnectJetStream(&cfg)
	if err != nil {
		t.Fatalf("connecting without a server must not fail: %v", err)
	}
	defer js.Close()
	called := false
	err = js.Do(context.Background(), "ns", func(context.Context, jetstream.JetStream) error {
		called = true
		return nil
	})
	if !errors.Is(err, ErrNATSUnavailable) || called {
		t.Errorf("Do = %v (called %v), want ErrNATSUnavailable without calling", err, called)
	}
	if d := time.Since(start); d > NATSTimeout {
		t.Errorf("failing took %v", d)
	}
}

// A namespace's shared lane is made sure of once for a burst of reconciles (thousands of
// endpoints applied at once do not each ask the meta leader for its consumers), and again once
// its set is forgotten (a stream found missing, a reconnection) or a minute has passed.
func TestTheSharedLaneIsMadeSureOfOnceForABurstOfReconciles(t *testing.T) {
	j, _ := connectedJetStream(t)
	ctx := context.Background()
	const ns = "shop"
	if err := j.Ensure(ctx, ns); err != nil {
		t.Fatal(err)
	}
	set := j.Config().For(ns)
	ensure := func() {
		t.Helper()
		err := j.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error {
			return j.EnsureSharedLane(ctx, js, ns, time.Now())
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	queueThere := func() bool {
		_, err := j.js.Consumer(ctx, set.DeliveriesStream(), set.QueueConsumer())
		return err == nil
	}
	ensure()
	if !queueThere() {
		t.Fatal("the queue consumer was not made")
	}
	// Deleted behind the controller's back: the reconciles of the same burst do not ask again.
	if err := j.js.DeleteConsumer(ctx, set.DeliveriesStream(), set.QueueConsumer()); err != nil {
		t.Fatal(err)
	}
	ensure()
	if queueThere() {
		t.Fatal("a second reconcile of the burst asked NATS for the shared lane again")
	}
	// Its set forgotten (as when a call finds a stream missing), the next reconcile makes it.
	j.forget(ns)
	ensure()
	if !queueThere() {
		t.Fatal("the shared lane was not made again once its set was forgotten")
	}
	// And a minute later too.
	if err := j.js.DeleteConsumer(ctx, set.DeliveriesStream(), set.QueueConsumer()); err != nil {
		t.Fatal(err)
	}
	j.ensureMu.Lock()
	j.made[madeKey{madeLane, ns}] = time.Now().Add(-laneRecheck)
	j.ensureMu.Unlock()
	ensure()
	if !queueThere() {
		t.Fatal("the shared lane was not made again after laneRecheck")
	}
}

// connectedJetStream is the controller's connection to a nats-server of the test's own, with
// the default configuration (returned), once connected; closed when the test ends.
func connectedJetStream(t *testing.T) (*JetStream, opconfig.Config) {
	t.Helper()
	n := testenv.NewNATS(t)
	cfg := opconfig.Default()
	cfg.NATS.URL = n.URL()
	j, err := ConnectJetStream(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Close)
	testenv.Eventually(t, 10*time.Second, j.Connected, "the connection to NATS")
	return j, cfg
}
