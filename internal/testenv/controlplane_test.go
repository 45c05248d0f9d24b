package testenv_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestMain doubles as the child of TestControlPlaneDiesWithItsProcess: with
// TESTENV_CONTROL_PLANE_CHILD set, it starts a control plane, says so and waits to be killed.
func TestMain(m *testing.M) {
	if os.Getenv("TESTENV_CONTROL_PLANE_CHILD") != "" {
		if _, err := testenv.StartControlPlane(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("ready")
		time.Sleep(2 * time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestControlPlaneDiesWithItsProcess: a process that started a control plane and is killed
// with SIGKILL (a test binary at its timeout, a demo under kill -9) runs no cleanup, yet its
// kube-apiserver and etcd do not outlive it.
func TestControlPlaneDiesWithItsProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "TESTENV_CONTROL_PLANE_CHILD=1")
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		s.Scan()
		line <- s.Text()
	}()
	select {
	case l := <-line:
		if l != "ready" {
			t.Fatalf("the child said %q", l)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the child did not start its control plane")
	}
	procs, err := localstack.Descendants(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		found := false
		for _, p := range procs {
			found = found || strings.Contains(p.Command, "/"+name+" ")
		}
		if !found {
			t.Fatalf("no %s below the child: %v", name, procs)
		}
	}

	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	if alive := localstack.WaitGone(procs, 30*time.Second); len(alive) > 0 {
		t.Fatalf("30s after its parent was killed, still running: %v", alive)
	}
}
