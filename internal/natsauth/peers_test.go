package natsauth_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// serverLog keeps what an embedded nats-server logged at notice level and above.
type serverLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *serverLog) add(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) < 10000 {
		l.lines = append(l.lines, fmt.Sprintf(format, v...))
	}
}
func (l *serverLog) Noticef(format string, v ...any) { l.add(format, v...) }
func (l *serverLog) Warnf(format string, v ...any)   { l.add(format, v...) }
func (l *serverLog) Fatalf(format string, v ...any)  { l.add(format, v...) }
func (l *serverLog) Errorf(format string, v ...any)  { l.add(format, v...) }
func (l *serverLog) Debugf(string, ...any)           {}
func (l *serverLog) Tracef(string, ...any)           {}

// count is how many lines hold every one of parts.
func (l *serverLog) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
next:
	for _, line := range l.lines {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		n++
	}
	return n
}

func (l *serverLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// startServer starts an embedded nats-server from configuration text, logging into a
// serverLog, and stops it when the test ends.
func startServer(t *testing.T, conf string) (*server.Server, *serverLog) {
	t.Helper()
	opts := &server.Options{}
	if err := opts.ProcessConfigString(conf); err != nil {
		t.Fatalf("the configuration: %v\n%s", err, conf)
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	log := &serverLog{}
	s.SetLoggerV2(log, false, false, false)
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("the server did not start:\n%s", log)
	}
	return s, log
}

// peerTLS is the peer certificate of files.
func peerTLS(f *testenv.TLSFiles) *natsauth.PeerTLS {
	return &natsauth.PeerTLS{CertFile: f.PeerCert, KeyFile: f.PeerKey, CAFile: f.CA}
}

// pki is the two CAs of an installation: the clients' (whose client certificate every
// dispatcher namespace holds) and the one of the connections between servers.
type pki struct{ clients, peers *testenv.TLSFiles }

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	clients, err := testenv.WriteTLS(filepath.Join(dir, "clients"))
	if err != nil {
		t.Fatal(err)
	}
	peers, err := testenv.WriteTLS(filepath.Join(dir, "peers"))
	if err != nil {
		t.Fatal(err)
	}
	return pki{clients: clients, peers: peers}
}

// installation is the configuration nats-config renders, with the clients' TLS.
func installation(t *testing.T, p pki) natsauth.ServerConfig {
	t.Helper()
	auth, err := testenv.NewNATSAuth(streams.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	c := auth.Config
	c.TLS = &natsauth.ServerTLS{CertFile: p.clients.ServerCert, KeyFile: p.clients.ServerKey, CAFile: p.clients.CA, Verify: true}
	return c
}

// render is the whole configuration of one server: its name and client port, then the
// installation's two files.
func render(t *testing.T, name string, port int, c natsauth.ServerConfig) string {
	t.Helper()
	peers, err := c.RenderPeers()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("server_name: %q\nlisten: \"127.0.0.1:%d\"\n", name, port) + c.Render() + peers
}

// A 3-node cluster with the rendered configuration forms its routes, and a server that would
// join it is refused without the route credential, or with a certificate of the clients' CA
// (the one mirrored into every dispatcher namespace) even when it has the credential. A server
// with both joins: the test would see a rogue route that got in.
func TestRoutesRefuseARogueServer(t *testing.T) {
	p := newPKI(t)
	base := installation(t, p)
	ports, err := testenv.FreePorts(8)
	if err != nil {
		t.Fatal(err)
	}
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("127.0.0.1:%d", ports[3+i]))
	}
	const password = "route-secret"
	cluster := func(listen int, tls *natsauth.PeerTLS, user, password string) *natsauth.Cluster {
		return &natsauth.Cluster{Name: "webhooks", Listen: fmt.Sprintf("127.0.0.1:%d", listen), Routes: routes,
			User: user, Password: password, TLS: tls}
	}
	var nodes []*server.Server
	var logs []*serverLog
	for i := range 3 {
		c := base
		c.Cluster = cluster(ports[3+i], peerTLS(p.peers), natsauth.DefaultRouteUser, password)
		s, l := startServer(t, render(t, fmt.Sprintf("n%d", i+1), ports[i], c))
		nodes, logs = append(nodes, s), append(logs, l)
	}
	remotes := func(s *server.Server) []string {
		rz, err := s.Routez(nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range rz.Routes {
			if !slices.Contains(names, r.RemoteName) {
				names = append(names, r.RemoteName)
			}
		}
		slices.Sort(names)
		return names
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		for i, s := range nodes {
			if n := s.NumRemotes(); n != 2 {
				return fmt.Errorf("n%d has routes to %d servers (%v), want 2", i+1, n, remotes(s))
			}
		}
		return nil
	}, "the three servers' routes")

	// rogue starts a server that routes to n1 as cluster "webhooks" with what it has, and
	// returns it once n1 has refused it twice (it retries), as n1's log says with want.
	rogue := func(name string, port, listen int, tls, trust *testenv.TLSFiles, user, password string, want ...string) {
		t.Helper()
		conf := fmt.Sprintf("server_name: %q\nlisten: \"127.0.0.1:%d\"\ncluster {\n  name: \"webhooks\"\n  listen: \"127.0.0.1:%d\"\n", name, port, listen)
		route := fmt.Sprintf("nats-route://127.0.0.1:%d", ports[3])
		if user != "" {
			route = fmt.Sprintf("nats-route://%s:%s@127.0.0.1:%d", user, password, ports[3])
		}
		conf += fmt.Sprintf("  routes: [ %q ]\n  connect_retries: 100\n", route)
		if tls != nil {
			conf += fmt.Sprintf("  tls { cert_file: %q, key_file: %q, ca_file: %q }\n", tls.PeerCert, tls.PeerKey, trust.CA)
		}
		conf += "}\n"
		before := logs[0].count(want...)
		s, l := startServer(t, conf)
		testenv.Eventually(t, 30*time.Second, func() error {
			if s.NumRemotes() > 0 {
				return testenv.Stop(fmt.Errorf("%s joined the cluster: n1 routes to %v", name, remotes(nodes[0])))
			}
			if got := logs[0].count(want...); got < before+2 {
				return fmt.Errorf("n1 logged %d refusals (%q) of %s so far; n1:\n%s\n%s:\n%s", got-before, want, name, logs[0], name, l)
			}
			return nil
		}, "n1 refusing %s", name)
		for i, n := range nodes {
			if got := remotes(n); len(got) != 2 || slices.Contains(got, name) {
				t.Errorf("n%d routes to %v: %s got in", i+1, got, name)
			}
		}
		if got := s.NumRemotes(); got != 0 {
			t.Errorf("%s has routes to %d servers", name, got)
		}
		s.Shutdown()
		s.WaitForShutdown()
	}
	// No TLS at all, with the route credential.
	rogue("rogue-plain", ports[6], ports[7], nil, nil, natsauth.DefaultRouteUser, password, "TLS route handshake error", "first record does not look like a TLS handshake")
	// A tenant's certificate (the clients' CA), the route CA's certificate trusted (it is not
	// secret), and even the route credential: refused in the TLS handshake.
	rogue("rogue-client-cert", ports[6], ports[7], p.clients, p.peers, natsauth.DefaultRouteUser, password,
		"TLS route handshake error", "certificate")
	// A certificate of the route CA (another server's, say) but not the credential.
	rogue("rogue-no-credential", ports[6], ports[7], p.peers, p.peers, "", "", "authentication error")
	rogue("rogue-wrong-credential", ports[6], ports[7], p.peers, p.peers, natsauth.DefaultRouteUser, "guessed", "authentication error")

	// With both, a fourth server joins: what the refusals above kept out.
	c := base
	c.Cluster = cluster(ports[7], peerTLS(p.peers), natsauth.DefaultRouteUser, password)
	s, _ := startServer(t, render(t, "n4", ports[6], c))
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := s.NumRemotes(); n != 3 {
			return fmt.Errorf("n4 has routes to %d servers, want 3", n)
		}
		return nil
	}, "a fourth server with the route credential and certificate joining")
}

// The rendering refuses connections between servers without their credential or a CA of
// their own.
func TestRenderPeersRefusesUnprotectedConnections(t *testing.T) {
	p := newPKI(t)
	base := installation(t, p)
	own := peerTLS(p.peers)
	clientCA := &natsauth.PeerTLS{CertFile: p.clients.PeerCert, KeyFile: p.clients.PeerKey, CAFile: p.clients.CA}
	for _, tc := range []struct {
		name string
		set  func(c *natsauth.ServerConfig)
		want string
	}{
		{"routes without TLS", func(c *natsauth.ServerConfig) {
			c.Cluster = &natsauth.Cluster{Name: "x", User: "route", Password: "p"}
		}, "routes carry every account's messages"},
		{"routes with the clients' CA", func(c *natsauth.ServerConfig) {
			c.Cluster = &natsauth.Cluster{Name: "x", User: "route", Password: "p", TLS: clientCA}
		}, "their CA is the clients' CA"},
		{"routes without a credential", func(c *natsauth.ServerConfig) {
			c.Cluster = &natsauth.Cluster{Name: "x", TLS: own}
		}, "routes need a credential"},
		{"gateways without a credential", func(c *natsauth.ServerConfig) {
			c.Gateway = &natsauth.Gateway{Name: "x", TLS: own}
		}, "gateways need a credential"},
		{"gateways with the clients' CA", func(c *natsauth.ServerConfig) {
			c.Gateway = &natsauth.Gateway{Name: "x", User: "g", Password: "p", TLS: clientCA}
		}, "their CA is the clients' CA"},
		{"a gateway named apart from its cluster", func(c *natsauth.ServerConfig) {
			c.Cluster = &natsauth.Cluster{Name: "x", User: "route", Password: "p", TLS: own}
			c.Gateway = &natsauth.Gateway{Name: "y", User: "g", Password: "p", TLS: own}
		}, "is not the cluster's"},
		{"leaf nodes without TLS", func(c *natsauth.ServerConfig) {
			c.Leafnodes = &natsauth.Leafnodes{}
		}, "leaf nodes carry every account's messages"},
		{"leaf sites without the leaf node listener", func(c *natsauth.ServerConfig) {
			c.LeafSites = []natsauth.LeafSite{{Name: "b", Namespace: "a", User: "u", Password: "p"}}
		}, "leaf sites need the leafnodes listener"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.set(&c)
			_, err := c.RenderPeers()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("RenderPeers: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// Two clusters of a supercluster connect their gateways with the rendered configuration, and
// a cluster that would join them is refused with a certificate of the clients' CA (even with
// the gateway credential) and without the credential.
func TestGatewaysRefuseARogueCluster(t *testing.T) {
	p := newPKI(t)
	base := installation(t, p)
	ports, err := testenv.FreePorts(6)
	if err != nil {
		t.Fatal(err)
	}
	const password = "gateway-secret"
	remotes := []natsauth.RemoteGateway{
		{Name: "east", URLs: []string{fmt.Sprintf("127.0.0.1:%d", ports[1])}},
		{Name: "west", URLs: []string{fmt.Sprintf("127.0.0.1:%d", ports[3])}},
	}
	var clusters []*server.Server
	var eastLog *serverLog
	for i, name := range []string{"east", "west"} {
		c := base
		c.Gateway = &natsauth.Gateway{Name: name, Listen: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]),
			User: natsauth.DefaultGatewayUser, Password: password, Remotes: remotes, TLS: peerTLS(p.peers)}
		s, l := startServer(t, render(t, name, ports[2*i], c))
		clusters = append(clusters, s)
		if name == "east" {
			eastLog = l
		}
	}
	inbound := func(s *server.Server) []string {
		gz, err := s.Gatewayz(nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for name, conns := range gz.InboundGateways {
			if len(conns) > 0 {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		return names
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, s := range clusters {
			if s.NumOutboundGateways() != 1 || len(inbound(s)) != 1 {
				return fmt.Errorf("%s: %d outbound gateways, inbound from %v", s.Name(), s.NumOutboundGateways(), inbound(s))
			}
		}
		return nil
	}, "the two clusters' gateways")

	rogue := func(name string, tls, trust *testenv.TLSFiles, user, password string, want ...string) {
		t.Helper()
		url := fmt.Sprintf("nats://127.0.0.1:%d", ports[1])
		if user != "" {
			url = fmt.Sprintf("nats://%s:%s@127.0.0.1:%d", user, password, ports[1])
		}
		conf := fmt.Sprintf("server_name: %q\nlisten: \"127.0.0.1:%d\"\ngateway {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  gateways: [ { name: \"east\", urls: [ %q ] } ]\n",
			name, ports[4], name, ports[5], url)
		if tls != nil {
			conf += fmt.Sprintf("  tls { cert_file: %q, key_file: %q, ca_file: %q }\n", tls.PeerCert, tls.PeerKey, trust.CA)
		}
		conf += "}\n"
		before := eastLog.count(want...)
		s, l := startServer(t, conf)
		testenv.Eventually(t, 30*time.Second, func() error {
			// The rogue registers its outbound gateway as soon as it sent its CONNECT (no
			// acknowledgement in the protocol); east registers an inbound one only after
			// authorizing it, so east's side is what shows a connection accepted.
			if slices.Contains(inbound(clusters[0]), name) {
				return testenv.Stop(fmt.Errorf("%s connected its gateway to east", name))
			}
			if got := eastLog.count(want...); got < before+2 {
				return fmt.Errorf("east logged %d refusals (%q) of %s so far; east:\n%s\n%s:\n%s", got-before, want, name, eastLog, name, l)
			}
			return nil
		}, "east refusing %s", name)
		s.Shutdown()
		s.WaitForShutdown()
	}
	rogue("rogue-client-cert", p.clients, p.peers, natsauth.DefaultGatewayUser, password, "TLS gateway handshake error", "certificate")
	rogue("rogue-no-credential", p.peers, p.peers, "", "", "authentication error")
}
