package main

import (
	"strings"
	"testing"
)

// No egress NetworkPolicy unless asked for; the flags' peers, CIDRs and ports reach the
// controller's options, and bad ones are refused with the flag's name.
func TestDispatcherEgressFlags(t *testing.T) {
	f, err := parseControllerFlags(t)
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.options()
	if err != nil || o.DispatcherEgress != nil {
		t.Fatalf("defaults: egress %+v, %v", o.DispatcherEgress, err)
	}

	f, err = parseControllerFlags(t, "--dispatcher-egress-policy",
		`--dispatcher-egress-dns-to=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"kube-system"}},"podSelector":{"matchLabels":{"k8s-app":"kube-dns"}}}]`,
		`--dispatcher-egress-nats-to=[{"ipBlock":{"cidr":"10.1.0.0/16"}}]`,
		"--dispatcher-egress-api-server-cidrs=10.96.0.1/32,192.168.0.10/32", "--dispatcher-egress-api-server-ports=6443")
	if err != nil {
		t.Fatal(err)
	}
	o, err = f.options()
	if err != nil {
		t.Fatal(err)
	}
	e := o.DispatcherEgress
	if e == nil || len(e.DNS) != 1 || e.DNS[0].PodSelector.MatchLabels["k8s-app"] != "kube-dns" || len(e.NATS) != 1 ||
		e.NATS[0].IPBlock.CIDR != "10.1.0.0/16" || len(e.APIServer) != 2 || len(e.APIServerPorts) != 1 || e.APIServerPorts[0] != 6443 {
		t.Fatalf("egress %+v", e)
	}

	for _, c := range []struct{ arg, want string }{
		{`--dispatcher-egress-dns-to=[{"namespaceSelecter":{}}]`, "--dispatcher-egress-dns-to"},
		{`--dispatcher-egress-nats-to={}`, "--dispatcher-egress-nats-to"},
		{"--dispatcher-egress-api-server-cidrs=kubernetes", "--dispatcher-egress-api-server-cidrs"},
		{"--dispatcher-egress-api-server-ports=0", "--dispatcher-egress-api-server-ports"},
	} {
		f, err := parseControllerFlags(t, "--dispatcher-egress-policy", c.arg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.options(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.arg, err)
		}
	}
}
