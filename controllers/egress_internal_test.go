package controllers

import (
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestNATSPorts(t *testing.T) {
	for urls, want := range map[string][]int32{
		"nats://nats.nats.svc:4222":            {4222},
		"tls://a:4443, nats://b:4222,nats://c": {4222, 4443},
		"nats.example:7422":                    {7422},
		"":                                     {4222},
		"nats://[fd00::1]:5222,nats://[fd00::2]:5222": {5222},
	} {
		if got := natsPorts(urls); !slices.Equal(got, want) {
			t.Errorf("natsPorts(%q) = %v, want %v", urls, got, want)
		}
	}
}

// The installer's allowed CIDRs that open part of a refused range become receiver blocks of
// their own (an IPv4-mapped one as its IPv4 prefix); a wider one opens nothing, as in the
// outbound guard. The whole policy is valid for the API server.
func TestEgressPolicyAllowedCIDRs(t *testing.T) {
	allowed := []netip.Prefix{
		netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("::ffff:192.168.1.0/120"),
		netip.MustParsePrefix("fd12::/16"), netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("8.8.8.0/24"),
	}
	var cidrs []string
	for _, b := range receiverBlocks(allowed) {
		cidrs = append(cidrs, *b.CIDR)
	}
	want := []string{"0.0.0.0/0", "::/0", "64:ff9b::/96", "10.20.0.0/16", "192.168.1.0/24", "fd12::/16"}
	if !slices.Equal(cidrs, want) {
		t.Errorf("receiver blocks %v, want %v", cidrs, want)
	}

	d := &dispatcher{Namespace: "default", Name: "webhook-dispatcher"}
	e := &EgressPolicy{NATS: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.0.0/16"}}}, APIServerPorts: []int32{443}}
	ac, err := d.networkPolicy(e, "nats://nats:4222", allowed)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(ac)
	if err != nil {
		t.Fatal(err)
	}
	np := &networkingv1.NetworkPolicy{}
	if err := json.Unmarshal(b, np); err != nil {
		t.Fatal(err)
	}
	np.ObjectMeta = metav1.ObjectMeta{Namespace: "default", Name: "egress-dry-run"}
	if err := SuiteClient.Create(context.Background(), np, client.DryRunAll); err != nil {
		t.Fatalf("the API server refuses the policy: %v", err)
	}
}
