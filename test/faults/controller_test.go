package faults

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestControllerRestartAndEndpointDeletion: two endpoints share a namespace's dispatcher. One
// has a backlog (its receiver is slow and fails half the time, so deliveries wait in the
// stream, in flight and as scheduled retries) and is deleted mid-run: its dispatcher
// dead-letters that backlog while the endpoint's finalizer waits for its consumers to be
// empty. The controller is killed twice, once while that finalizer waits (started again, it
// retires the consumers again and goes on waiting). Everything of the deleted endpoint is
// received or dead-lettered (endpoint_deleted); the other endpoint gets everything.
func TestControllerRestartAndEndpointDeletion(t *testing.T) {
	nKeep, nGone, rate := 1000, 300, 200
	if *full {
		nKeep, nGone, rate = 5000, 1500, 250
	}
	tn := newTenant(t, "faults-controller")
	keep, err := newReceiver(tn.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	gone, err := newReceiver(tn.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	gone.SetResponder(testenv.Misbehave(testenv.Behaviour{FailRatio: 0.5, MaxLatency: 200 * time.Millisecond}))
	tn.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: patient}
spec:
  schedule: [0s, 1s, 3s, 5s]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: keep}
spec:
  url: %s
  eventTypes: [keep.*]
  timeout: 2s
  signing: {secretRef: {name: signing, key: secret}}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: gone}
spec:
  url: %s
  eventTypes: [gone.*]
  timeout: 2s
  maxInFlight: 5
  retryPolicyRef: {name: patient}
  signing: {secretRef: {name: signing, key: secret}}
`, keep.URL(), gone.URL()))
	tn.waitCondition("keep", v1alpha1.ConditionReady, "True", 2*time.Minute)
	tn.waitCondition("gone", v1alpha1.ConditionReady, "True", 2*time.Minute)

	prod, ctx := startProducer(t, tn)
	began := time.Now()

	// The deleted endpoint's events are all published before it is deleted: what it owes is
	// then well defined (its consumer on the events stream has them all).
	if err := prod.publish(ctx, tn.ns, events("gone", "gone.away", nGone), 0); err != nil {
		t.Fatal(err)
	}

	// The faults are placed by progress, not by the clock, so that a slow machine moves them
	// along with the deliveries: the first kill once a third of keep's events arrived, the
	// deletion at half, the second kill as soon as the deleted endpoint's first event is
	// dead-lettered as endpoint_deleted (its dispatcher is dead-lettering the backlog, the
	// finalizer waiting).
	run := time.Duration(nKeep) * time.Second / time.Duration(rate)
	progressed := func(part int) error {
		return testenv.Poll(run+3*time.Minute, func() error {
			if got := keep.Stats().Unique; got < nKeep/part {
				return fmt.Errorf("keep received %d of %d events, waiting for %d", got, nKeep, nKeep/part)
			}
			return nil
		})
	}
	faults := make(chan error, 1)
	var killedAt, deletedAt, goneAt time.Time
	var backlog, movedAtKill int
	go func() {
		faults <- func() error {
			if err := progressed(3); err != nil {
				return err
			}
			killedAt = time.Now()
			if err := killController(); err != nil {
				return err
			}
			if err := progressed(2); err != nil {
				return err
			}
			backlog = nGone - gone.Stats().Unique
			ep, err := tn.endpoint("gone")
			if err != nil {
				return err
			}
			deletedAt = time.Now()
			if err := stack.Client.Delete(ctx, ep); err != nil {
				return err
			}
			// Kill the controller while its finalizer waits for the backlog to be dead-lettered.
			err = testenv.Poll(3*time.Minute, func() error {
				dls, err := deadLetters(ctx, tn)
				if err != nil {
					return err
				}
				movedAtKill = 0
				for id, reasons := range dls {
					if strings.HasPrefix(id, "gone-") && slices.Contains(reasons, records.ReasonEndpointDeleted) {
						movedAtKill++
					}
				}
				if movedAtKill == 0 {
					return errors.New("no event of the deleted endpoint is dead-lettered as endpoint_deleted yet")
				}
				return nil
			})
			if err != nil {
				return err
			}
			if err := killController(); err != nil {
				return err
			}
			err = testenv.Poll(3*time.Minute, func() error {
				if _, err := tn.endpoint("gone"); !apierrors.IsNotFound(err) {
					return fmt.Errorf("endpoint gone is still there (%v)", err)
				}
				return nil
			})
			goneAt = time.Now()
			return err
		}()
	}()
	if err := prod.publish(ctx, tn.ns, events("keep", "keep.going", nKeep), rate); err != nil {
		t.Fatal(err)
	}
	if err := <-faults; err != nil {
		t.Fatalf("faults: %v", err)
	}
	f, err := settle(ctx, "controller restart, delete", tn, prod.publishedAt(), time.Minute, 3*time.Minute, keep, gone)
	if err != nil {
		t.Fatal(err)
	}
	f.RunTime = time.Since(began)
	f.Faults = fmt.Sprintf("controller SIGKILLed twice (at %s and while its finalizer waited, %d events dead-lettered as endpoint_deleted by the dispatcher then); endpoint gone (%d events, %d not yet received when deleted) deleted at %s, gone %s later; gone received %d, keep received %d of %d",
		killedAt.Sub(began).Round(time.Millisecond), movedAtKill, nGone, backlog, deletedAt.Sub(began).Round(time.Millisecond), goneAt.Sub(deletedAt).Round(time.Millisecond),
		gone.Stats().Unique, keep.Stats().Unique, nKeep)
	check(t, f)
	checkHealthCounts(t, tn, "keep", keep, f, time.Minute)
	// Nothing of the deleted endpoint is left in the deliveries stream (its scheduled retries
	// included), and its consumers (and any drain consumer of an earlier version) are gone.
	if left, err := leftovers(ctx, tn.ns, "gone"); err != nil || left != 0 {
		t.Errorf("%d messages of the deleted endpoint are left in the deliveries stream (%v)", left, err)
	}
	if names, err := consumersOf(ctx, tn.ns, "gone"); err != nil || len(names) != 0 {
		t.Errorf("consumers of the deleted endpoint are left: %v (%v)", names, err)
	}
	// The endpoint that stayed gets everything.
	for id := range prod.publishedAt() {
		if len(id) > 5 && id[:5] == "keep-" && keep.Receipts()[id].Count == 0 {
			t.Errorf("%s was not received by the endpoint that stayed", id)
			break
		}
	}
}

// consumersOf lists the consumers of an endpoint left on its namespace's events and
// deliveries streams (its own, and the drain consumers of earlier versions).
func consumersOf(ctx context.Context, ns, endpoint string) ([]string, error) {
	nc, js, err := stack.ConnectAdmin(nats.MaxReconnects(0))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	names := streams.DefaultNames().For(ns)
	var out []string
	for _, stream := range []string{names.EventsStream(), names.DeliveriesStream()} {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			return out, err
		}
		l := st.ConsumerNames(ctx)
		for name := range l.Name() {
			if strings.HasSuffix(name, "_"+endpoint) {
				out = append(out, stream+"/"+name)
			}
		}
		if err := l.Err(); err != nil {
			return out, err
		}
	}
	return out, nil
}

// leftovers counts the messages of an endpoint in the deliveries stream, whatever its lane:
// deliveries (queued, parked) and scheduled retries.
func leftovers(ctx context.Context, ns, endpoint string) (uint64, error) {
	nc, js, err := stack.ConnectAdmin(nats.MaxReconnects(0))
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	names := streams.DefaultNames().For(ns)
	st, err := js.Stream(ctx, names.DeliveriesStream())
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, filter := range []string{names.WaitingFilter(endpoint), names.ScheduledFilter(endpoint, "")} {
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			return 0, err
		}
		for _, c := range info.State.Subjects {
			n += c
		}
	}
	return n, nil
}

// killController kills the controller process with SIGKILL, waiting for one to run first
// (after an earlier kill it runs again after the restart backoff); its supervisor starts it
// again.
func killController() error {
	var pid int
	err := testenv.Poll(time.Minute, func() (err error) {
		pid, err = controllerPID()
		return err
	})
	if err != nil {
		return err
	}
	if err := kill(pid); err != nil {
		return errors.Join(fmt.Errorf("killing the controller (%d)", pid), err)
	}
	return nil
}
