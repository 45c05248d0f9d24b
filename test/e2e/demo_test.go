package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// syncBuffer collects a process's output while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDemo builds and starts `make demo`'s program with its own directory and the e2e
// binaries, in its own process group as a terminal would run it.
func startDemo(t *testing.T, env ...string) (*exec.Cmd, *syncBuffer, chan error) {
	t.Helper()
	demo := filepath.Join(binDir, "webhook-operator-demo")
	build := exec.Command("go", "build", "-o", demo, "./cmd/webhook-operator-demo")
	build.Dir = testenv.Root()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the demo: %v\n%s", err, out)
	}
	cmd := exec.Command(demo)
	cmd.Env = append(os.Environ(), append([]string{
		"DEMO_DIR=" + t.TempDir(), "DEMO_BIN=" + binDir, "KUBEBUILDER_ASSETS=" + testenv.Assets(),
	}, env...)...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if t.Failed() {
			t.Logf("demo output:\n%s", out.String())
		}
	})
	return cmd, out, done
}

// waitOutput waits until the demo has printed s.
func waitOutput(t *testing.T, out *syncBuffer, done chan error, s string, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, func() error {
		if strings.Contains(out.String(), s) {
			return nil
		}
		select {
		case err := <-done:
			done <- err
			return testenv.Stop(fmt.Errorf("the demo ended (%v) before printing it", err))
		default:
			return errors.New("not printed yet")
		}
	}, "the demo to print %q", s)
}

// processesOf lists the demo's processes while it runs.
func processesOf(t *testing.T, pid int) []localstack.Process {
	t.Helper()
	procs, err := localstack.Descendants(pid)
	if err != nil {
		t.Fatal(err)
	}
	return procs
}

func checkGone(t *testing.T, procs []localstack.Process) {
	t.Helper()
	for _, p := range procs {
		if p.Alive() {
			t.Errorf("the demo left process %s behind", p)
		}
	}
}

// TestDemoBounded is `DEMO_DURATION=... make demo`, the smoke test CI runs: it must reach
// delivered for the healthy endpoint and a dead letter for the failing one, print what a user
// wants to see, exit 0 and leave no process behind.
func TestDemoBounded(t *testing.T) {
	began := time.Now()
	cmd, out, done := startDemo(t, "DEMO_DURATION=180s")
	waitOutput(t, out, done, "What a user sees", 3*time.Minute)
	procs := processesOf(t, cmd.Process.Pid)
	if len(procs) < 3 {
		t.Errorf("expected the control plane, the controller and a dispatcher below the demo, found %v", procs)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the bounded demo did not end")
	}
	if err != nil {
		t.Fatalf("the bounded demo failed: %v", err)
	}
	text := out.String()
	for _, want := range []string{
		"kubectl get whe,rp", "kubectl describe whe orders", "kubectl describe whe crm",
		"kubectl webhooks log orders", "succeeded", "kubectl webhooks dlq list crm", "kubectl webhooks dlq show whdl_",
		"dead_letter", "PASSED", "no process left behind",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	checkGone(t, procs)
	t.Logf("the bounded demo took %s", time.Since(began).Round(time.Second))
}

// TestDemoCtrlC: the interactive demo keeps the stack up and tells how to use it; Ctrl-C
// (SIGINT to its process group, as a terminal sends it) stops everything.
func TestDemoCtrlC(t *testing.T) {
	cmd, out, done := startDemo(t)
	waitOutput(t, out, done, "Ctrl-C stops everything", 3*time.Minute)
	text := out.String()
	for _, want := range []string{"export KUBECONFIG=", "NATS JetStream: nats://127.0.0.1:", "kubectl webhooks publish",
		"controller http://127.0.0.1:", "dispatcher http://127.0.0.1:"} {
		if !strings.Contains(text, want) {
			t.Errorf("the usage lacks %q", want)
		}
	}
	procs := processesOf(t, cmd.Process.Pid)
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("after Ctrl-C the demo exited with %v, want 0", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the demo did not stop within a minute of Ctrl-C")
	}
	if !strings.Contains(out.String(), "no process left behind") {
		t.Errorf("the demo did not report a clean stop:\n%s", tail(out.String(), 2000))
	}
	checkGone(t, procs)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return fmt.Sprint(s)
}

// TestDemoKilled: a demo killed with SIGKILL runs no cleanup, yet leaves nothing running:
// the kernel ends its children, the control plane's kube-apiserver and etcd included.
func TestDemoKilled(t *testing.T) {
	cmd, out, done := startDemo(t)
	waitOutput(t, out, done, "Ctrl-C stops everything", 3*time.Minute)
	procs := processesOf(t, cmd.Process.Pid)
	for _, name := range []string{"kube-apiserver", "etcd", "webhook-operator controller", "webhook-operator dispatcher"} {
		found := false
		for _, p := range procs {
			found = found || strings.Contains(p.Command, name)
		}
		if !found {
			t.Errorf("no %s below the demo: %v", name, procs)
		}
	}
	if err := cmd.Process.Kill(); err != nil { // the demo alone, not its process group
		t.Fatal(err)
	}
	<-done
	if alive := localstack.WaitGone(procs, 30*time.Second); len(alive) > 0 {
		t.Fatalf("30s after the demo was killed, still running: %v", alive)
	}
}
