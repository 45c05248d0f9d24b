package docs

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestNATSNetworkPolicyAdmitsPeerPortsOnlyFromPeers reads the NetworkPolicy docs/scaling.md
// gives installers for the NATS pods (issue 30: it once opened 6222 and 7422 to every pod)
// as Kubernetes reads it, and checks that only the client port is open to everyone: routes
// and gateways (6222, 7222) only from the NATS pods, leaf nodes (7422) and monitoring (8222)
// only from what each rule names.
func TestNATSNetworkPolicyAdmitsPeerPortsOnlyFromPeers(t *testing.T) {
	md, err := os.ReadFile(filepath.Join(testenv.Root(), "docs", "scaling.md"))
	if err != nil {
		t.Fatal(err)
	}
	var np *networkingv1.NetworkPolicy
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(md), -1) {
		if !strings.Contains(m[1], "kind: NetworkPolicy") || !strings.Contains(m[1], "6222") {
			continue
		}
		np = &networkingv1.NetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(m[1]), np); err != nil {
			t.Fatalf("the NATS NetworkPolicy of docs/scaling.md does not read as one: %v", err)
		}
	}
	if np == nil {
		t.Fatal("docs/scaling.md has no NetworkPolicy for the NATS ports")
	}
	natsPods := np.Spec.PodSelector.MatchLabels
	if len(natsPods) == 0 || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Fatalf("the policy selects %v with types %v: it must select the NATS pods and hold their ingress", natsPods, np.Spec.PolicyTypes)
	}
	covered := map[int32]bool{}
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port == nil {
				t.Fatalf("a rule admits every port: %+v", rule)
			}
			port := p.Port.IntVal
			covered[port] = true
			switch port {
			case 4222:
				// clients: every pod (the callout decides who connects)
			case 6222, 7222:
				if len(rule.From) == 0 {
					t.Errorf("port %d is open to every pod", port)
				}
				for _, f := range rule.From {
					if f.PodSelector != nil && (f.NamespaceSelector != nil || !maps.Equal(f.PodSelector.MatchLabels, natsPods)) {
						t.Errorf("port %d is admitted from pods %v (namespaces %v), not the NATS pods %v", port, f.PodSelector.MatchLabels, f.NamespaceSelector, natsPods)
					}
					if f.PodSelector == nil && f.IPBlock == nil {
						t.Errorf("port %d is admitted from whole namespaces %v", port, f.NamespaceSelector)
					}
				}
			case 7422, 8222:
				if len(rule.From) == 0 {
					t.Errorf("port %d is open to every pod", port)
				}
			default:
				t.Errorf("the policy opens port %d, which NATS does not serve here", port)
			}
		}
	}
	for _, port := range []int32{4222, 6222, 7222, 7422, 8222} {
		if !covered[port] {
			t.Errorf("the policy says nothing of port %d", port)
		}
	}
}
