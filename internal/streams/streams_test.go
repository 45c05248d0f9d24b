package streams_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

func TestEnsureIsIdempotentAndSetsMaxConsumers(t *testing.T) {
	n := testenv.NewNATS(t)
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	cfg := streams.DefaultConfig()
	for range 2 {
		if err := streams.Ensure(ctx, js, cfg); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{cfg.Names.EventsStream, cfg.Names.DeliveriesStream} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.MaxConsumers; got != cfg.MaxConsumers {
			t.Errorf("%s MaxConsumers = %d, want %d", name, got, cfg.MaxConsumers)
		}
	}
	s, _ := js.Stream(ctx, cfg.Names.DeliveriesStream)
	if !s.CachedInfo().Config.AllowMsgSchedules || s.CachedInfo().Config.Retention != jetstream.WorkQueuePolicy {
		t.Errorf("deliveries stream must be a work queue with message schedules: %+v", s.CachedInfo().Config)
	}
}

// A retry is a scheduled message: it waits on its own subject, not as a pending message of the
// endpoint's consumer, and the server publishes it onto the delivery subject, headers intact,
// when it is due.
func TestScheduledRetryArrivesWhenDueWithoutHoldingTheConsumer(t *testing.T) {
	n := testenv.NewNATS(t)
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := streams.DefaultConfig()
	if err := streams.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Names.DeliveriesStream,
		cfg.EndpointConsumer("team-a", "orders.v1", streams.EndpointConsumerOptions{MaxInFlight: 1, Timeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(1500 * time.Millisecond)
	retry := nats.NewMsg(cfg.RetrySubject("team-a", "orders.v1", "whdl_x"))
	retry.Header.Set("Nats-Schedule", "@at "+due.UTC().Format(time.RFC3339Nano))
	retry.Header.Set("Nats-Schedule-Target", cfg.DeliverySubject("team-a", "orders.v1"))
	retry.Header.Set("Whk-Attempts", "3")
	retry.Data = []byte(`{"late":true}`)
	if _, err := js.PublishMsg(ctx, retry); err != nil {
		t.Fatalf("publishing a scheduled retry: %v", err)
	}
	// A fresh delivery published after the retry flows first: the retry holds nothing.
	if _, err := js.Publish(ctx, cfg.DeliverySubject("team-a", "orders.v1"), []byte(`{"new":true}`)); err != nil {
		t.Fatal(err)
	}
	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	first := <-msgs.Messages()
	if first == nil || string(first.Data()) != `{"new":true}` {
		t.Fatalf("want the new delivery first, got %v", first)
	}
	_ = first.Ack()
	msgs, err = cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := <-msgs.Messages()
	if got == nil {
		t.Fatal("the scheduled retry never arrived")
	}
	if time.Now().Before(due) {
		t.Errorf("retry arrived early")
	}
	if got.Headers().Get("Whk-Attempts") != "3" || string(got.Data()) != `{"late":true}` {
		t.Errorf("retry lost its headers or body: %v %q", got.Headers(), got.Data())
	}
	_ = got.Ack()
	info, err := js.Stream(ctx, cfg.Names.DeliveriesStream)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for info.CachedInfo().State.Msgs != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		info, _ = js.Stream(ctx, cfg.Names.DeliveriesStream)
	}
	if m := info.CachedInfo().State.Msgs; m != 0 {
		t.Errorf("deliveries stream keeps %d messages after everything was acknowledged", m)
	}
}

func TestNamesAreOneToOne(t *testing.T) {
	n := streams.DefaultNames()
	if got := n.DeliverySubject("ns", "a.b"); got != "whk.d.ns.a_b" {
		t.Errorf("DeliverySubject = %q", got)
	}
	if streams.EndpointName(streams.EndpointToken("a.b-c.d")) != "a.b-c.d" {
		t.Error("EndpointName does not reverse EndpointToken")
	}
	long := streams.EndpointConsumer("ns", string(make([]byte, 300)))
	if len(long) > 200 {
		t.Errorf("consumer name too long: %d", len(long))
	}
	if et, ok := n.EventType("webhooks.ns.order.created", "ns"); !ok || et != "order.created" {
		t.Errorf("EventType = %q %v", et, ok)
	}
	if _, ok := n.EventType("webhooks.other.order.created", "ns"); ok {
		t.Error("EventType accepted another namespace")
	}
}

// A drain consumer sees both an endpoint's waiting deliveries and its scheduled retries long
// before they are due, and acknowledging a retry removes it for good.
func TestDrainConsumerTakesDeliveriesAndScheduledRetries(t *testing.T) {
	n := testenv.NewNATS(t)
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := streams.DefaultConfig()
	if err := streams.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, cfg.DeliverySubject("ns", "ep"), []byte("now")); err != nil {
		t.Fatal(err)
	}
	retry := nats.NewMsg(cfg.RetrySubject("ns", "ep", "whdl_late"))
	retry.Header.Set("Nats-Schedule", "@at "+time.Now().Add(24*time.Hour).UTC().Format(time.RFC3339))
	retry.Header.Set("Nats-Schedule-Target", cfg.DeliverySubject("ns", "ep"))
	retry.Data = []byte("late")
	if _, err := js.PublishMsg(ctx, retry); err != nil {
		t.Fatal(err)
	}
	// Another endpoint's delivery is left alone.
	if _, err := js.Publish(ctx, cfg.DeliverySubject("ns", "other"), []byte("other")); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Names.DeliveriesStream, cfg.DrainConsumerConfig("ns", "ep"))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for m := range batch.Messages() {
		got = append(got, string(m.Data()))
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || got[0] != "now" || got[1] != "late" {
		t.Fatalf("drained %q, want [now late]", got)
	}
	s, err := js.Stream(ctx, cfg.Names.DeliveriesStream)
	if err != nil {
		t.Fatal(err)
	}
	if msgs := s.CachedInfo().State.Msgs; msgs != 1 {
		t.Errorf("deliveries stream holds %d messages, want only the other endpoint's", msgs)
	}
}

// A router whose endpoints read other namespaces filters on each of them once; its start
// time survives a change of filters.
func TestRouterConsumerForSourceNamespaces(t *testing.T) {
	cfg := streams.DefaultConfig()
	if got := streams.ConsumerFilters(cfg.RouterConsumerFor("a", "", time.Time{}, nil)); len(got) != 1 || got[0] != "webhooks.a.>" {
		t.Errorf("own namespace only: %q", got)
	}
	got := streams.ConsumerFilters(cfg.RouterConsumerFor("a", "", time.Time{}, []string{"c", "a", "b", "c"}))
	want := []string{"webhooks.a.>", "webhooks.b.>", "webhooks.c.>"}
	if len(got) != len(want) {
		t.Fatalf("filters %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("filters %q, want %q", got, want)
		}
	}

	n := testenv.NewNATS(t)
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	if _, err := js.CreateConsumer(ctx, cfg.Names.EventsStream, cfg.RouterConsumerFor("a", "", start, nil)); err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(ctx, cfg.Names.EventsStream, streams.RouterConsumer("a", ""))
	if err != nil {
		t.Fatal(err)
	}
	upd := c.CachedInfo().Config
	upd.FilterSubject, upd.FilterSubjects = "", cfg.RouterFilters("a", []string{"b"})
	c, err = js.UpdateConsumer(ctx, cfg.Names.EventsStream, upd)
	if err != nil {
		t.Fatalf("adding a source namespace to a router: %v", err)
	}
	if f := streams.ConsumerFilters(c.CachedInfo().Config); len(f) != 2 {
		t.Errorf("filters after update: %q", f)
	}
	if st := c.CachedInfo().Config.OptStartTime; st == nil || !st.Equal(start) {
		t.Errorf("start time after update: %v, want %v", st, start)
	}
}

// Seed 002: the delivery log keeps 30 days. The attempts stream's MaxAge is 30 days as the
// server stores it, and a real nats-server drops records once they are older than the MaxAge
// (here --attempts-max-age=2s), so nothing else has to purge them.
func TestDeliveryLogExpiresAtItsMaxAge(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := streams.DefaultConfig()
	if got := cfg.AttemptsStream().MaxAge; got != 30*24*time.Hour {
		t.Errorf("the delivery log's MaxAge is %s, want 30 days", got)
	}
	n := testenv.NewNATS(t)
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := streams.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, cfg.Names.AttemptsStream)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != 30*24*time.Hour {
		t.Errorf("the server keeps the delivery log %s, want 30 days", got)
	}

	// The same stream with a short MaxAge, on the same server: records past it are dropped.
	cfg.AttemptsMaxAge = 2 * time.Second
	if err := streams.Ensure(ctx, js, cfg); err != nil {
		t.Fatalf("a 2s delivery log: %v", err)
	}
	ack, err := js.Publish(ctx, cfg.AttemptSubject("team-a", "orders"), []byte(`{"deliveryId":"whdl_old","state":"succeeded"}`))
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.MaxAge != 2*time.Second {
			t.Fatalf("MaxAge not updated: %s", info.Config.MaxAge)
		}
		if info.State.Msgs == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the record is still stored after %s: %d messages", time.Minute, info.State.Msgs)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := s.GetMsg(ctx, ack.Sequence); err == nil {
		t.Error("the expired record can still be read")
	}
}
