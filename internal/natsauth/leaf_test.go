package natsauth_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A leaf site publishes its namespace's events, but not the operator's operational events
// among them: those are the namespace's dispatcher's to write.
func TestLeafSitesCannotForgeOperationalEvents(t *testing.T) {
	site := natsauth.LeafSite{Name: "branch", Namespace: "a", User: "leaf-branch", Password: "leaf-branch-secret"}
	n, admin := testenv.NewCalloutNATS(t, func(a *testenv.NATSAuth) { a.Config.LeafSites = []natsauth.LeafSite{site} })
	createBus(t, admin, streams.DefaultConfig(), "a")

	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{}
	if err := opts.ProcessConfigString(fmt.Sprintf("listen: \"127.0.0.1:%d\"\nleafnodes { remotes: [ { urls: [\"nats-leaf://%s:%s@127.0.0.1:%d\"] } ] }\n",
		port, site.User, site.Password, n.LeafPort)); err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	leaf, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go leaf.Start()
	t.Cleanup(leaf.Shutdown)
	if !leaf.ReadyForConnections(10 * time.Second) {
		t.Fatal("the leaf node did not start")
	}
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Once the leaf connection is up and the hub's interest has reached the leaf, events go.
	testenv.Eventually(t, 30*time.Second, func() error {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := js.Publish(pctx, "webhooks.a.order.created", []byte(`{"n":1}`))
		return err
	}, "an event published behind the leaf node")

	if err := nc.Publish("webhooks.a.webhook_operator.endpoint_disabled", []byte(`{"forged":true}`)); err != nil {
		t.Fatal(err)
	}
	// The leaf connection carries both in order: once the later event is stored, the forged
	// one was taken or dropped.
	if _, err := js.Publish(ctx, "webhooks.a.order.created", []byte(`{"n":2}`)); err != nil {
		t.Fatal(err)
	}
	st, err := admin.Stream(ctx, busFor("a").Events.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("webhooks.a.>"))
	if err != nil {
		t.Fatal(err)
	}
	if got := info.State.Subjects["webhooks.a.webhook_operator.endpoint_disabled"]; got != 0 {
		t.Errorf("the leaf site stored %d operational events of namespace a", got)
	}
	if got := info.State.Subjects["webhooks.a.order.created"]; got < 2 {
		t.Errorf("the leaf site's events: %d stored, want 2: %v", got, info.State.Subjects)
	}
	// The site's login is for leaf node connections only.
	if c, err := nats.Connect(n.URL(), nats.UserInfo(site.User, site.Password), nats.MaxReconnects(0), nats.Timeout(natsauth.ConnectTimeout)); err == nil {
		c.Close()
		t.Error("a client connection logged in with the leaf site's login")
	}
}
