package testenv

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS is an embedded nats-server with JetStream and file storage in a temporary directory.
// It can be stopped and started again on the same port and storage, as a real restart.
type NATS struct {
	Server   *server.Server
	Port     int
	StoreDir string
}

// StartNATS starts an embedded JetStream server on a free loopback port. storeDir may be
// empty for a fresh temporary directory.
func StartNATS(storeDir string) (*NATS, error) {
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
	n := &NATS{Port: port, StoreDir: storeDir}
	return n, n.Start()
}

// Start (re)starts the server on its port and storage.
func (n *NATS) Start() error {
	opts := &server.Options{
		Host:               "127.0.0.1",
		Port:               n.Port,
		JetStream:          true,
		StoreDir:           n.StoreDir,
		NoLog:              true,
		NoSigs:             true,
		MaxPayload:         8 * 1024 * 1024,
		JetStreamMaxMemory: 1 << 30,
		// Streams reserve their MaxBytes in this limit; every namespace's set has bounds.
		JetStreamMaxStore: 256 << 30,
	}
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

// Connect returns a connection and a JetStream context that reconnect forever.
func (n *NATS) Connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(n.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
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
