package natsauth_test

import (
	"context"
	"fmt"
	"path/filepath"
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
	a := n.Auth
	if err := opts.ProcessConfigString(fmt.Sprintf("listen: \"127.0.0.1:%d\"\n", port) +
		site.RenderRemote([]string{fmt.Sprintf("127.0.0.1:%d", n.LeafPort)}, *peerTLS(a.LeafTLS))); err != nil {
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

// The leaf node listener takes a site's connection only with a certificate of the leaf nodes'
// CA and the site's login: a certificate of the clients' CA (which every dispatcher namespace
// holds) is refused with the site's login, and the leaf nodes' certificate with a wrong one.
func TestLeafNodesRefuseARogueSite(t *testing.T) {
	site := natsauth.LeafSite{Name: "branch", Namespace: "a", User: "leaf-branch", Password: "leaf-branch-secret"}
	dir := t.TempDir()
	n, _ := testenv.NewCalloutNATS(t, func(a *testenv.NATSAuth) {
		a.Config.LeafSites = []natsauth.LeafSite{site}
		if err := a.WithTLS(filepath.Join(dir, "clients")); err != nil {
			t.Fatal(err)
		}
	})
	hubLog := &serverLog{}
	n.Server.SetLoggerV2(hubLog, false, false, false)
	hub := []string{fmt.Sprintf("127.0.0.1:%d", n.LeafPort)}
	leaf := func(name string, s natsauth.LeafSite, tls *natsauth.PeerTLS, want ...string) {
		t.Helper()
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		before := hubLog.count(want...)
		l, lLog := startServer(t, fmt.Sprintf("server_name: %q\nlisten: \"127.0.0.1:%d\"\n", name, port)+s.RenderRemote(hub, *tls))
		testenv.Eventually(t, 30*time.Second, func() error {
			if l.NumLeafNodes() > 0 || n.Server.NumLeafNodes() > 0 {
				return testenv.Stop(fmt.Errorf("%s connected as a leaf node", name))
			}
			if got := hubLog.count(want...); got < before+2 {
				return fmt.Errorf("the hub logged %d refusals (%q) of %s so far; hub:\n%s\n%s:\n%s", got-before, want, name, hubLog, name, lLog)
			}
			return nil
		}, "the hub refusing %s", name)
		l.Shutdown()
		l.WaitForShutdown()
	}
	clients := n.Auth.TLS
	leaf("rogue-client-cert", site, &natsauth.PeerTLS{CertFile: clients.PeerCert, KeyFile: clients.PeerKey, CAFile: n.Auth.LeafTLS.CA},
		"TLS leafnode handshake error", "certificate")
	wrong := site
	wrong.Password = "guessed"
	leaf("rogue-wrong-login", wrong, peerTLS(n.Auth.LeafTLS), "authentication error")

	// The site itself, with both, connects: what the refusals above kept out.
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	l, _ := startServer(t, fmt.Sprintf("server_name: \"branch\"\nlisten: \"127.0.0.1:%d\"\n", port)+site.RenderRemote(hub, *peerTLS(n.Auth.LeafTLS)))
	testenv.Eventually(t, 30*time.Second, func() bool { return l.NumLeafNodes() == 1 && n.Server.NumLeafNodes() == 1 }, "the site's leaf node connection")
}
