// Package e2e drives the product as a user would: it starts the local stack
// (internal/localstack) once and runs the built kubectl and kubectl-webhooks binaries against
// it. Each test works in its own namespace.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

var (
	stack  *localstack.Stack
	binDir string
	// stackLog collects what the stack logs; printed when a test fails.
	stackLog *os.File
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	var err error
	if binDir, err = os.MkdirTemp("", "webhook-operator-e2e-bin-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(binDir)
	if err := buildBinaries(binDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dir, err := os.MkdirTemp("", "webhook-operator-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if stackLog, err = os.Create(filepath.Join(dir, "stack.log")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(stackLog, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	stack, err = localstack.Start(ctx, localstack.Options{
		Dir:    filepath.Join(dir, "stack"),
		Binary: filepath.Join(binDir, "webhook-operator"),
		// The test receivers are plain HTTP on loopback, which the operator refuses by default.
		// Payload retention is swept every second (its tests use retentions of seconds).
		ControllerArgs: []string{"--allow-http", "--allowed-cidrs=127.0.0.0/8", "--payload-retention-interval=1s"},
		Logf:           logf,
		// The HTTP ingress, as the chart's ingress.enabled runs it (ingress_test.go).
		Ingress: true,
		// The data API, as the chart's apiserver.enabled runs it: kubectl webhooks reads
		// deliveries and dead letters, and purges, through it.
		APIServer: true,
		// The web console, as the chart's console.enabled and `make demo` run it
		// (console_test.go drives it in a browser).
		Console: true,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the local stack: %v\n", err)
		dumpLogs(os.Stderr, dir)
		return 1
	}
	code := m.Run()
	if code != 0 {
		dumpLogs(os.Stderr, dir)
	}
	if err := stack.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the local stack: %v\n", err)
	}
	if left, _ := localstack.Descendants(os.Getpid()); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "processes left behind by the local stack: %v\n", left)
		code = 1
	}
	return code
}

// buildBinaries builds webhook-operator and kubectl-webhooks into dir with the flags of
// `make build` that decide the build cache (CGO off, trimmed paths), so both share it.
func buildBinaries(dir string) error {
	for _, pkg := range []string{"webhook-operator", "kubectl-webhooks"} {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, pkg), "./cmd/"+pkg)
		cmd.Dir = testenv.Root()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %v\n%s", pkg, err, out)
		}
	}
	return nil
}

// dumpLogs prints the tail of the stack's log and of every process log.
func dumpLogs(w *os.File, dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "stack.log"))
	more, _ := filepath.Glob(filepath.Join(dir, "stack", "logs", "*.log"))
	for _, f := range append(files, more...) {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if len(b) > 12000 {
			b = b[len(b)-12000:]
		}
		fmt.Fprintf(w, "\n===== %s (tail) =====\n%s\n", f, b)
	}
}

// user runs kubectl and the plugin in one namespace, as a user with the stack's kubeconfig.
type user struct {
	t  *testing.T
	ns string
}

// newUser creates the namespace ns with kubectl.
func newUser(t *testing.T, ns string) *user {
	t.Helper()
	u := &user{t: t, ns: ns}
	u.must(nil, "kubectl", "create", "namespace", ns)
	return u
}

// result is a finished command.
type result struct {
	stdout, stderr string
	code           int
}

// run runs kubectl (`kubectl webhooks ...` finds the plugin on PATH) in the user's namespace.
func (u *user) run(stdin []byte, name string, args ...string) result {
	u.t.Helper()
	path := name
	if name == "kubectl" {
		path = testenv.Kubectl()
	}
	args = append(args, "-n", u.ns)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k != "KUBECONFIG" && k != "PATH" && !strings.HasPrefix(k, "NATS_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "KUBECONFIG="+stack.Kubeconfig,
		"PATH="+binDir+string(os.PathListSeparator)+testenv.Assets()+string(os.PathListSeparator)+os.Getenv("PATH"))
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	return runCommand(cmd)
}

// runCommand runs cmd and returns its output and exit code (-1 when it could not run).
func runCommand(cmd *exec.Cmd) result {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if err != nil {
		r.code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		}
	}
	return r
}

// must runs a command that has to succeed and returns its standard output.
func (u *user) must(stdin []byte, name string, args ...string) string {
	u.t.Helper()
	r := u.run(stdin, name, args...)
	if r.code != 0 {
		u.t.Fatalf("%s %s: exit %d\n%s%s", name, strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// json runs a command with -o json and decodes its output into v.
func (u *user) json(v any, name string, args ...string) {
	u.t.Helper()
	out := u.must(nil, name, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		u.t.Fatalf("%s %s -o json: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// apply applies YAML with kubectl.
func (u *user) apply(yaml string) {
	u.t.Helper()
	u.must([]byte(yaml), "kubectl", "apply", "-f", "-")
}

// waitReady waits with kubectl until the endpoints are Ready.
func (u *user) waitReady(endpoints ...string) {
	u.t.Helper()
	args := []string{"wait", "--for=condition=Ready", "--timeout=120s"}
	for _, e := range endpoints {
		args = append(args, "whe/"+e)
	}
	if r := u.run(nil, "kubectl", args...); r.code != 0 {
		// What the endpoints say about why they are not Ready.
		status := u.run(nil, "kubectl", append([]string{"get", "-o", "yaml"}, args[3:]...)...)
		u.t.Fatalf("kubectl %s: exit %d\n%s%s\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr, status.stdout)
	}
}

// receiver starts a receiver that verifies signatures with the generated signing Secret of
// endpoint in the user's namespace; it stops when the test ends.
func (u *user) receiver(endpoint string) *testenv.Receiver {
	u.t.Helper()
	rcv, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: testenv.SecretKey(stack.Client, u.ns, endpoint+"-signing", "secret")})
	if err != nil {
		u.t.Fatal(err)
	}
	u.t.Cleanup(func() { _ = rcv.Close() })
	return rcv
}

// publish publishes an event with the plugin.
func (u *user) publish(typ, id, data string) {
	u.t.Helper()
	u.must(nil, "kubectl", "webhooks", "publish", typ, "--id", id, "--data", data)
}

// receive waits until r has accepted every one of ids.
func receive(t *testing.T, r *testenv.Receiver, ids ...string) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() error {
		var missing []string
		for _, id := range ids {
			if r.Count(id) == 0 {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("the receiver has not got %v (stats %+v)", missing, r.Stats())
		}
		return nil
	}, "")
}

// Plugin JSON shapes the tests read.
type (
	page[T any] struct {
		Data       []T    `json:"data"`
		HasMore    bool   `json:"hasMore"`
		NextCursor string `json:"nextCursor"`
	}
	logEntry struct {
		ID           string `json:"id"`
		Status       string `json:"status"`
		EventID      string `json:"eventId"`
		Attempts     int    `json:"attempts"`
		ReplayOfID   string `json:"replayOfId"`
		DeadLetterRs string `json:"deadLetterReason"`
		Test         bool   `json:"test"`
	}
	deadLetter struct {
		DeliveryID string `json:"deliveryId"`
		EventID    string `json:"eventId"`
		Reason     string `json:"reason"`
		Attempts   []struct {
			StatusCode int `json:"statusCode"`
		} `json:"attempts"`
		LastResponse *struct {
			StatusCode int    `json:"statusCode"`
			Body       string `json:"body"`
		} `json:"lastResponse"`
		Payload json.RawMessage `json:"payload"`
	}
	endpointStatus struct {
		Name         string `json:"name"`
		State        string `json:"state"`
		Delivered    int64  `json:"delivered"`
		DeadLettered int64  `json:"deadLettered"`
		Pending      int64  `json:"pending"`
	}
	replayReport struct {
		Replay     string `json:"replay"`
		Created    bool   `json:"created"`
		Deliveries []struct {
			Original   string `json:"original"`
			DeliveryID string `json:"deliveryId"`
		} `json:"deliveries"`
		Complete bool  `json:"complete"`
		Selected int64 `json:"selected"`
		Replayed int64 `json:"replayed"`
		Skipped  int64 `json:"skipped"`
		Failed   int64 `json:"failed"`
	}
)
