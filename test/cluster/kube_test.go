package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// result is a finished command.
type result struct {
	stdout, stderr string
	err            error
}

// command runs name (kubectl, helm, make, ...) with the cluster's kubeconfig and the
// checkout's tools first on PATH, as a user's shell would after `make cluster`.
func command(stdin string, name string, args ...string) result {
	cmd := exec.Command(lookPath(name), args...)
	cmd.Dir = world.root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+world.kubeconfig, "PATH="+world.path)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return result{out.String(), errb.String(), err}
}

// lookPath finds name on the test's PATH (exec.Command would look on the process's).
func lookPath(name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	for _, d := range filepath.SplitList(world.path) {
		if fi, err := os.Stat(filepath.Join(d, name)); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return filepath.Join(d, name)
		}
	}
	return name
}

// sh runs a command and fails the test when it fails.
func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	r := command("", name, args...)
	if r.err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), r.err, r.stdout, r.stderr)
	}
	return r.stdout
}

// kubectl runs the host's kubectl.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	return sh(t, "kubectl", args...)
}

// apply applies manifests.
func apply(t *testing.T, yaml string) {
	t.Helper()
	r := command(yaml, "kubectl", "apply", "-f", "-")
	if r.err != nil {
		t.Fatalf("kubectl apply: %v\n%s%s\n%s", r.err, r.stdout, r.stderr, yaml)
	}
}

// kubectlJSON decodes `kubectl get -o json` (or any command printing JSON) into v.
func kubectlJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := kubectl(t, args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// eventually polls cond for up to timeout, failing the test with the last error.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	testenv.Eventually(t, timeout, cond, "%s", what)
}

// rawGet GETs a path of the API server, e.g. a Service's port through the service proxy.
func rawGet(path string) ([]byte, error) {
	r := command("", "kubectl", "get", "--raw", path)
	if r.err != nil {
		return nil, fmt.Errorf("GET %s: %v: %s", path, r.err, r.stderr)
	}
	return []byte(r.stdout), nil
}

// clusterExec runs a command inside the node's namespaces (where the kubelet's volumes are
// mounted).
func clusterExec(t *testing.T, args ...string) string {
	t.Helper()
	return sh(t, filepath.Join(world.root, "hack", "cluster", "cluster.sh"), append([]string{"exec"}, args...)...)
}

// loadImage imports an image tarball into the node's containerd.
func loadImage(t *testing.T, tarball string) {
	t.Helper()
	sh(t, filepath.Join(world.root, "hack", "cluster", "cluster.sh"), "load", tarball)
}

// logf logs with a wall-clock time, so a slow step shows in the output.
func logf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("%s "+format, append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// rollout waits for a workload's rollout and, when it does not finish, fails with what the
// kubelet and the containers said: the pods' describe (events, last state) and their logs,
// the previous container's too (a crash loop's reason is in the one that died).
func rollout(t *testing.T, ns, workload, selector, timeout string) {
	t.Helper()
	r := command("", "kubectl", "-n", ns, "rollout", "status", workload, "--timeout="+timeout)
	if r.err == nil {
		return
	}
	describe := command("", "kubectl", "-n", ns, "describe", "pods", "-l", selector)
	logs := command("", "kubectl", "-n", ns, "logs", "-l", selector, "--all-containers", "--tail=60")
	previous := command("", "kubectl", "-n", ns, "logs", "-l", selector, "--all-containers", "--previous", "--tail=60")
	t.Fatalf("kubectl rollout status %s: %v\n%s%s\n--- describe:\n%s%s\n--- logs:\n%s%s\n--- previous logs:\n%s%s",
		workload, r.err, r.stdout, r.stderr, describe.stdout, describe.stderr, logs.stdout, logs.stderr, previous.stdout, previous.stderr)
}
