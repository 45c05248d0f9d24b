package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A replica that does not hold the lease writes no status; when it disables an endpoint (or
// opens its circuit), the lease holder learns it from the bucket and must write the status at
// once, as for its own transitions, not at its next periodic write. Found by the fault suite
// (test/faults, two replicas): the Disabled condition came up to a status interval late.
func TestAnotherReplicasTransitionReachesTheStatusAtOnce(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response { return testenv.Response{Status: 200, Body: "ok"} })
	e.endpoint("crm", v1alpha1.WebhookEndpointSpec{URL: rcv.URL()})
	// Periodic writes far apart: only an immediate write can pass the test.
	e.dispatcher("holder", func(o *dispatcher.Options) { o.StatusInterval = 10 * time.Minute })
	testenv.Eventually(t, 20*time.Second, func() bool {
		c := condition(e.get("crm"), v1alpha1.ConditionDisabled)
		return c != nil && c.Status == metav1.ConditionFalse
	}, "no first status write")

	// Another replica disables the endpoint: it writes the shared state by compare-and-set.
	ctx := context.Background()
	kv, err := e.js.KeyValue(ctx, e.set.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	key := streams.HealthKey("crm")
	state := map[string]any{}
	var rev uint64
	if cur, err := kv.Get(ctx, key); err == nil {
		rev = cur.Revision()
		if err := json.Unmarshal(cur.Value(), &state); err != nil {
			t.Fatal(err)
		}
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatal(err)
	}
	state["disabledSince"] = time.Now().UTC().Format(time.RFC3339Nano)
	state["disabledReason"] = "10 consecutive failed attempts (the policy disables at 10)"
	state["disabledBy"] = v1alpha1.ReasonConsecutiveFailures
	b, _ := json.Marshal(state)
	if rev == 0 {
		_, err = kv.Create(ctx, key, b)
	} else {
		_, err = kv.Update(ctx, key, b, rev)
	}
	if err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	testenv.Eventually(t, 5*time.Second, func() bool {
		c := condition(e.get("crm"), v1alpha1.ConditionDisabled)
		return c != nil && c.Status == metav1.ConditionTrue
	}, "the lease holder did not write the Disabled condition another replica caused")
	t.Logf("Disabled condition written %s after the other replica's change", time.Since(changed).Round(time.Millisecond))
}
