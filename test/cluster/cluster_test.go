package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCluster is one installation's life on a real node, in order: install (of an earlier
// version, -cluster.upgrade-from) and helm upgrade while events flow, the user's walk-through, the console in a browser, what only a kubelet proves, a tenant's rogue NATS
// route refused, faults, monitoring and autoscaling, uninstall.
func TestCluster(t *testing.T) {
	need(t)
	var s *install
	if *reuse && os.Getenv("CLUSTER_REINSTALL") == "" && command("", "helm", "status", release, "-n", operatorNS).err == nil {
		s = installed(t) // developing: the last run's installation
	} else {
		if *reuse {
			reset(t)
		}
		s = setUp(t)
	}
	for _, step := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"upgrade", s.upgrade},
		{"helm test", s.helmTest},
		{"walkthrough", s.walkthrough},
		{"console", s.console},
		{"kubelet", s.kubeletProofs},
		{"rogue route", s.rogueRoute},
		{"faults", s.faults},
		{"monitoring", func(t *testing.T) {
			if !*withPrometheus {
				t.Skip("-cluster.prometheus=false")
			}
			s.monitoring(t)
		}},
		{"token renewed", func(t *testing.T) {
			if !*withRenewal {
				t.Skip("-cluster.token-renewal: about 10 minutes more")
			}
			s.tokenRenewed(t)
		}},
		{"shared dispatcher", s.sharedDispatcher},
		{"uninstall", s.uninstall},
	} {
		if !t.Run(step.name, step.run) && step.name == "walkthrough" {
			return
		}
	}
}

// reset removes what an earlier run left on a reused cluster.
func reset(t *testing.T) {
	_ = command("", "helm", "uninstall", release, "--namespace", operatorNS, "--wait")
	// With the controller gone nobody removes its finalizers: the namespaces and CRDs would
	// wait for them.
	kinds := strings.Fields(command("", "kubectl", "api-resources", "--api-group=webhook-operator.io", "-o", "name").stdout)
	if len(kinds) > 0 {
		out := command("", "kubectl", "get", strings.Join(kinds, ","), "-A", "-o", `jsonpath={range .items[*]}{.kind} {.metadata.namespace} {.metadata.name}{"\n"}{end}`).stdout
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(line); len(f) == 3 {
				_ = command("", "kubectl", "-n", f[1], "patch", strings.ToLower(f[0])+".webhook-operator.io", f[2], "--type=merge", "-p", `{"metadata":{"finalizers":null}}`)
			}
		}
	}
	_ = command("", "kubectl", "delete", "clusterrolebinding,clusterrole", "test-prometheus-discovery", "test-prometheus-metrics-reader", "--ignore-not-found")
	for _, ns := range []string{natsNS, operatorNS, shop, "ledger", legacy, monitoringNS, pooled} {
		_ = command("", "kubectl", "delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=3m")
	}
	out := command("", "kubectl", "get", "crd", "-o", "name").stdout
	for _, crd := range strings.Fields(out) {
		if strings.HasSuffix(crd, ".webhook-operator.io") {
			_ = command("", "kubectl", "delete", crd, "--wait=true")
		}
	}
	_ = os.RemoveAll(filepath.Join(filepath.Dir(world.kubeconfig), "nats-data"))
}
