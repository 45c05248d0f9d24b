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

	"github.com/webhook-operator/webhook-operator/internal/netguard"
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
	for _, b := range receiverBlocks(netguard.Policy{Allowed: allowed}) {
		cidrs = append(cidrs, *b.CIDR)
	}
	want := []string{"0.0.0.0/0", "::/0", "10.20.0.0/16", "192.168.1.0/24", "fd12::/16"}
	if !slices.Equal(cidrs, want) {
		t.Errorf("receiver blocks %v, want %v", cidrs, want)
	}

	d := &dispatcher{Namespace: "default", Name: "webhook-dispatcher"}
	e := &EgressPolicy{NATS: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.0.0/16"}}}, APIServerPorts: []int32{443}}
	ac, err := d.networkPolicy(e, "nats://nats:4222", netguard.Policy{Allowed: allowed})
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

// The installer's blocked CIDRs are left out of every receiver block, their 6to4 forms too, and
// out of the allowed CIDRs that hold them; an allowed CIDR inside one opens nothing. An opened
// NAT64 prefix leaves out the NAT64 forms of every refused IPv4 range, and an opened
// link-local range the metadata addresses in it, as the guard does. The policy is valid for the
// API server.
func TestEgressPolicyBlockedCIDRs(t *testing.T) {
	guard := netguard.Policy{
		Allowed: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("64:ff9b::/96"),
			netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("10.244.7.0/24")},
		Blocked: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("2600:1f18:abcd::/56"),
			netip.MustParsePrefix("203.0.114.0/24")},
	}
	blocks := map[string][]string{}
	var order []string
	for _, b := range receiverBlocks(guard) {
		blocks[*b.CIDR] = b.Except
		order = append(order, *b.CIDR)
	}
	if want := []string{"0.0.0.0/0", "::/0", "10.0.0.0/8", "64:ff9b::/96", "169.254.0.0/16"}; !slices.Equal(order, want) {
		t.Fatalf("receiver blocks %v, want %v", order, want)
	}
	for cidr, want := range map[string][]string{
		"0.0.0.0/0":      {"10.0.0.0/8", "203.0.114.0/24", "169.254.0.0/16"},
		"::/0":           {"2600:1f18:abcd::/56", "2002:cb00:7200::/40", "::/3"},
		"10.0.0.0/8":     {"10.244.0.0/16"},
		"64:ff9b::/96":   {"64:ff9b::a00:0/104", "64:ff9b::7f00:0/104", "64:ff9b::a9fe:0/112", "64:ff9b::cb00:7200/120", "64:ff9b::a83f:8110/128"},
		"169.254.0.0/16": {"169.254.169.254/32", "169.254.170.2/32"},
	} {
		for _, e := range want {
			if !slices.Contains(blocks[cidr], e) {
				t.Errorf("block %s excepts %v, not %s", cidr, blocks[cidr], e)
			}
		}
	}

	d := &dispatcher{Namespace: "default", Name: "webhook-dispatcher"}
	ac, err := d.networkPolicy(&EgressPolicy{APIServerPorts: []int32{443}}, "nats://nats:4222", guard)
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
	np.ObjectMeta = metav1.ObjectMeta{Namespace: "default", Name: "egress-blocked-dry-run"}
	if err := SuiteClient.Create(context.Background(), np, client.DryRunAll); err != nil {
		t.Fatalf("the API server refuses the policy: %v", err)
	}
}
