package faults

import (
	"fmt"
	"sync"
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestDispatcherSIGKILL: a dedicated dispatcher with two replicas delivers a run of events
// while a replica is killed with SIGKILL every few seconds (the pod runner restarts it, with
// the kubelet's crash-loop backoff). Messages in flight at a kill come back after their ack
// wait; nothing is lost.
func TestDispatcherSIGKILL(t *testing.T) {
	n, rate, every := 2000, 400, 2*time.Second
	if *full {
		n, rate, every = 20000, 1000, 3*time.Second
	}
	tn := newTenant(t, "faults-sigkill")
	rcv, err := newReceiver(tn.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	tn.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: orders}
spec:
  url: %s
  eventTypes: [order.*]
  timeout: 2s
  maxInFlight: 100
  signing: {secretRef: {name: signing, key: secret}}
  dispatcher: {dedicated: true, replicas: 2}
`, rcv.URL()))
	tn.waitCondition("orders", v1alpha1.ConditionReady, "True", 2*time.Minute)
	deployment := names.DedicatedDispatcher("orders")
	if err := testenv.Poll(time.Minute, func() error {
		pids := tn.dispatcherPIDs(deployment)
		if len(pids) != 2 || pids[0] == 0 || pids[1] == 0 {
			return fmt.Errorf("replicas of %s: %v, want two running", deployment, pids)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	prod, ctx := startProducer(t, tn)

	began := time.Now()
	stop := make(chan struct{})
	var kills int
	var killer sync.WaitGroup
	killer.Add(1)
	go func() {
		defer killer.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		next := 0
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			// Replicas take turns; one that is restarting is skipped.
			pids := tn.dispatcherPIDs(deployment)
			for i := range pids {
				pid := pids[(next+i)%len(pids)]
				if pid != 0 && kill(pid) == nil {
					kills++
					break
				}
			}
			next++
		}
	}()
	if err := prod.publish(ctx, tn.ns, events("kill", "order.created", n), rate); err != nil {
		t.Fatal(err)
	}
	published := prod.publishedAt()
	// Faults go on until everything arrived (or a bound passed), then the rest settles.
	_ = testenv.Poll(5*time.Minute, func() error {
		if got := rcv.Stats().Unique; got < len(published) {
			return fmt.Errorf("%d of %d received", got, len(published))
		}
		return nil
	})
	close(stop)
	killer.Wait()
	f, err := settle(ctx, "dispatcher SIGKILL", tn, published, time.Minute, 3*time.Minute, rcv)
	if err != nil {
		t.Fatal(err)
	}
	f.RunTime = time.Since(began)
	f.Faults = fmt.Sprintf("%d SIGKILLs of the 2 dispatcher replicas, one every %s, during the run", kills, every)
	check(t, f)
	checkHealthCounts(t, tn, "orders", rcv, f, time.Minute)
}
