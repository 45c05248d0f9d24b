package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// natsProcess is nats-server run as a process of its own, with JetStream file storage, on a
// fixed port: stopping and starting it again is a real server restart that every client (the
// controller, the dispatchers, the plugin and the producers) has to live through.
type natsProcess struct {
	// name is the server's name (a cluster node's server_name; "nats-server" alone).
	name                    string
	binary, config, logPath string
	port                    int
	logf                    func(string, ...any)
	// admin logs in to see that JetStream answers.
	admin []nats.Option

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// takeOverNATS stops the stack's embedded server and starts nats-server on the same port and
// file storage, so that every URL the stack handed out keeps working.
func takeOverNATS(s *localstack.Stack, binary, logDir string, logf func(string, ...any)) (*natsProcess, error) {
	port, store := s.NATS.Port, s.NATS.StoreDir
	conf := filepath.Join(filepath.Dir(store), "nats-server.conf")
	// The limits of the embedded server (internal/testenv).
	text := fmt.Sprintf(`listen: "127.0.0.1:%d"
max_payload: 8MB
jetstream {
  store_dir: %q
  max_memory_store: 1GB
  max_file_store: 8GB
}
`, port, store)
	// The stack's auth-callout configuration, as an installation's nats-server has it.
	text += s.Auth.Config.Render()
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return nil, err
	}
	n := &natsProcess{name: "nats-server", binary: binary, config: conf, logPath: filepath.Join(logDir, "nats-server.log"), port: port, logf: logf,
		admin: adminOptions(s.Auth)}
	s.NATS.Stop()
	logf("embedded NATS stopped; nats-server takes over port %d and storage %s", port, store)
	return n, n.start()
}

// adminOptions log in as the JetStream account's admin of auth (over TLS when it has it).
func adminOptions(auth *testenv.NATSAuth) []nats.Option {
	return append([]nats.Option{nats.UserInfo(auth.Config.AdminUser, auth.Config.AdminPassword)}, auth.ClientOptions()...)
}

// start starts nats-server and waits until JetStream answers.
func (n *natsProcess) start() error {
	if err := n.launch(); err != nil {
		return err
	}
	if err := n.waitReady(30 * time.Second); err != nil {
		n.stop()
		return err
	}
	return nil
}

// url is the server's client URL.
func (n *natsProcess) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// launch starts the nats-server process.
func (n *natsProcess) launch() error {
	out, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(n.binary, "-c", n.config)
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, killed with this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.mu.Lock()
	n.cmd, n.done = cmd, done
	n.mu.Unlock()
	n.logf("%s started: process %d on port %d", n.name, cmd.Process.Pid, n.port)
	return nil
}

// waitReady waits until JetStream answers at this server (in a cluster: once the server has
// joined it and the cluster has a meta leader).
func (n *natsProcess) waitReady(timeout time.Duration) error {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	err := testenv.Poll(timeout, func() error {
		select {
		case <-done:
			return testenv.Stop(fmt.Errorf("%s exited: see %s", n.name, n.logPath))
		default:
		}
		nc, err := nats.Connect(n.url(), append([]nats.Option{nats.Timeout(time.Second)}, n.admin...)...)
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("%s did not become ready: %w", n.name, err)
	}
	return nil
}

// stop stops nats-server (SIGTERM: a clean shutdown that flushes its storage; SIGKILL after
// 15 seconds) and waits until it is gone.
func (n *natsProcess) stop() { n.signal(syscall.SIGTERM) }

// kill kills nats-server with SIGKILL, a crash: what it acknowledged is in the files (a
// single-replica stream writes every message through to the file before acknowledging it),
// what it had not yet written of its consumers' state is not.
func (n *natsProcess) kill() { n.signal(syscall.SIGKILL) }

func (n *natsProcess) signal(sig syscall.Signal) {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	n.logf("%s process %d stopped (%s)", n.name, cmd.Process.Pid, sig)
}
