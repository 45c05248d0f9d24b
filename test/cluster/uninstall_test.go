package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/names"
)

// operatorKinds are the kinds of every object the chart or the controller makes.
const operatorKinds = "deployments,serviceaccounts,roles,rolebindings,secrets,configmaps,networkpolicies,services,validatingadmissionpolicies,validatingadmissionpolicybindings,clusterroles,clusterrolebindings"

// leftovers lists objects labelled as the operator's (the controller's label, or the chart's
// release) in every namespace, but a tenant namespace's record of its streams
// (names.StreamsConfigMap): the namespace's events, log and dead letters stay in NATS after
// its last endpoint, and the record goes with the namespace, as the chart's README says.
func leftovers(t *testing.T, selector string) []string {
	t.Helper()
	out := kubectl(t, "get", operatorKinds, "-A", "-l", selector, "-o", "custom-columns=NS:.metadata.namespace,KIND:.kind,NAME:.metadata.name", "--no-headers")
	var left []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && !(f[1] == "ConfigMap" && f[2] == names.StreamsConfigMap) {
			left = append(left, strings.Join(f, "/"))
		}
	}
	return left
}

// uninstall removes the installation as the chart's README says: the endpoints first, while
// the controller runs (their finalizers are its: it removes their consumers and dispatchers),
// then helm uninstall, which removes the chart's objects and keeps the CRDs (crds.keep), then
// the CRDs. Nothing of the operator's remains.
func (s *install) uninstall(t *testing.T) {
	for _, ns := range []string{shop, "ledger", legacy, pooled} {
		if command("", "kubectl", "get", "namespace", ns).err == nil {
			kubectl(t, "-n", ns, "delete", "webhookreplays,webhookendpoints,retrypolicies", "--all", "--wait=true", "--timeout=3m")
		}
	}
	eventually(t, 3*time.Minute, "the controller to remove the dispatchers", func() error {
		if l := leftovers(t, "app.kubernetes.io/managed-by=webhook-operator"); len(l) > 0 {
			return fmt.Errorf("left with no endpoint: %v", l)
		}
		return nil
	})
	logf(t, "endpoints deleted: the controller removed every object it made for them but the streams records")
	// The streams record carries the controller's finalizer (it removes the namespace's
	// streams): tenant namespaces go while the controller runs.
	for _, ns := range []string{shop, "ledger", legacy, pooled} {
		_ = command("", "kubectl", "delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=3m")
	}
	sh(t, "helm", "uninstall", release, "--namespace", operatorNS, "--wait", "--timeout", "5m")
	eventually(t, 3*time.Minute, "the chart's objects to go", func() error {
		if l := leftovers(t, "app.kubernetes.io/instance="+release); len(l) > 0 {
			return fmt.Errorf("left by helm uninstall: %v", l)
		}
		return nil
	})
	crds := strings.Fields(kubectl(t, "get", "crd", "-o", "name"))
	var ours []string
	for _, c := range crds {
		if strings.HasSuffix(c, ".webhook-operator.io") {
			ours = append(ours, c)
		}
	}
	if len(ours) == 0 {
		t.Fatal("helm uninstall removed the CRDs (crds.keep is true by default)")
	}
	logf(t, "helm uninstall: the chart's objects are gone; kept (crds.keep): %v", ours)
	kubectl(t, append([]string{"delete", "--wait=true", "--timeout=3m"}, ours...)...)
	eventually(t, 3*time.Minute, "the controller's objects to go with the CRDs", func() error {
		if l := leftovers(t, "app.kubernetes.io/managed-by=webhook-operator"); len(l) > 0 {
			return fmt.Errorf("left: %v", l)
		}
		return nil
	})
	if out := strings.TrimSpace(kubectl(t, "get", operatorKinds, "-A", "-l", "app.kubernetes.io/managed-by=webhook-operator", "-o", "name")); out != "" {
		t.Errorf("with the tenant namespaces gone, still: %s", out)
	}
	logf(t, "CRDs deleted: no object of the operator remains")
}
