package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A tenant cannot fill the storage every tenant shares by holding events: namespace a, whose
// WebhookQuota bounds its deliveries stream to 64Ki, has a suspended endpoint that receives
// 101 events of about 1 KiB from a's producer (through the auth callout). Its dispatcher
// copies held events into the deliveries stream only up to 80% of the bound: the rest wait
// in the events stream, none is dropped (the stream never reached its bound, which discards
// its oldest), the endpoints say StorageLimitReached DeliveriesStreamFull, and once the
// endpoint is resumed every event arrives. Namespace b, with the installation's bounds,
// delivers all its events throughout.
func TestHeldEventsStopAtTheDeliveriesBoundAndBIsUnaffected(t *testing.T) {
	const total = 101
	a, b := newUser(t, "held-a"), newUser(t, "held-b")
	a.apply(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookQuota
metadata: {name: default}
spec:
  storage: {deliveries: 64Ki}
`)
	rcvA, rcvB := a.receiver("orders"), b.receiver("orders")
	a.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: orders}
spec: {url: %s, eventTypes: [order.*], suspend: true}
`, rcvA.URL()))
	b.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: orders}
spec: {url: %s, eventTypes: [order.*]}
`, rcvB.URL()))
	b.waitReady("orders")

	admin, adminJS, err := stack.ConnectAdmin(nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx := context.Background()
	setA, setB := streams.DefaultConfig().For(a.ns), streams.DefaultConfig().For(b.ns)
	// a's deliveries stream has the quota's bound, and a its intake consumer on the events
	// stream (events from then on are its endpoint's).
	testenv.Eventually(t, 120*time.Second, func() error {
		s, err := adminJS.Stream(ctx, setA.DeliveriesStream())
		if err != nil {
			return err
		}
		if got := s.CachedInfo().Config.MaxBytes; got != 64<<10 {
			return fmt.Errorf("a's deliveries stream is bounded to %d bytes", got)
		}
		_, err = adminJS.Consumer(ctx, setA.EventsStream(), streams.IntakeConsumer(a.ns))
		return err
	}, "")

	pa, pb := producerJS(t, a.ns), producerJS(t, b.ns)
	pad := strings.Repeat("p", 1000)
	var idsA, idsB []string
	for i := range total {
		idA, idB := fmt.Sprintf("held-a-%d", i), fmt.Sprintf("held-b-%d", i)
		idsA, idsB = append(idsA, idA), append(idsB, idB)
		body := fmt.Sprintf(`{"n":%d,"pad":%q}`, i, pad)
		for _, p := range []struct {
			js  jetstream.JetStream
			set streams.Set
			id  string
		}{{pa, setA, idA}, {pb, setB, idB}} {
			if _, err := p.js.Publish(ctx, p.set.EventSubject("order.created"), []byte(body), jetstream.WithMsgID(p.id)); err != nil {
				t.Fatalf("publishing %s: %v", p.id, err)
			}
		}
	}
	// b delivers all its events while a holds.
	receive(t, rcvB, idsB...)

	// a: the held copies stop short of the bound, the rest wait in the events stream, and
	// together they are every event.
	a.must(nil, "kubectl", "wait", "--timeout=150s", `--for=jsonpath={.status.conditions[?(@.type=="StorageLimitReached")].reason}=DeliveriesStreamFull`, "whe/orders")
	var held jetstream.StreamState
	var maxBytes int64
	var waiting uint64
	testenv.Eventually(t, 60*time.Second, func() error {
		s, err := adminJS.Stream(ctx, setA.DeliveriesStream())
		if err != nil {
			return err
		}
		c, err := adminJS.Consumer(ctx, setA.EventsStream(), streams.IntakeConsumer(a.ns))
		if err != nil {
			return err
		}
		ci := c.CachedInfo()
		held, maxBytes, waiting = s.CachedInfo().State, s.CachedInfo().Config.MaxBytes, ci.NumPending+uint64(ci.NumAckPending)
		if held.Msgs+waiting != total {
			return fmt.Errorf("a holds %d copies and %d events wait: %d of %d", held.Msgs, waiting, held.Msgs+waiting, total)
		}
		return nil
	}, "")
	t.Logf("a: %d held copies, %d of %d bytes; %d events wait in the events stream", held.Msgs, held.Bytes, maxBytes, waiting)
	if held.Msgs == 0 || waiting == 0 {
		t.Errorf("a holds %d copies and %d events wait: want both", held.Msgs, waiting)
	}
	if int64(held.Bytes) >= maxBytes || held.FirstSeq != 1 || held.LastSeq != held.Msgs {
		t.Errorf("a's deliveries stream reached its bound or dropped copies: %d of %d bytes, sequences %d..%d for %d messages",
			held.Bytes, maxBytes, held.FirstSeq, held.LastSeq, held.Msgs)
	}
	if n := len(rcvA.Requests()); n != 0 {
		t.Errorf("a's suspended endpoint got %d requests", n)
	}
	if r := b.jsonpath("whe/orders", `{.status.conditions[?(@.type=="StorageLimitReached")].reason}`); r == "DeliveriesStreamFull" {
		t.Error("b's endpoint says its deliveries stream is full")
	}

	// Resumed, a's endpoint gets every event: the held copies and those that waited.
	a.must(nil, "kubectl", "patch", "whe", "orders", "--type=merge", "-p", `{"spec":{"suspend":false}}`)
	receive(t, rcvA, idsA...)
	t.Logf("a delivered %d distinct events after resuming; b %d", len(rcvA.RequestsByID()), len(rcvB.RequestsByID()))
	a.must(nil, "kubectl", "wait", "--timeout=150s", `--for=jsonpath={.status.conditions[?(@.type=="StorageLimitReached")].reason}=WithinLimits`, "whe/orders")
}

// producerJS connects as namespace ns's producer (its ServiceAccount bound to
// webhook-operator-producer, through the auth callout).
func producerJS(t *testing.T, ns string) jetstream.JetStream {
	t.Helper()
	nc, err := producerConn(t, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// producerConn connects to the bus as namespace ns's producer; the error is the bus's answer.
func producerConn(t *testing.T, ns string) (*nats.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts, err := stack.Producer(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	return nats.Connect(stack.NATSURL, append(opts, nats.MaxReconnects(0))...)
}
