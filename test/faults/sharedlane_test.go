package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestSharedLaneAcrossNodeRestarts: endpoints of a namespace's shared dispatcher (its intake
// and queue consumers, R3) sit idle while each node of the cluster is stopped gracefully and
// started again, one after the other, as a rolling update of the NATS StatefulSet does. After
// each restart one event per endpoint is published: every one is delivered, without waiting
// for the dispatcher's idle pull requests (held by a server that went away) to expire.
func TestSharedLaneAcrossNodeRestarts(t *testing.T) {
	env := clusterStack(t)
	tn := newTenantOn(t, env.stack, "faults-shared")
	rcv, err := newReceiver(tn.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	const endpoints = 3
	for i := range endpoints {
		tn.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: idle-%d}
spec:
  url: %s
  eventTypes: [idle%d.>]
  signing: {secretRef: {name: signing, key: secret}}
`, i, rcv.URL(), i))
	}
	for i := range endpoints {
		tn.waitCondition(fmt.Sprintf("idle-%d", i), v1alpha1.ConditionReady, "True", 2*time.Minute)
	}
	prod, ctx := startProducer(t, tn)
	round := func(r int) {
		t.Helper()
		var evs []event
		for i := range endpoints {
			evs = append(evs, event{id: fmt.Sprintf("evt_r%d_%d", r, i), typ: fmt.Sprintf("idle%d.ping", i)})
		}
		if err := prod.publish(ctx, tn.ns, evs, 0); err != nil {
			t.Fatal(err)
		}
		// Well within the 90 s an idle pull request waits before the dispatcher asks again.
		testenv.Eventually(t, 45*time.Second, func() bool {
			got := rcv.RequestsByID()
			for _, ev := range evs {
				if got[ev.id] == 0 {
					return false
				}
			}
			return true
		}, "round %d: the events published after the restart were not delivered (got %v)", r, lazyIDs(rcv))
	}
	round(0)
	// Idle for a while, so the dispatcher's pull requests are the idle ones.
	time.Sleep(5 * time.Second)
	for r, node := range env.nats.Nodes {
		if took, ok := node.Stop(); !ok {
			t.Fatalf("%s did not stop gracefully (%s)", node.Name, took)
		}
		if err := node.Start(); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		err := env.nats.WaitCurrent(wctx, 3*time.Minute)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		round(r + 1)
	}
}

// lazyIDs prints the ids the receiver got when a failure message is formatted.
type lazyIDsOf struct{ rcv *testenv.Receiver }

func (l lazyIDsOf) String() string { return fmt.Sprint(l.rcv.RequestsByID()) }

func lazyIDs(rcv *testenv.Receiver) lazyIDsOf { return lazyIDsOf{rcv} }
