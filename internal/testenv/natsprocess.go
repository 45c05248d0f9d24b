package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSProcess is nats-server run as a process of its own (a binary built from the module's
// nats-server version, see GoBuild), with JetStream file storage, on a fixed port: stopping
// and starting it again is a real server restart that every client has to live through. The
// fault suite runs one alone and three as a cluster (StartNATSCluster); the bench reads each
// one's memory, CPU and files.
type NATSProcess struct {
	// Name is the server's name (a cluster node's server_name; "nats-server" alone).
	Name string
	// Binary runs with `-c Config`; its output goes to LogPath.
	Binary, Config, LogPath string
	// Port is the client port; MonitorPort, when not 0, the HTTP monitoring port.
	Port, MonitorPort int
	// StoreDir is the JetStream storage directory the configuration names.
	StoreDir string
	// Logf logs what happens to the process.
	Logf func(string, ...any)
	// Admin logs in to see that JetStream answers.
	Admin []nats.Option
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL (default 15s).
	StopGrace time.Duration

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts nats-server and waits until JetStream answers.
func (n *NATSProcess) Start() error {
	if err := n.Launch(); err != nil {
		return err
	}
	if err := n.WaitReady(30 * time.Second); err != nil {
		n.Stop()
		return err
	}
	return nil
}

// URL is the server's client URL.
func (n *NATSProcess) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.Port) }

// PID is the running process's id, 0 when it is not running.
func (n *NATSProcess) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

func (n *NATSProcess) logf(format string, args ...any) {
	if n.Logf != nil {
		n.Logf(format, args...)
	}
}

// Launch starts the nats-server process without waiting for it.
func (n *NATSProcess) Launch() error {
	out, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(n.Binary, "-c", n.Config)
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
	n.logf("%s started: process %d on port %d", n.Name, cmd.Process.Pid, n.Port)
	return nil
}

// WaitReady waits until JetStream answers at this server (in a cluster: once the server has
// joined it and the cluster has a meta leader).
func (n *NATSProcess) WaitReady(timeout time.Duration) error {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	err := Poll(timeout, func() error {
		select {
		case <-done:
			return Stop(fmt.Errorf("%s exited: see %s", n.Name, n.LogPath))
		default:
		}
		nc, err := nats.Connect(n.URL(), append([]nats.Option{nats.Timeout(time.Second)}, n.Admin...)...)
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
		return fmt.Errorf("%s did not become ready: %w", n.Name, err)
	}
	return nil
}

// Stop stops nats-server (SIGTERM: a clean shutdown that flushes its storage; SIGKILL after
// StopGrace) and waits until it is gone. It returns how long the process took to exit and
// whether it exited by itself (false: it was killed, or was not running).
func (n *NATSProcess) Stop() (time.Duration, bool) { return n.signal(syscall.SIGTERM) }

// Kill kills nats-server with SIGKILL, a crash: what it acknowledged is in the files (a
// single-replica stream writes every message through to the file before acknowledging it),
// what it had not yet written of its consumers' state is not.
func (n *NATSProcess) Kill() { n.signal(syscall.SIGKILL) }

func (n *NATSProcess) signal(sig syscall.Signal) (time.Duration, bool) {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return 0, false
	}
	grace := n.StopGrace
	if grace <= 0 {
		grace = 15 * time.Second
	}
	began := time.Now()
	_ = cmd.Process.Signal(sig)
	graceful := true
	select {
	case <-done:
	case <-time.After(grace):
		graceful = false
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	took := time.Since(began)
	n.logf("%s process %d stopped (%s) in %s", n.Name, cmd.Process.Pid, sig, took.Round(time.Millisecond))
	return took, graceful && sig == syscall.SIGTERM
}
