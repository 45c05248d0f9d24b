package natsauth_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Every tenant connection is bounded: its user JWT carries the limits, and the server, which
// enforces a callout user's JWT limits only with an operator, refuses larger payloads and more
// subscriptions through the tenants' account. The admin is not bound by them.
func TestTenantConnectionsAreLimited(t *testing.T) {
	limits := natsauth.Limits{MaxPayload: 4096, MaxSubscriptions: 20, MaxData: 1 << 20}
	w := newWorldWith(t, func(a *testenv.NATSAuth) { a.Config.TenantLimits = limits })
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	tok := token(t, "a", "producer", natsauth.DefaultAudience)

	uc := userClaims(t, w.svc, tok)
	if uc.Limits.Payload != limits.MaxPayload || uc.Limits.Subs != limits.MaxSubscriptions || uc.Limits.Data != limits.MaxData {
		t.Errorf("the user JWT's limits are %+v, want %+v", uc.Limits.NatsLimits, limits)
	}

	c := w.mustConnect(tok, "a")
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := c.nc.MaxPayload(); got != limits.MaxPayload {
		t.Errorf("the server tells the connection a payload limit of %d, want %d", got, limits.MaxPayload)
	}
	ctx := context.Background()
	if _, err := c.js.Publish(ctx, "webhooks.a.order.created", make([]byte, 4000)); err != nil {
		t.Fatalf("an event within the limit: %v", err)
	}
	if _, err := c.js.Publish(ctx, "webhooks.a.order.created", make([]byte, 5000)); !errors.Is(err, nats.ErrMaxPayload) {
		t.Errorf("an event above the limit: %v, want %v", err, nats.ErrMaxPayload)
	}
	for range 2 * limits.MaxSubscriptions {
		_, _ = c.nc.SubscribeSync(c.nc.NewInbox())
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return strings.Contains(c.violations(), "maximum subscriptions exceeded")
	}, "no subscription refused beyond %d; errors: %s", limits.MaxSubscriptions, c.violations())
	if !c.nc.IsConnected() {
		t.Error("the connection is gone after its refused subscriptions")
	}

	nc, _, err := w.nats.Connect(nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if nc.MaxPayload() <= limits.MaxPayload {
		t.Errorf("the admin's payload limit is %d: the tenants' limits bind it", nc.MaxPayload())
	}
}

// What tenants write goes into the JetStream account's storage. Bounded there, it takes no
// more of the server than the bound: a namespace whose streams' size bounds do not fit any more
// is refused when its streams are created, and writes to what has no bound of its own (here a
// deliveries stream the installation leaves unbounded) stop at the account's bound.
func TestTenantsStorageIsBoundedByTheJetStreamAccount(t *testing.T) {
	const bound = 16 << 20
	small := streams.DefaultConfig()
	small.EventsMaxBytes, small.AttemptsMaxBytes, small.DeadLetterMaxBytes, small.BucketMaxBytes = 1<<20, 1<<20, 1<<20, 1<<20
	small.DeliveriesMaxBytes, small.DeliveriesMaxMsgs = 0, 0
	w := newWorldOf(t, func(a *testenv.NATSAuth) { a.Config.JetStreamMaxStore = bound }, small)
	ctx := context.Background()
	ensureNamespace(t, "c")
	if err := streams.DefaultConfig().For("c").Ensure(ctx, w.admin); err == nil || !strings.Contains(err.Error(), "insufficient") {
		t.Errorf("creating namespace c's streams beyond the bound: %v, want insufficient resources", err)
	}

	serviceAccount(t, "a", "webhook-dispatcher", true)
	tok := token(t, "a", "webhook-dispatcher", natsauth.DefaultAudience)
	c := w.mustConnect(tok, "a")
	payload := make([]byte, 64<<10)
	var refused error
	for i := 0; i < 2*bound/len(payload) && refused == nil; i++ {
		_, refused = c.js.Publish(ctx, "whk.d.a.orders", payload)
	}
	if refused == nil {
		t.Fatal("a dispatcher wrote twice the bound without a refusal")
	}
	a, err := w.admin.AccountInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if int64(a.Store) > bound {
		t.Errorf("the JetStream account stores %d bytes with a bound of %d", a.Store, bound)
	}
}
