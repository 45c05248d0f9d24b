package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// NATS is an embedded nats-server with JetStream and file storage in a temporary directory.
// It can be stopped and started again on the same port and storage, as a real restart.
type NATS struct {
	Server   *server.Server
	Port     int
	StoreDir string
	// Auth, when set, runs the server in auth-callout mode with its configuration.
	Auth *NATSAuth
	// LeafPort, with Auth's leaf sites, is where the server takes their leaf node
	// connections.
	LeafPort int
	// MonitorPort, when set, is the server's HTTP monitoring port on loopback (/jsz, the
	// figures KEDA's nats-jetstream scaler reads).
	MonitorPort int
}

// NATSAuth is what a server in auth-callout mode needs (internal/natsauth): the keys and
// passwords, and the configuration rendered from them, which the server parses as it would
// a file.
type NATSAuth struct {
	Keys   *natsauth.Keys
	Config natsauth.ServerConfig
	// TLS, when set, makes the server require TLS and a client certificate of its CA.
	TLS *TLSFiles
	// LeafTLS is the CA and certificates of leaf node connections (a CA of their own), made
	// when the configuration has leaf sites: a site's remote presents LeafTLS.PeerCert.
	LeafTLS *TLSFiles
}

// WithTLS writes a CA and certificates into dir and makes the server require TLS with client
// certificates.
func (a *NATSAuth) WithTLS(dir string) error {
	f, err := WriteTLS(dir)
	if err != nil {
		return err
	}
	a.TLS = f
	a.Config.TLS = &natsauth.ServerTLS{CertFile: f.ServerCert, KeyFile: f.ServerKey, CAFile: f.CA, Verify: true}
	return nil
}

// ClientOptions are what a client needs to reach the server: the CA and the client
// certificate when it requires TLS, nothing otherwise.
func (a *NATSAuth) ClientOptions() []nats.Option {
	if a == nil || a.TLS == nil {
		return nil
	}
	return []nats.Option{nats.RootCAs(a.TLS.CA), nats.ClientCert(a.TLS.ClientCert, a.TLS.ClientKey)}
}

// NewNATSAuth makes new keys and the configuration of names' subject prefixes.
func NewNATSAuth(names streams.Names) (*NATSAuth, error) {
	k, err := natsauth.GenerateKeys()
	if err != nil {
		return nil, err
	}
	return &NATSAuth{Keys: k, Config: natsauth.ServerConfig{
		AdminUser: natsauth.DefaultAdminUser, AdminPassword: k.AdminPassword,
		CalloutUser: natsauth.DefaultCalloutUser, CalloutPassword: k.CalloutPassword,
		Issuer: k.Issuer, XKey: k.XKey,
		EventsSubjectPrefix: names.EventsSubjectPrefix, InternalSubjectPrefix: names.InternalPrefix,
	}}, nil
}

// StartNATS starts an embedded JetStream server on a free loopback port. storeDir may be
// empty for a fresh temporary directory.
func StartNATS(storeDir string) (*NATS, error) { return StartNATSWith(storeDir, nil) }

// StartNATSWith is StartNATS in auth-callout mode when auth is set.
func StartNATSWith(storeDir string, auth *NATSAuth) (*NATS, error) {
	if storeDir == "" {
		d, err := os.MkdirTemp("", "webhook-operator-nats-")
		if err != nil {
			return nil, err
		}
		storeDir = d
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	n := &NATS{Port: port, StoreDir: storeDir, Auth: auth}
	if auth != nil && len(auth.Config.LeafSites) > 0 && auth.Config.Leafnodes == nil {
		if n.LeafPort, err = FreePort(); err != nil {
			return nil, err
		}
		if auth.LeafTLS, err = WriteTLS(filepath.Join(storeDir, "leaf-tls")); err != nil {
			return nil, err
		}
		auth.Config.Leafnodes = &natsauth.Leafnodes{Listen: fmt.Sprintf("127.0.0.1:%d", n.LeafPort),
			TLS: &natsauth.PeerTLS{CertFile: auth.LeafTLS.PeerCert, KeyFile: auth.LeafTLS.PeerKey, CAFile: auth.LeafTLS.CA}}
	}
	return n, n.Start()
}

// Start (re)starts the server on its port and storage.
func (n *NATS) Start() error {
	opts := &server.Options{}
	if n.Auth != nil {
		peers, err := n.Auth.Config.RenderPeers()
		if err != nil {
			return err
		}
		conf := n.Auth.Config.Render() + peers
		if err := opts.ProcessConfigString(conf); err != nil {
			return fmt.Errorf("the auth-callout configuration: %w", err)
		}
	}
	opts.Host, opts.Port = "127.0.0.1", n.Port
	opts.JetStream, opts.StoreDir = true, n.StoreDir
	opts.NoLog, opts.NoSigs = true, true
	if n.MonitorPort != 0 {
		opts.HTTPHost, opts.HTTPPort = "127.0.0.1", n.MonitorPort
	}
	opts.MaxPayload = 8 * 1024 * 1024
	// Streams reserve their MaxBytes in this limit; every namespace's set has bounds.
	opts.JetStreamMaxMemory, opts.JetStreamMaxStore = 1<<30, 256<<30
	if os.Getenv("NATS_TRACE") != "" {
		opts.NoLog, opts.Trace, opts.Debug = false, os.Getenv("NATS_TRACE") == "trace", true
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	if os.Getenv("NATS_TRACE") != "" {
		s.ConfigureLogger()
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return fmt.Errorf("nats-server did not become ready on port %d", n.Port)
	}
	n.Server = s
	return nil
}

// Stop shuts the server down and waits until it is gone.
func (n *NATS) Stop() {
	if n.Server != nil {
		n.Server.Shutdown()
		n.Server.WaitForShutdown()
		n.Server = nil
	}
}

// Cleanup stops the server and removes its storage.
func (n *NATS) Cleanup() {
	n.Stop()
	_ = os.RemoveAll(n.StoreDir)
}

// URL is the client URL of the server.
func (n *NATS) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.Port) }

// Connect returns a connection and a JetStream context that reconnect forever: the admin's
// (the controller's) in auth-callout mode.
func (n *NATS) Connect(extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}
	if n.Auth != nil {
		opts = append(opts, nats.UserInfo(n.Auth.Config.AdminUser, n.Auth.Config.AdminPassword))
		opts = append(opts, n.Auth.ClientOptions()...)
	}
	nc, err := nats.Connect(n.URL(), append(opts, extra...)...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// ConnectCallout connects as the callout service's user (auth-callout mode only).
func (n *NATS) ConnectCallout(extra ...nats.Option) (*nats.Conn, error) {
	if n.Auth == nil {
		return nil, fmt.Errorf("the server is not in auth-callout mode")
	}
	opts := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.UserInfo(n.Auth.Config.CalloutUser, n.Auth.Config.CalloutPassword)}, n.Auth.ClientOptions()...)
	return nats.Connect(n.URL(), append(opts, extra...)...)
}

// NewNATS starts an embedded server for one test and removes it when the test ends.
func NewNATS(t testing.TB) *NATS {
	t.Helper()
	n, err := StartNATS(t.TempDir())
	if err != nil {
		t.Fatalf("starting nats-server: %v", err)
	}
	t.Cleanup(n.Stop)
	return n
}

// NewMonitoredNATS is NewNATS with the HTTP monitoring port open (MonitoringEndpoint).
func NewMonitoredNATS(t testing.TB) *NATS {
	t.Helper()
	ports, err := FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	n := &NATS{Port: ports[0], MonitorPort: ports[1], StoreDir: t.TempDir()}
	if err := n.Start(); err != nil {
		t.Fatalf("starting nats-server: %v", err)
	}
	t.Cleanup(n.Stop)
	return n
}

// MonitoringEndpoint is host:port of the server's HTTP monitoring port (MonitorPort).
func (n *NATS) MonitoringEndpoint() string { return fmt.Sprintf("127.0.0.1:%d", n.MonitorPort) }

// FreePort asks the kernel for a free loopback port.
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts asks the kernel for n distinct free loopback ports (it holds each until it has
// them all, so none is handed out twice).
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// NewJetStream starts an embedded server for one test and returns a JetStream context on it;
// both end with the test.
func NewJetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	nc, js, err := NewNATS(t).Connect()
	if err != nil {
		t.Fatalf("connecting to nats-server: %v", err)
	}
	t.Cleanup(nc.Close)
	return js
}
