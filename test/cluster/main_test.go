// Package cluster runs the product on a real single-node Kubernetes (hack/cluster/cluster.sh:
// kubelet, containerd, kube-proxy, CoreDNS) from images packed here: `helm install` of the
// chart next to a 3-node NATS JetStream StatefulSet, the user's walk-through with the host's
// kubectl and `kubectl webhooks`, faults done the way a cluster does them, and what only a
// kubelet proves. It needs Linux and root and runs only with -cluster (make test-cluster);
// docs/real-cluster.md says what it checks and costs.
package cluster

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

var (
	enabled        = flag.Bool("cluster", false, "run on a real single-node cluster it starts and removes (Linux, root): make test-cluster")
	withPrometheus = flag.Bool("cluster.prometheus", true, "run Prometheus with the chart's rules and wait for WebhookEndpointDisabled to fire and resolve")
	// Not yet part of make test-cluster (see docs/real-cluster.md): the renewal check waits
	// out a 600s token (about 8 minutes more).
	withRenewal = flag.Bool("cluster.token-renewal", false, "also follow a dispatcher's projected token across the kubelet's renewal and expiry (about 10 minutes more)")
	reuse       = flag.Bool("cluster.reuse", false, "use the cluster `make cluster` runs, and leave it running (for developing these tests)")
)

// env is the test's world: the checkout, the cluster's kubeconfig, the tools.
type env struct {
	root, dir  string
	kubeconfig string
	path       string
}

var world env

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	flag.Parse()
	if !*enabled {
		return m.Run() // every test skips: the real cluster needs root and -cluster
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "test/cluster: -cluster needs root (it starts a kubelet and containerd)")
		return 1
	}
	root := testenv.Root()
	dir, err := os.MkdirTemp("", "webhook-operator-cluster-test-")
	if *reuse {
		// Developing: one directory, so a second run finds the first one's installation.
		dir = filepath.Join(os.TempDir(), "webhook-operator-cluster-dev")
		err = os.MkdirAll(dir, 0o700)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	script := filepath.Join(root, "hack", "cluster", "cluster.sh")
	before := hostState()
	started := false
	down := func() {
		if !started {
			return
		}
		cmd := exec.Command(script, "down")
		cmd.Env = append(os.Environ(), "CLUSTER_KEEP_LOGS="+filepath.Join(dir, "cluster-logs"))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "test/cluster: cluster down:", err)
		}
		started = false
	}
	// Interrupted (Ctrl-C, CI's kill): tear the node down before exiting.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "test/cluster: %s: tearing the cluster down\n", s)
		down()
		os.Exit(130)
	}()

	if *reuse && exec.Command(script, "status").Run() == nil {
		fmt.Fprintln(os.Stderr, "test/cluster: using the running cluster")
	} else {
		*reuse = false
		started = true
		cmd := exec.Command(script, "up")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "test/cluster: cluster up:", err)
			down()
			return 1
		}
	}
	out, err := exec.Command(script, "env").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		down()
		return 1
	}
	world = env{
		root: root, dir: dir,
		kubeconfig: strings.TrimPrefix(strings.TrimSpace(string(out)), "export KUBECONFIG="),
		path:       strings.Join([]string{filepath.Join(dir, "bin"), filepath.Join(root, "bin"), filepath.Join(root, "bin", "k8s"), os.Getenv("PATH")}, string(os.PathListSeparator)),
	}
	code := m.Run()
	if started {
		down()
		// Nothing of the node may remain on the host.
		if after := hostState(); after != before {
			fmt.Fprintf(os.Stderr, "test/cluster: the host changed:\nbefore:\n%s\nafter:\n%s\n", before, after)
			code = 1
		} else {
			fmt.Fprintln(os.Stderr, "test/cluster: the host is as before: no kubepods cgroup, mount, interface, nftables rule or process of the node remains")
		}
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "test/cluster: logs of the node's components in %s\n", filepath.Join(dir, "cluster-logs"))
	} else if !*reuse {
		_ = os.RemoveAll(dir)
	}
	return code
}

// hostState is what the node could leave on the host: cgroups named kubepods, mounts of its
// directory, network interfaces, nftables rules, processes of its binaries, /var/lib/cni.
func hostState() string {
	var b strings.Builder
	for _, g := range []string{"/sys/fs/cgroup/*/kubepods", "/sys/fs/cgroup/kubepods", "/var/lib/cni", "/var/tmp/webhook-operator-cluster"} {
		m, _ := filepath.Glob(g)
		fmt.Fprintf(&b, "%s: %v\n", g, m)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mounts), "\n") {
		if strings.Contains(l, "webhook-operator-cluster") || strings.Contains(l, "kubelet") || strings.Contains(l, "containerd") {
			fmt.Fprintf(&b, "mount: %s\n", l)
		}
	}
	links, _ := exec.Command("ip", "-o", "link", "show").Output()
	for _, l := range strings.Split(string(links), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			fmt.Fprintf(&b, "link %s\n", f[1])
		}
	}
	rules, _ := exec.Command("nft", "list", "ruleset").Output()
	fmt.Fprintf(&b, "nftables: %d bytes\n", len(rules))
	// The node's processes: in a kubepods cgroup, or running with its directory (other
	// engineers' etcd or nats-server on this machine are none of its business).
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cg, _ := os.ReadFile(filepath.Join(p, "cgroup"))
		cmd, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		if strings.Contains(string(cg), "kubepods") || strings.Contains(string(cmd), "webhook-operator-cluster\x00") ||
			strings.Contains(string(cmd), "/var/tmp/webhook-operator-cluster/") {
			fmt.Fprintf(&b, "process %s %q\n", p, strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return b.String()
}

// need skips a test without -cluster: it runs on a real node only.
func need(t *testing.T) {
	t.Helper()
	if !*enabled {
		t.Skip("needs a real node: make test-cluster (Linux, root)")
	}
}
