package natsauth_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// inboxesOf are the inbox prefixes (first subject token) of the subscriptions of the
// connections named name, as NATS monitoring (/connz?subs=1) lists them to whoever reaches it.
func inboxesOf(t *testing.T, s *server.Server, name string) []string {
	t.Helper()
	cz, err := s.Connz(&server.ConnzOptions{Subscriptions: true})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range cz.Conns {
		if c.Name != name {
			continue
		}
		for _, sub := range c.Subs {
			if p, _, _ := strings.Cut(sub, "."); strings.HasPrefix(p, "_INBOX") {
				out = append(out, p)
			}
		}
	}
	return out
}

// A connection cannot claim another's inbox: namespace a's producer, which read the inboxes of
// b's dispatcher and of the data API server (which reads every namespace's streams for the
// Kubernetes API's callers) in NATS monitoring, gets none of what the dispatcher pulls or the
// server reads by direct gets, whether it names the inbox as its password, presents the
// victim's public nkey, or subscribes there from a connection of its own.
func TestAnInboxCannotBeClaimed(t *testing.T) {
	w := newWorld(t, true)
	serviceAccount(t, "b", "webhook-dispatcher", true)
	serviceAccount(t, "b", "data-api", false)
	w.svc.Kube.DataAPI = "b/data-api"
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	ctx := context.Background()
	b := busFor("b")
	const consumer = "ep_b_orders"
	if _, err := w.admin.CreateConsumer(ctx, b.Deliveries.Name, jetstream.ConsumerConfig{Durable: consumer,
		FilterSubject: "whk.d.b.orders", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	const n = 3
	for i := range n {
		if _, err := w.admin.Publish(ctx, "whk.d.b.orders", fmt.Appendf(nil, `{"secret":"delivery %d of b"}`, i)); err != nil {
			t.Fatal(err)
		}
		if _, err := w.admin.Publish(ctx, "whk.dlq.b.orders.x", fmt.Appendf(nil, `{"secret":"dead letter %d of b"}`, i)); err != nil {
			t.Fatal(err)
		}
	}

	// The victims: b's dispatcher and b's viewer, each with an inbox subscription listed in
	// monitoring once it made a request.
	connectNamed := func(tok, ns, name string) *client {
		t.Helper()
		opts := append(natsauth.ClientOptions(func() string { return tok }, ns), nats.Name(name), nats.MaxReconnects(0))
		nc, err := nats.Connect(w.nats.URL(), opts...)
		if err != nil {
			t.Fatalf("%s: %v\ncallout log:\n%s", name, err, w.log)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return &client{nc: nc, js: js}
	}
	dispatcher := connectNamed(token(t, "b", "webhook-dispatcher", natsauth.DefaultAudience), "b", "victim-dispatcher")
	cons, err := dispatcher.js.Consumer(ctx, b.Deliveries.Name, consumer)
	if err != nil {
		t.Fatal(err)
	}
	viewer := connectNamed(token(t, "b", "data-api", natsauth.DefaultAudience), "b", "victim-viewer")
	dlq, err := streamread.Open(ctx, viewer.nc, viewer.js, b.DeadLetters.Name)
	if err != nil {
		t.Fatal(err)
	}
	victims := map[string]bool{}
	for _, name := range []string{"victim-dispatcher", "victim-viewer"} {
		found := inboxesOf(t, w.nats.Server, name)
		if len(found) == 0 {
			t.Fatalf("monitoring lists no inbox of %s", name)
		}
		for _, p := range found {
			victims[p] = true
		}
	}

	// The attacks, each counting what its connection receives on the victims' inboxes.
	attacker := token(t, "a", "producer", natsauth.DefaultAudience)
	var stolen atomic.Int64
	var spies []*nats.Conn
	spy := func(how string, opts func(inbox string) []nats.Option) {
		t.Helper()
		for inbox := range victims {
			all := append([]nats.Option{nats.Token(attacker), nats.MaxReconnects(0), nats.Timeout(natsauth.ConnectTimeout),
				nats.CustomInboxPrefix(inbox), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}, opts(inbox)...)
			nc, err := nats.Connect(w.nats.URL(), all...)
			if err != nil {
				continue // refused: nothing to steal with
			}
			t.Cleanup(nc.Close)
			if _, err := nc.Subscribe(inbox+".>", func(*nats.Msg) { stolen.Add(1) }); err != nil {
				t.Fatalf("%s: %v", how, err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatalf("%s: %v", how, err)
			}
			spies = append(spies, nc)
		}
	}
	spy("the inbox as the password", func(inbox string) []nats.Option { return []nats.Option{nats.UserInfo("a", inbox)} })
	spy("its own nkey", func(string) []nats.Option { return proving(nats.UserInfo("a", "")) })
	spy("the victim's public nkey", func(inbox string) []nats.Option {
		impostor, _ := nkeys.CreateUser()
		return []nats.Option{nats.UserInfo("a", ""), nats.Nkey(strings.TrimPrefix(inbox, "_INBOX_"), impostor.Sign)}
	})

	// The victims read what they may.
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range batch.Messages() {
		got++
		_ = m.Ack()
	}
	if got != n {
		t.Fatalf("b's dispatcher pulled %d of %d deliveries: %v", got, n, batch.Error())
	}
	msgs, err := dlq.Forward(ctx, "whk.dlq.b.>", 1, 10)
	if err != nil || len(msgs) != n {
		t.Fatalf("b's viewer read %d of %d dead letters: %v", len(msgs), n, err)
	}
	// Whatever the server copied to a spy was queued to it before the victim's copy was:
	// one round trip brings it.
	for _, nc := range spies {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if s := stolen.Load(); s != 0 {
		t.Fatalf("a's producer received %d messages sent to b's inboxes (%d spying connections)", s, len(spies))
	}
	if !w.log.has("bus connection refused", "a NATS password is refused") {
		t.Errorf("the claim by password is not refused:\n%s", w.log)
	}
	if !w.log.has("bus connection refused", "signature of the server's nonce does not verify") {
		t.Errorf("the claim with the victim's public nkey is not refused:\n%s", w.log)
	}
}

// The data API server reads the deliveries an endpoint holds in the deliveries stream, as a
// list of webhookdeliveries shows them (stored-message gets). Tenants no longer read there:
// they read through the data API (TestTenantsHoldNoReadOfTheStreams).
func TestTheDataAPIReadsTheDeliveriesStream(t *testing.T) {
	w := newWorld(t, true)
	serviceAccount(t, "a", "data-api", false)
	w.svc.Kube.DataAPI = "a/data-api"
	ctx := context.Background()
	a := busFor("a")
	for i := range 3 {
		if _, err := w.admin.Publish(ctx, "whk.d.a.orders", fmt.Appendf(nil, `{"held":%d}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	v := w.mustConnect(token(t, "a", "data-api", natsauth.DefaultAudience), "a")
	st, err := streamread.Open(ctx, v.nc, v.js, a.Deliveries.Name)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	back := st.Backward("whk.d.a.orders", 0, 10)
	n := 0
	for {
		m, err := back.Next(rctx)
		if err != nil {
			t.Fatalf("reading the deliveries stream as the data API: %v\nviolations: %s", err, v.violations())
		}
		if m == nil {
			break
		}
		n++
	}
	if n != 3 {
		t.Errorf("the data API read %d held deliveries, want 3", n)
	}
}

// An nkey sent without its signature of the server's nonce is refused for what it is: the
// server passes its nonce on to the callout only with a signature, and the refusal used to
// blame the server's configuration.
func TestAnUnsignedNkeyIsRefusedForWhatItIs(t *testing.T) {
	w := newWorld(t, true)
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	unsigned := func([]byte) ([]byte, error) { return nil, nil }
	nc, err := nats.Connect(w.nats.URL(), nats.Token(token(t, "a", "producer", natsauth.DefaultAudience)), nats.UserInfo("a", ""),
		nats.Nkey(pub, unsigned), nats.MaxReconnects(0), nats.Timeout(natsauth.ConnectTimeout))
	if err == nil {
		nc.Close()
		t.Fatal("a connection with an unsigned nkey was let in")
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return w.log.has("bus connection refused", "without its signature of the server's nonce")
	}, "the refusal of the unsigned nkey, saying why:\n%s", w.log)
	if w.log.has("configuration") {
		t.Errorf("the refusal blames the server's configuration:\n%s", w.log)
	}
}
