package streams_test

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

	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// connect starts a JetStream server for one test and connects to it.
func connect(t *testing.T) jetstream.JetStream { return testenv.NewJetStream(t) }

func TestEnsureIsIdempotentAndSetsLimits(t *testing.T) {
	js := connect(t)
	ctx := context.Background()
	cfg := streams.DefaultConfig()
	set := cfg.For("team-a")
	for range 2 {
		if err := set.Ensure(ctx, js); err != nil {
			t.Fatal(err)
		}
	}
	info := func(name string) jetstream.StreamConfig {
		t.Helper()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config
	}
	for _, name := range []string{set.EventsStream(), set.DeliveriesStream()} {
		if got := info(name).MaxConsumers; got != cfg.MaxConsumers {
			t.Errorf("%s MaxConsumers = %d, want %d", name, got, cfg.MaxConsumers)
		}
	}
	if c := info(set.DeliveriesStream()); !c.AllowMsgSchedules || c.Retention != jetstream.WorkQueuePolicy {
		t.Errorf("deliveries stream must be a work queue with message schedules: %+v", c)
	}
	// Storage bounds: the log and the events lose their oldest first, dead letters refuse new
	// ones when full.
	for _, want := range []struct {
		stream  string
		bytes   int64
		discard jetstream.DiscardPolicy
	}{
		{set.EventsStream(), streams.DefaultEventsMaxBytes, jetstream.DiscardOld},
		{set.AttemptsStream(), streams.DefaultAttemptsMaxBytes, jetstream.DiscardOld},
		{set.DeadLetterStream(), streams.DefaultDeadLetterMaxBytes, jetstream.DiscardNew},
	} {
		c := info(want.stream)
		if c.MaxBytes != want.bytes || c.Discard != want.discard {
			t.Errorf("%s: MaxBytes %d discard %v, want %d %v", want.stream, c.MaxBytes, c.Discard, want.bytes, want.discard)
		}
	}
	if c := info(set.AttemptsStream()); c.MaxAge != 30*24*time.Hour {
		t.Errorf("delivery log MaxAge = %s, want 30 days", c.MaxAge)
	}
	kv, err := js.KeyValue(ctx, set.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bc := st.(*jetstream.KeyValueBucketStatus).Config()
	if bc.MaxBytes != streams.DefaultBucketMaxBytes || bc.MaxValueSize != streams.DefaultBucketMaxValueSize || bc.LimitMarkerTTL <= 0 {
		t.Errorf("bucket bounds: MaxBytes %d MaxValueSize %d LimitMarkerTTL %s", bc.MaxBytes, bc.MaxValueSize, bc.LimitMarkerTTL)
	}
}

// A full dead-letter stream refuses a new dead letter (the dispatcher keeps the delivery and
// tries again) and keeps every one it holds.
func TestFullDeadLetterStreamRefusesNewOnes(t *testing.T) {
	js := connect(t)
	ctx := context.Background()
	cfg := streams.DefaultConfig()
	cfg.DeadLetterMaxBytes = 4096
	set := cfg.For("ns")
	if err := set.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 1000)
	stored := 0
	var refused error
	for i := range 10 {
		if _, err := js.Publish(ctx, set.DeadLetterSubject("ep", fmt.Sprintf("whdl_%d", i)), body); err != nil {
			refused = err
			break
		}
		stored++
	}
	if refused == nil {
		t.Fatal("a full dead-letter stream accepted every dead letter")
	}
	s, err := js.Stream(ctx, set.DeadLetterStream())
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().State; got.Msgs != uint64(stored) || got.FirstSeq != 1 {
		t.Errorf("dead-letter stream holds %d messages from sequence %d, want all %d stored from 1", got.Msgs, got.FirstSeq, stored)
	}
}

// A retry is a scheduled message: it waits on its own subject, not as a pending message of the
// endpoint's consumer, and the server publishes it onto the delivery subject, headers intact,
// when it is due.
func TestScheduledRetryArrivesWhenDueWithoutHoldingTheConsumer(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := streams.DefaultConfig().For("team-a")
	if err := cfg.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.DeliveriesStream(),
		cfg.EndpointConsumerConfig("orders.v1", streams.EndpointConsumerOptions{MaxInFlight: 1, Timeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(1500 * time.Millisecond)
	retry := nats.NewMsg(cfg.RetrySubject("orders.v1", "whdl_x"))
	retry.Header.Set("Nats-Schedule", "@at "+due.UTC().Format(time.RFC3339Nano))
	retry.Header.Set("Nats-Schedule-Target", cfg.DeliverySubject("orders.v1"))
	retry.Header.Set("Whk-Attempts", "3")
	retry.Data = []byte(`{"late":true}`)
	if _, err := js.PublishMsg(ctx, retry); err != nil {
		t.Fatalf("publishing a scheduled retry: %v", err)
	}
	// A fresh delivery published after the retry flows first: the retry holds nothing.
	if _, err := js.Publish(ctx, cfg.DeliverySubject("orders.v1"), []byte(`{"new":true}`)); err != nil {
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
	if err := testenv.Poll(5*time.Second, func() error {
		info, err := js.Stream(ctx, cfg.DeliveriesStream())
		if err != nil {
			return err
		}
		if m := info.CachedInfo().State.Msgs; m != 0 {
			return fmt.Errorf("%d messages", m)
		}
		return nil
	}); err != nil {
		t.Errorf("the deliveries stream keeps messages after everything was acknowledged: %v", err)
	}
}

func TestNamesOfANamespace(t *testing.T) {
	n := streams.DefaultNames().For("team-a")
	for _, c := range []struct{ got, want string }{
		{n.EventsStream(), "WEBHOOKS_team-a"},
		{n.DeliveriesStream(), "WEBHOOKS_DELIVERIES_team-a"},
		{n.AttemptsStream(), "WEBHOOKS_ATTEMPTS_team-a"},
		{n.DeadLetterStream(), "WEBHOOKS_DLQ_team-a"},
		{n.Bucket(), "webhook-operator-team-a"},
		{n.EventSubject("order.created"), "webhooks.team-a.order.created"},
		{n.EventsFilter(), "webhooks.team-a.>"},
		{n.DeliverySubject("a.b"), "whk.d.team-a.a_b"},
		{n.RetrySubject("a.b", "whdl_1"), "whk.r.team-a.a_b.whdl_1"},
		{n.AttemptSubject("a.b"), "whk.log.team-a.a_b"},
		{n.DeadLetterSubject("a.b", "whdl_1"), "whk.dlq.team-a.a_b.whdl_1"},
		{n.EndpointConsumer("a.b"), "ep_team-a_a_b"},
		{streams.RouterConsumer("team-a", ""), "router_team-a"},
		{streams.HealthKey("a.b"), "health.a_b"},
		{streams.LeaseKey("", 3), "lease._shared.p3"},
		{streams.LeaseKey("a.b", 0), "lease.a_b.p0"},
		{streams.MemberKey("", "pod-1"), "member._shared.pod-1"},
		{streams.MembersFilter("a.b"), "member.a_b.>"},
		{streams.FoldKey(""), "fold._shared"},
		{streams.EndpointConsumerOf("team-b", "a.b"), "ep_team-b_a_b"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if got := streams.ReplayKey("a.b", "k"); !strings.HasPrefix(got, "replay.a_b.") {
		t.Errorf("ReplayKey = %q", got)
	}
	if streams.EndpointName(streams.EndpointToken("a.b-c.d")) != "a.b-c.d" {
		t.Error("EndpointName does not reverse EndpointToken")
	}
	long := n.EndpointConsumer(string(make([]byte, 300)))
	if len(long) > 200 {
		t.Errorf("consumer name too long: %d", len(long))
	}
	if et, ok := n.EventType("webhooks.team-a.order.created"); !ok || et != "order.created" {
		t.Errorf("EventType = %q %v", et, ok)
	}
	if _, ok := n.EventType("webhooks.other.order.created"); ok {
		t.Error("EventType accepted another namespace")
	}
}

// Names stay valid and distinct at the bounds: the longest namespace with the longest
// prefixes is a valid stream name, and prefixes that could make two sets share a name are
// refused.
func TestNamespaceAndPrefixBounds(t *testing.T) {
	longNS := strings.Repeat("a", streams.MaxNamespaceLength)
	for _, ns := range []string{"a", "team-a", "0", longNS} {
		if err := streams.ValidateNamespace(ns); err != nil {
			t.Errorf("ValidateNamespace(%q): %v", ns, err)
		}
	}
	for _, ns := range []string{"", "a_b", "a.b", "Team", "-a", "a-", longNS + "a", "a b", "a>"} {
		if err := streams.ValidateNamespace(ns); err == nil {
			t.Errorf("ValidateNamespace(%q) accepted it", ns)
		}
	}
	p := strings.Repeat("P", streams.MaxPrefixLength)
	names := streams.Names{EventsStream: p, DeliveriesStream: p[1:], AttemptsStream: p[2:], DeadLetterStream: p[3:],
		Bucket: strings.Repeat("b", streams.MaxPrefixLength), EventsSubjectPrefix: "ev", InternalPrefix: "in"}
	if err := names.Validate(); err != nil {
		t.Fatal(err)
	}
	set := names.For(longNS)
	for _, name := range append(set.Streams(), "KV_"+set.Bucket()) {
		if len(name) > 255 || strings.ContainsAny(name, ".*> ") {
			t.Errorf("stream name %q (%d characters) is not a valid stream name", name, len(name))
		}
	}
	if err := streams.DefaultNames().Validate(); err != nil {
		t.Errorf("default names: %v", err)
	}
	for what, mutate := range map[string]func(*streams.Names){
		"same prefix twice":   func(n *streams.Names) { n.DeadLetterStream = n.EventsStream },
		"a KV_ prefix":        func(n *streams.Names) { n.EventsStream = "KV" },
		"a dot":               func(n *streams.Names) { n.AttemptsStream = "A.B" },
		"too long":            func(n *streams.Names) { n.Bucket = p + "x" },
		"same subject prefix": func(n *streams.Names) { n.InternalPrefix = n.EventsSubjectPrefix },
		"wildcard subject":    func(n *streams.Names) { n.EventsSubjectPrefix = "a.*" },
	} {
		n := streams.DefaultNames()
		mutate(&n)
		if err := n.Validate(); err == nil {
			t.Errorf("%s: accepted %+v", what, n)
		}
	}
}

// JetStream de-duplicates Nats-Msg-Id per events stream: the same id published in two
// namespaces is stored in both, and only a repeat within one namespace is a duplicate.
func TestDeduplicationIsPerNamespace(t *testing.T) {
	js := connect(t)
	ctx := context.Background()
	cfg := streams.DefaultConfig()
	a, b := cfg.For("a"), cfg.For("b")
	for _, s := range []streams.Set{a, b} {
		if err := s.Ensure(ctx, js); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(s streams.Set) *jetstream.PubAck {
		t.Helper()
		ack, err := js.Publish(ctx, s.EventSubject("order.created"), []byte(`{}`), jetstream.WithMsgID("order-1001"))
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	if ack := publish(b); ack.Duplicate || ack.Stream != b.EventsStream() {
		t.Errorf("first publish in b: %+v", ack)
	}
	if ack := publish(a); ack.Duplicate || ack.Stream != a.EventsStream() {
		t.Errorf("the same id in a was suppressed by b's: %+v", ack)
	}
	if ack := publish(a); !ack.Duplicate {
		t.Errorf("a repeat within a is not a duplicate: %+v", ack)
	}
}

// One namespace's set holds nothing of another's: every write of a lands in a's streams and
// bucket; b's stay empty, and deleting a's set leaves b's alone.
func TestNamespacesShareNothing(t *testing.T) {
	js := connect(t)
	ctx := context.Background()
	cfg := streams.DefaultConfig()
	a, b := cfg.For("a"), cfg.For("b")
	for _, s := range []streams.Set{a, b} {
		if err := s.Ensure(ctx, js); err != nil {
			t.Fatal(err)
		}
	}
	for _, subj := range []string{a.EventSubject("x"), a.DeliverySubject("ep"), a.AttemptSubject("ep"), a.DeadLetterSubject("ep", "whdl_1")} {
		if _, err := js.Publish(ctx, subj, []byte("a")); err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
	}
	kvA, err := js.KeyValue(ctx, a.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvA.Put(ctx, streams.HealthKey("ep"), []byte("a")); err != nil {
		t.Fatal(err)
	}
	count := func(name string) uint64 {
		t.Helper()
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().State.Msgs
	}
	for _, name := range a.Streams() {
		if got := count(name); got != 1 {
			t.Errorf("%s holds %d messages, want 1", name, got)
		}
	}
	for _, name := range append(b.Streams(), "KV_"+b.Bucket()) {
		if got := count(name); got != 0 {
			t.Errorf("%s holds %d messages of namespace a", name, got)
		}
	}
	kvB, err := js.KeyValue(ctx, b.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvB.Get(ctx, streams.HealthKey("ep")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("b's bucket has a's key: %v", err)
	}

	if err := a.Delete(ctx, js); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, js); err != nil {
		t.Errorf("deleting a deleted set: %v", err)
	}
	for _, name := range append(a.Streams(), "KV_"+a.Bucket()) {
		if _, err := js.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("%s after Delete: %v", name, err)
		}
	}
	if _, err := js.Publish(ctx, a.EventSubject("x"), []byte("a")); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("publishing to a deleted namespace: %v, want no stream", err)
	}
	for _, name := range b.Streams() {
		if _, err := js.Stream(ctx, name); err != nil {
			t.Errorf("%s after deleting a's set: %v", name, err)
		}
	}
}

// The shared events stream of an earlier version captures every namespace's subjects; the
// per-namespace set cannot be created next to it, and the error names it and what to do.
func TestLegacySharedStreamConflict(t *testing.T) {
	js := connect(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WEBHOOKS", Subjects: []string{"webhooks.>"}}); err != nil {
		t.Fatal(err)
	}
	err := streams.DefaultConfig().For("team-a").Ensure(ctx, js)
	var ce *streams.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("Ensure next to the shared stream: %v, want a ConflictError", err)
	}
	if ce.Existing != "WEBHOOKS" || ce.Stream != "WEBHOOKS_team-a" {
		t.Errorf("conflict: %+v", ce)
	}
	for _, want := range []string{"WEBHOOKS_team-a", "stream WEBHOOKS already captures", "nats stream rm WEBHOOKS", "docs/install.md"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
}

// A replay key expires after its TTL (per-key TTL, nats-server 2.11+); the bucket allows it.
func TestReplayKeysExpire(t *testing.T) {
	js := connect(t)
	ctx := context.Background()
	cfg := streams.DefaultConfig()
	cfg.ReplayKeyTTL = time.Second
	set := cfg.For("ns")
	if err := set.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, set.Bucket())
	if err != nil {
		t.Fatal(err)
	}
	key := streams.ReplayKey("ep", "fix-1")
	if _, err := kv.Create(ctx, key, []byte("whdl_x"), set.ReplayKeyTTL()...); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, key); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		_, err := kv.Get(ctx, key)
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, "the replay key to expire after its TTL")
	// Once expired, the same key can be created again.
	if _, err := kv.Create(ctx, key, []byte("whdl_y"), set.ReplayKeyTTL()...); err != nil {
		t.Errorf("re-creating an expired key: %v", err)
	}
}

// A deleted endpoint's retired consumer on the deliveries stream brings its scheduled retries
// long before they are due, those scheduled before what it had already delivered included, and
// the delivery a dispatcher still held; acknowledging a retry removes it for good, and another
// endpoint's delivery is left alone.
func TestRetiredDeliveriesConsumerTakesScheduledRetries(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := streams.DefaultConfig().For("ns")
	if err := cfg.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	opts := streams.EndpointConsumerOptions{MaxInFlight: 10, Timeout: time.Second}
	if err := cfg.EnsureDeliveriesConsumer(ctx, js, "ep", opts); err != nil {
		t.Fatal(err)
	}
	retry := nats.NewMsg(cfg.RetrySubject("ep", "whdl_late"))
	retry.Header.Set("Nats-Schedule", "@at "+time.Now().Add(24*time.Hour).UTC().Format(time.RFC3339))
	retry.Header.Set("Nats-Schedule-Target", cfg.DeliverySubject("ep"))
	retry.Data = []byte("late")
	if _, err := js.PublishMsg(ctx, retry); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"delivered", "held"} {
		if _, err := js.Publish(ctx, cfg.DeliverySubject("ep"), []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, cfg.DeliverySubject("other"), []byte("other")); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, cfg.DeliveriesStream(), cfg.EndpointConsumer("ep"))
	if err != nil {
		t.Fatal(err)
	}
	// A dispatcher delivered the first and holds the second, unacknowledged.
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if string(m.Data()) == "delivered" {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	ok, err := cfg.RetireDeliveriesConsumer(ctx, js, "ep", opts)
	if err != nil || !ok {
		t.Fatalf("RetireDeliveriesConsumer = %v, %v", ok, err)
	}
	batch, err = cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
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
	slices.Sort(got)
	if !slices.Equal(got, []string{"held", "late"}) {
		t.Fatalf("the retired consumer brought %q, want [held late]", got)
	}
	s, err := js.Stream(ctx, cfg.DeliveriesStream())
	if err != nil {
		t.Fatal(err)
	}
	if msgs := s.CachedInfo().State.Msgs; msgs != 1 {
		t.Errorf("deliveries stream holds %d messages, want only the other endpoint's", msgs)
	}
	// An endpoint that never had a consumer has none to retire.
	if ok, err := cfg.RetireDeliveriesConsumer(ctx, js, "never", opts); err != nil || ok {
		t.Errorf("RetireDeliveriesConsumer of an endpoint without a consumer = %v, %v", ok, err)
	}
}

// A router reads its own namespace's events stream and, with spec.sourceNamespaces, each
// source namespace's, through one consumer of the same name on each.
func TestRouterConsumersOnSourceNamespaces(t *testing.T) {
	if got := streams.SourceNamespaces("a", []string{"c", "a", "b", "c", ""}); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("SourceNamespaces = %q", got)
	}
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := streams.DefaultConfig()
	start := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	for _, ns := range []string{"a", "b"} {
		set := cfg.For(ns)
		if err := set.Ensure(ctx, js); err != nil {
			t.Fatal(err)
		}
		cc := set.RouterConsumerConfig("a", "", start)
		if cc.Durable != streams.RouterConsumer("a", "") || cc.FilterSubject != set.EventsFilter() {
			t.Errorf("router of a on %s: %+v", ns, cc)
		}
		c, err := js.CreateConsumer(ctx, set.EventsStream(), cc)
		if err != nil {
			t.Fatal(err)
		}
		if st := c.CachedInfo().Config.OptStartTime; st == nil || !st.Equal(start) {
			t.Errorf("start time: %v, want %v", st, start)
		}
	}
}

// Seed 002: the delivery log keeps 30 days. A namespace's attempts stream has a MaxAge of 30
// days as the server stores it, and a real nats-server drops records once they are older
// than the MaxAge (here --attempts-max-age=2s), so nothing else has to purge them.
func TestDeliveryLogExpiresAtItsMaxAge(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := streams.DefaultConfig()
	set := cfg.For("team-a")
	if got := set.AttemptsStreamConfig().MaxAge; got != 30*24*time.Hour {
		t.Errorf("the delivery log's MaxAge is %s, want 30 days", got)
	}
	js := connect(t)
	if err := set.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, set.AttemptsStream())
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != 30*24*time.Hour {
		t.Errorf("the server keeps the delivery log %s, want 30 days", got)
	}

	// The same stream with a short MaxAge, on the same server: records past it are dropped.
	cfg.AttemptsMaxAge = 2 * time.Second
	if err := cfg.For("team-a").Ensure(ctx, js); err != nil {
		t.Fatalf("a 2s delivery log: %v", err)
	}
	ack, err := js.Publish(ctx, set.AttemptSubject("orders"), []byte(`{"deliveryId":"whdl_old","state":"succeeded"}`))
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
			t.Fatalf("the record is still stored after a minute: %d messages", info.State.Msgs)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := s.GetMsg(ctx, ack.Sequence); err == nil {
		t.Error("the expired record can still be read")
	}
}

// The deliveries stream is bounded and drops its oldest messages (DiscardOld) when over: the
// server refuses DiscardNew on a stream with message schedules, which the deliveries stream
// needs for retries. A namespace's own bound (its WebhookQuota) keeps DiscardOld too, or the
// stream could not be created at all.
func TestDeliveriesStreamIsBoundedWithDiscardOld(t *testing.T) {
	js := connect(t)
	ctx := context.Background()
	cfg := streams.DefaultConfig()
	set := cfg.For("team-a")

	refused := set.DeliveriesStreamConfig()
	refused.Name, refused.Subjects = "PROBE", []string{"probe.>"}
	refused.MaxBytes, refused.Discard = 1<<20, jetstream.DiscardNew
	if _, err := js.CreateStream(ctx, refused); err == nil {
		t.Fatal("the server accepted DiscardNew on a stream with message schedules; the deliveries stream could use it")
	} else {
		t.Logf("DiscardNew with message schedules: %v", err)
	}

	for _, tc := range []struct {
		name  string
		set   streams.Set
		bytes int64
	}{
		{"installation bound", set, streams.DefaultDeliveriesMaxBytes},
		{"quota bound", cfg.For("team-b").WithBounds(streams.Bounds{Deliveries: 256 << 10}), 256 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.set.Ensure(ctx, js); err != nil {
				t.Fatal(err)
			}
			s, err := js.Stream(ctx, tc.set.DeliveriesStream())
			if err != nil {
				t.Fatal(err)
			}
			c := s.CachedInfo().Config
			if c.MaxBytes != tc.bytes || c.MaxMsgs != streams.DefaultDeliveriesMaxMsgs || c.Discard != jetstream.DiscardOld || !c.AllowMsgSchedules {
				t.Errorf("deliveries stream: MaxBytes %d MaxMsgs %d discard %v schedules %v, want %d %d DiscardOld true",
					c.MaxBytes, c.MaxMsgs, c.Discard, c.AllowMsgSchedules, tc.bytes, streams.DefaultDeliveriesMaxMsgs)
			}
		})
	}
}

// A deliveries bound lowered below what the stream holds (the installation's or a quota's)
// loses nothing: the stream discards its oldest beyond its bound, so its bound is raised to
// keep what it holds (at the hold threshold), and lowered once it has drained.
func TestLoweredDeliveriesBoundKeepsWhatIsHeld(t *testing.T) {
	js := connect(t)
	ctx := context.Background()
	set := streams.DefaultConfig().For("team-a")
	if err := set.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 1000)
	for range 60 {
		if _, err := js.Publish(ctx, set.DeliverySubject("orders"), body); err != nil {
			t.Fatal(err)
		}
	}
	lowered := set.WithBounds(streams.Bounds{Deliveries: 16 << 10})
	if err := lowered.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, set.DeliveriesStream())
	if err != nil {
		t.Fatal(err)
	}
	info := s.CachedInfo()
	if info.State.Msgs != 60 || info.State.FirstSeq != 1 {
		t.Fatalf("after the bound was lowered the stream holds %d messages from sequence %d, want all 60 from 1", info.State.Msgs, info.State.FirstSeq)
	}
	if b := info.Config.MaxBytes; b <= int64(info.State.Bytes) || int64(info.State.Bytes)*100 < b*streams.DeliveriesHoldPercent {
		t.Errorf("the raised bound %d does not put the %d bytes held at the hold threshold", b, info.State.Bytes)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lowered.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.Config.MaxBytes != 16<<10 {
		t.Errorf("drained, the stream's bound is %v (%v), want the lowered 16Ki", info.Config.MaxBytes, err)
	}
}

// MoveRetries moves an own lane's scheduled retry onto the shared lane's schedule: the same due
// time, the queue subject as its target, its own headers and body, nothing of its old place
// (the stream, subject and sequence a read of it carries), and the old one deleted. When due it
// arrives on the queue subject.
func TestMoveRetriesKeepsTheRetryAndNothingOfItsOldPlace(t *testing.T) {
	js := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := streams.DefaultConfig().For("team-a")
	if err := cfg.Ensure(ctx, js); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(2 * time.Second).UTC()
	retry := nats.NewMsg(cfg.RetrySubject("orders", "whdl_x"))
	retry.Header.Set("Nats-Schedule", "@at "+due.Format(time.RFC3339Nano))
	retry.Header.Set("Nats-Schedule-Target", cfg.DeliverySubject("orders"))
	retry.Header.Set("Nats-Msg-Id", "whdl_x/retry/1")
	retry.Header.Set("Whk-Attempts", "1")
	retry.Data = []byte(`{"late":true}`)
	if _, err := js.PublishMsg(ctx, retry); err != nil {
		t.Fatal(err)
	}
	if left, err := cfg.MoveRetries(ctx, js, "orders"); err != nil || left != 0 {
		t.Fatalf("MoveRetries: %d left, %v", left, err)
	}
	st, err := js.Stream(ctx, cfg.DeliveriesStream())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetLastMsgForSubject(ctx, cfg.RetrySubject("orders", "whdl_x")); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the own lane's retry is still there: %v", err)
	}
	moved, err := st.GetLastMsgForSubject(ctx, cfg.ScheduleSubject("orders", "whdl_x"))
	if err != nil {
		t.Fatalf("no retry on the shared lane's schedule: %v", err)
	}
	for k, want := range map[string]string{"Nats-Schedule": "@at " + due.Format(time.RFC3339Nano), "Nats-Schedule-Target": cfg.QueueSubject("orders"),
		"Nats-Msg-Id": "whdl_x/retry/1/shared", "Whk-Attempts": "1", jetstream.SubjectHeader: cfg.ScheduleSubject("orders", "whdl_x")} {
		if got := moved.Header.Values(k); len(got) != 1 || got[0] != want {
			t.Errorf("the moved retry's %s is %q, want %q alone", k, got, want)
		}
	}
	if moved.Subject != cfg.ScheduleSubject("orders", "whdl_x") || string(moved.Data) != `{"late":true}` {
		t.Errorf("the moved retry reads as %s %q", moved.Subject, moved.Data)
	}
	if err := testenv.Poll(15*time.Second, func() error {
		m, err := st.GetLastMsgForSubject(ctx, cfg.QueueSubject("orders"))
		if err != nil {
			return err
		}
		if time.Now().Before(due) || string(m.Data) != `{"late":true}` {
			return fmt.Errorf("arrived early or changed: %q", m.Data)
		}
		return nil
	}); err != nil {
		t.Errorf("the moved retry did not arrive on the queue subject when due: %v", err)
	}
}

// A set whose bounds do not fit in the server's storage (the test server's max_file_store is
// 256 GiB) fails with a StorageFullError that says how much a namespace reserves and what to
// change, not as a server that cannot be reached.
func TestASetBeyondTheServersStorageSaysWhatToChange(t *testing.T) {
	js := connect(t)
	cfg := streams.DefaultConfig()
	cfg.EventsMaxBytes = 300 << 30
	set := cfg.For("shop")
	err := set.Ensure(t.Context(), js)
	var full *streams.StorageFullError
	if !errors.As(err, &full) {
		t.Fatalf("Ensure: %v; want a *streams.StorageFullError", err)
	}
	want := cfg.EventsMaxBytes + cfg.DeliveriesMaxBytes + cfg.AttemptsMaxBytes + cfg.DeadLetterMaxBytes + cfg.BucketMaxBytes
	if full.Reservation != want || set.Reservation() != want {
		t.Fatalf("reservation %d (set: %d); want %d, the sum of the set's bounds", full.Reservation, set.Reservation(), want)
	}
	for _, s := range []string{"namespace shop", "stream " + set.EventsStream(), "max_file_store", "insufficient storage"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the error %q does not say %q", err, s)
		}
	}

	// Bounds that fit: the set is made.
	cfg.EventsMaxBytes = 1 << 20
	if err := cfg.For("shop").Ensure(t.Context(), js); err != nil {
		t.Fatalf("Ensure with bounds that fit: %v", err)
	}
}
