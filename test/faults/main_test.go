// Package faults is the fault suite: each scenario publishes events through the whole product
// (the local stack of internal/localstack: a real kube-apiserver and etcd, the controller and
// every dispatcher replica as their own processes, and nats-server as its own process with
// file storage), breaks something while they are delivered, and ends with one accounting
// check: every published event was received (the receiver de-duplicates by webhook-id) or is
// in the dead-letter stream with a reason; none is missing. Duplicates and the longest delay
// from publish to first receipt are reported.
//
// `go test ./test/faults` (part of `make test`) runs a reduced form; `make test-faults` runs
// the full form (-faults.full): more events, longer, more faults. Every scenario is bounded
// in events and time, stops by itself and listens on loopback only.
package faults

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

var full = flag.Bool("faults.full", false, "run the full fault suite (make test-faults) instead of the reduced form")

var (
	stack  *localstack.Stack
	natsd  *testenv.NATSProcess
	binDir string
	// suiteDir holds every stack's directory and the logs.
	suiteDir string
	// stackLog collects what the stacks log (through logf); its tail is printed when a test
	// fails.
	stackLog *os.File
	logf     func(format string, args ...any)
	results  = &resultTable{}
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if testing.Short() {
		fmt.Println("faults: skipped in -short mode")
		return 0
	}
	began := time.Now()
	var err error
	if binDir, err = os.MkdirTemp("", "webhook-operator-faults-bin-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(binDir)
	if err := buildBinaries(binDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "webhook-operator-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	suiteDir = dir
	keep := os.Getenv("FAULTS_KEEP") != ""
	if !keep {
		defer os.RemoveAll(dir)
	}
	if stackLog, err = os.Create(filepath.Join(dir, "stack.log")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var logMu sync.Mutex
	logf = func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintf(stackLog, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
	}
	// The pod runner's controller-runtime logs go to the stack's log too.
	ctrllog.SetLogger(funcr.New(func(prefix, args string) { logf("%s %s", prefix, args) }, funcr.Options{}))
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	stack, err = localstack.Start(ctx, localstack.Options{
		Dir:    filepath.Join(dir, "stack"),
		Binary: filepath.Join(binDir, "webhook-operator"),
		// The receivers are plain HTTP on loopback, which the operator refuses by default.
		ControllerArgs: []string{"--allow-http", "--allowed-cidrs=127.0.0.0/8"},
		Logf:           logf,
		// A killed replica is the fault; a stopped one need not wait long.
		Grace: 5 * time.Second,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the local stack: %v\n", err)
		dumpLogs(dir)
		return 1
	}
	// The stack's NATS runs inside this process; the suite wants nats-server as a process of
	// its own that can be stopped and started again. Hand its port and file storage over.
	natsd, err = takeOverNATS(stack, filepath.Join(binDir, "nats-server"), filepath.Join(dir, "stack", "logs"), logf)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting nats-server: %v\n", err)
		_ = stack.Stop()
		dumpLogs(dir)
		return 1
	}
	logf("fault suite ready in %s (full=%v)", time.Since(began).Round(time.Millisecond), *full)

	code := m.Run()

	results.print(os.Stdout, *full, time.Since(began))
	if code != 0 {
		dumpLogs(dir)
	}
	stopClusterEnv()
	if err := stack.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the local stack: %v\n", err)
	}
	natsd.Stop()
	if left, _ := localstack.Descendants(os.Getpid()); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "processes left behind: %v\n", left)
		code = 1
	}
	if keep {
		fmt.Printf("faults: logs kept in %s\n", dir)
	}
	return code
}

// buildBinaries builds webhook-operator and kubectl-webhooks (with the flags of `make build`
// that decide the build cache) and nats-server, the module's own version, into dir.
func buildBinaries(dir string) error {
	for name, pkg := range map[string]string{
		"webhook-operator": "./cmd/webhook-operator", "kubectl-webhooks": "./cmd/kubectl-webhooks", "nats-server": "github.com/nats-io/nats-server/v2",
	} {
		if err := testenv.GoBuild(filepath.Join(dir, name), pkg); err != nil {
			return err
		}
	}
	return nil
}

// dumpLogs prints the tail of the stacks' log and of every process log.
func dumpLogs(dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "stack.log"))
	more, _ := filepath.Glob(filepath.Join(dir, "*", "logs", "*.log"))
	for _, f := range append(files, more...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if len(b) > 8000 {
			b = b[len(b)-8000:]
		}
		fmt.Fprintf(os.Stderr, "\n===== %s (tail) =====\n%s\n", f, b)
	}
}
