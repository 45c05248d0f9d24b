package controllers

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	networkingv1ac "k8s.io/client-go/applyconfigurations/networking/v1"

	"github.com/webhook-operator/webhook-operator/internal/netguard"
)

// EgressPolicy is what a dispatcher may reach when the installer asks for an egress
// NetworkPolicy per dispatcher (--dispatcher-egress-policy): DNS, NATS, the Kubernetes API
// server, and receivers: any address but the ranges the outbound guard refuses (private,
// loopback, link-local, metadata, NAT64 and the other special-purpose ranges, with their 6to4
// forms, and the installer's blocked CIDRs), plus the installer's allowed CIDRs. The policy is coarser than the guard (which
// still checks every connection); it keeps a dispatcher from reaching what the guard refuses
// even if the process were subverted.
type EgressPolicy struct {
	// DNS are the peers serving DNS; empty allows any destination on port 53.
	DNS []networkingv1.NetworkPolicyPeer
	// NATS are the NATS servers' peers; empty allows any destination on the NATS URLs' ports.
	NATS []networkingv1.NetworkPolicyPeer
	// APIServer are the Kubernetes API server's addresses; empty allows any destination on
	// APIServerPorts.
	APIServer []netip.Prefix
	// APIServerPorts are the API server's ports (443, 6443 by default).
	APIServerPorts []int32
}

// defaultNATSPort is the port of a NATS URL without one.
const defaultNATSPort = 4222

// natsPorts are the ports of the comma-separated NATS URLs, each once.
func natsPorts(urls string) []int32 {
	var ports []int32
	for _, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw
		}
		port := int32(defaultNATSPort)
		if u, err := url.Parse(raw); err == nil && u.Port() != "" {
			if n, err := strconv.ParseUint(u.Port(), 10, 16); err == nil && n > 0 {
				port = int32(n)
			}
		}
		if !slices.Contains(ports, port) {
			ports = append(ports, port)
		}
	}
	if len(ports) == 0 {
		ports = []int32{defaultNATSPort}
	}
	slices.Sort(ports)
	return ports
}

// receiverBlocks are the ipBlocks receivers may be at under guard: all of IPv4 and IPv6 but
// the ranges it refuses (the built-in ones, among them the whole NAT64 prefix 64:ff9b::/96, and
// the installer's blocked CIDRs) and the 6to4 forms of the refused IPv4 ranges; and each
// allowed CIDR that opens part of a built-in refused range (a wider one opens nothing, as in
// the guard), but what it holds of another refused range, of the installer's blocked ones, or
// of the NAT64 forms of the refused IPv4 ranges (an opened NAT64 prefix reaches only public
// IPv4 addresses).
func receiverBlocks(guard netguard.Policy) []*networkingv1ac.IPBlockApplyConfiguration {
	var v4, v6, nat64 []netip.Prefix
	builtIn := netguard.BlockedRanges()
	refused := slices.Clone(builtIn)
	for _, b := range guard.Blocked {
		refused = append(refused, netguard.Normalize(b))
	}
	for _, p := range refused {
		if p.Addr().Is4() {
			v4 = append(v4, p)
			forms := netguard.EmbeddedForms(p)
			v6 = append(v6, forms[0])
			nat64 = append(nat64, forms[1])
		} else {
			v6 = append(v6, p)
		}
	}
	block := func(cidr netip.Prefix, except []netip.Prefix) *networkingv1ac.IPBlockApplyConfiguration {
		b := networkingv1ac.IPBlock().WithCIDR(cidr.String())
		// An except must lie strictly inside its CIDR.
		inside := slices.DeleteFunc(slices.Clone(except), func(e netip.Prefix) bool {
			return e.Addr().Is4() != cidr.Addr().Is4() || e.Bits() <= cidr.Bits() || !cidr.Contains(e.Addr())
		})
		for _, e := range outermost(inside) {
			b.WithExcept(e.String())
		}
		return b
	}
	blocks := []*networkingv1ac.IPBlockApplyConfiguration{
		block(netip.MustParsePrefix("0.0.0.0/0"), v4),
		block(netip.MustParsePrefix("::/0"), v6),
	}
	all := slices.Concat(v4, v6, nat64)
	for _, a := range guard.Allowed {
		a = netguard.Normalize(a)
		opens := slices.ContainsFunc(builtIn, func(b netip.Prefix) bool { return b.Bits() <= a.Bits() && b.Contains(a.Addr()) })
		closed := slices.ContainsFunc(refused[len(builtIn):], func(b netip.Prefix) bool { return b.Bits() <= a.Bits() && b.Contains(a.Addr()) })
		if opens && !closed {
			blocks = append(blocks, block(a, all))
		}
	}
	return blocks
}

// outermost keeps the prefixes no other prefix of ps contains, sorted.
func outermost(ps []netip.Prefix) []netip.Prefix {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if a.Bits() != b.Bits() {
			return a.Bits() - b.Bits()
		}
		return a.Addr().Compare(b.Addr())
	})
	var out []netip.Prefix
	for _, p := range ps {
		if !slices.ContainsFunc(out, func(o netip.Prefix) bool { return o.Contains(p.Addr()) }) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// peers converts NetworkPolicyPeers into their apply configurations.
func peers(ps []networkingv1.NetworkPolicyPeer) ([]*networkingv1ac.NetworkPolicyPeerApplyConfiguration, error) {
	out := make([]*networkingv1ac.NetworkPolicyPeerApplyConfiguration, len(ps))
	for i := range ps {
		b, err := json.Marshal(ps[i])
		if err != nil {
			return nil, err
		}
		out[i] = &networkingv1ac.NetworkPolicyPeerApplyConfiguration{}
		if err := json.Unmarshal(b, out[i]); err != nil {
			return nil, fmt.Errorf("a NetworkPolicyPeer: %w", err)
		}
	}
	return out, nil
}

// networkPolicy is the dispatcher's egress NetworkPolicy: its Pods may reach DNS, NATS, the API
// server and receivers (receiverBlocks, on TCP), nothing else. Ingress is not restricted.
func (d *dispatcher) networkPolicy(e *EgressPolicy, natsURLs string, guard netguard.Policy) (*networkingv1ac.NetworkPolicyApplyConfiguration, error) {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(proto corev1.Protocol, n int32) *networkingv1ac.NetworkPolicyPortApplyConfiguration {
		return networkingv1ac.NetworkPolicyPort().WithProtocol(proto).WithPort(intstr.FromInt32(n))
	}
	rule := func(to []networkingv1.NetworkPolicyPeer, ports ...*networkingv1ac.NetworkPolicyPortApplyConfiguration) (*networkingv1ac.NetworkPolicyEgressRuleApplyConfiguration, error) {
		r := networkingv1ac.NetworkPolicyEgressRule().WithPorts(ports...)
		ps, err := peers(to)
		if err != nil {
			return nil, err
		}
		return r.WithTo(ps...), nil
	}
	dns, err := rule(e.DNS, port(udp, 53), port(tcp, 53))
	if err != nil {
		return nil, fmt.Errorf("DNS peers: %w", err)
	}
	var natsPortList []*networkingv1ac.NetworkPolicyPortApplyConfiguration
	for _, p := range natsPorts(natsURLs) {
		natsPortList = append(natsPortList, port(tcp, p))
	}
	nats, err := rule(e.NATS, natsPortList...)
	if err != nil {
		return nil, fmt.Errorf("NATS peers: %w", err)
	}
	api := networkingv1ac.NetworkPolicyEgressRule()
	for _, p := range e.APIServerPorts {
		api.WithPorts(port(tcp, p))
	}
	for _, c := range e.APIServer {
		api.WithTo(networkingv1ac.NetworkPolicyPeer().WithIPBlock(networkingv1ac.IPBlock().WithCIDR(c.Masked().String())))
	}
	receivers := networkingv1ac.NetworkPolicyEgressRule().WithPorts(networkingv1ac.NetworkPolicyPort().WithProtocol(tcp))
	for _, b := range receiverBlocks(guard) {
		receivers.WithTo(networkingv1ac.NetworkPolicyPeer().WithIPBlock(b))
	}

	np := networkingv1ac.NetworkPolicy(d.Name, d.Namespace)
	np.ObjectMetaApplyConfiguration = d.meta(d.Name)
	return np.WithSpec(networkingv1ac.NetworkPolicySpec().
		WithPodSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(d.Name))).
		WithPolicyTypes(networkingv1.PolicyTypeEgress).
		WithEgress(dns, nats, api, receivers)), nil
}
