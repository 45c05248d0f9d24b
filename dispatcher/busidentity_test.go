package dispatcher_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A dispatcher does everything with its namespace's bus identity (the auth callout's
// dispatcher permissions), which may create no consumer: two replicas deliver, take up an
// endpoint that appeared while they ran (through the consumers the controller made for it),
// fold the delivery log into status counts (direct gets from the checkpoint) and follow each
// other's health (the polled bucket), the server refuses them nothing (newEnv checks), and
// the only consumers on the namespace's streams are the durables the controller made.
func TestDispatcherNeedsNoConsumerOfItsOwn(t *testing.T) {
	e := newEnv(t)
	first := newReceiver(t, nil)
	first.Trust(e.endpoint("first", v1alpha1.WebhookEndpointSpec{URL: first.URL()}))
	twoReplicas := func(o *dispatcher.Options) { o.Replicas = 2 }
	e.dispatcher("a", twoReplicas)
	e.dispatcher("b", twoReplicas)

	for i := range 10 {
		e.publish("order.created", fmt.Sprintf("evt_%d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return len(first.RequestsByID()) == 10 }, "first got %v%s", lazyN(func() int { return len(first.RequestsByID()) }), lazy(e.dump))

	// Published as soon as the endpoint exists, before the dispatchers may know it: its
	// consumer (made with it) holds them until they do.
	late := newReceiver(t, nil)
	late.Trust(e.endpoint("late", v1alpha1.WebhookEndpointSpec{URL: late.URL(), EventTypes: []v1alpha1.EventTypePattern{"order.early"}}))
	for i := range 5 {
		e.publish("order.early", fmt.Sprintf("evt_early_%d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return len(first.RequestsByID()) == 15 }, "first got %v", lazyN(func() int { return len(first.RequestsByID()) }))
	testenv.Eventually(t, 20*time.Second, func() bool { return len(late.RequestsByID()) == 5 }, "the late endpoint got %v of 5 back-filled events", lazyN(func() int { return len(late.RequestsByID()) }))

	for ep, n := range map[string]int64{"first": 15, "late": 5} {
		testenv.Eventually(t, 20*time.Second, func() bool {
			h := e.get(ep).Status.Health
			return h != nil && h.Delivered == n
		}, "%s's folded counts: %v, want %d delivered", ep, lazy(func() string { return fmt.Sprint(e.get(ep).Status.Health) }), n)
	}
	if first.Stats().BadSignatures+late.Stats().BadSignatures > 0 {
		t.Error("a request failed signature verification")
	}

	// Every consumer is a durable the controller made (e.endpoint makes them as it does): the
	// namespace's intake and queue consumers, none per endpoint.
	want := []string{streams.IntakeConsumer(e.ns), e.set.QueueConsumer()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range append(e.set.Streams(), "KV_"+e.set.Bucket()) {
		st, err := e.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for ci := range st.ListConsumers(ctx).Info() {
			if ci.Config.Durable == "" || !slices.Contains(want, ci.Name) {
				t.Errorf("stream %s has consumer %s (durable %q), which the controller did not make", name, ci.Name, ci.Config.Durable)
			}
		}
	}
	if t.Failed() {
		t.Logf("consumers the controller made: %s", strings.Join(want, ", "))
	}
}
