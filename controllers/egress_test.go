package controllers_test

import (
	"context"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
)

// With --dispatcher-egress-policy (the suite runs with it), every dispatcher Deployment gets
// one egress NetworkPolicy selecting its Pods: DNS (to the given peers), NATS (the URL's port),
// the API server (its CIDRs and ports), and receivers on TCP anywhere but the ranges the
// outbound guard refuses, their 6to4 forms and (re-opened NAT64 aside) their NAT64 forms. A
// dedicated dispatcher's policy belongs to its endpoint; each goes with its dispatcher.
func TestDispatcherEgressPolicy(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "orders"))
	create(t, endpoint(ns, "billing", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true} }))

	policy := func(g Gomega, name string) *networkingv1.NetworkPolicy {
		np := &networkingv1.NetworkPolicy{}
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, np)).To(Succeed())
		return np
	}
	var np *networkingv1.NetworkPolicy
	g.Eventually(func(g Gomega) { np = policy(g, names.SharedDispatcher) }).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(np.Labels).To(HaveKeyWithValue(names.LabelManagedBy, names.LabelManagedByValue))
	g.Expect(np.Spec.PodSelector.MatchLabels).To(Equal(map[string]string{names.LabelName: names.LabelNameValue, names.LabelDispatcher: names.SharedDispatcher}))
	g.Expect(np.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{networkingv1.PolicyTypeEgress}))
	g.Expect(np.Spec.Ingress).To(BeEmpty())
	g.Expect(np.Spec.Egress).To(HaveLen(4))

	ports := func(r networkingv1.NetworkPolicyEgressRule) []string {
		var out []string
		for _, p := range r.Ports {
			s := string(*p.Protocol)
			if p.Port != nil {
				s += "/" + p.Port.String()
			}
			out = append(out, s)
		}
		return out
	}
	dns, nats, api, receivers := np.Spec.Egress[0], np.Spec.Egress[1], np.Spec.Egress[2], np.Spec.Egress[3]
	g.Expect(ports(dns)).To(Equal([]string{"UDP/53", "TCP/53"}))
	g.Expect(dns.To).To(HaveLen(1))
	g.Expect(dns.To[0].NamespaceSelector.MatchLabels).To(Equal(map[string]string{"kubernetes.io/metadata.name": "kube-system"}))
	natsPort := natsSrv.URL()[strings.LastIndex(natsSrv.URL(), ":")+1:]
	g.Expect(ports(nats)).To(Equal([]string{"TCP/" + natsPort}))
	g.Expect(nats.To).To(BeEmpty(), "no NATS peers given: any destination on its port")
	g.Expect(ports(api)).To(Equal([]string{"TCP/443", "TCP/6443"}))
	g.Expect(api.To).To(Equal([]networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.96.0.1/32"}}}))
	g.Expect(ports(receivers)).To(Equal([]string{"TCP"}), "receivers on any TCP port")
	blocks := map[string][]string{}
	for _, p := range receivers.To {
		blocks[p.IPBlock.CIDR] = p.IPBlock.Except
	}
	g.Expect(blocks).To(HaveLen(2), "NAT64 (64:ff9b::/96, inside ::/3) is refused as a whole unless allowed")
	g.Expect(blocks["0.0.0.0/0"]).To(ContainElements("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/4", "240.0.0.0/4"))
	g.Expect(blocks["0.0.0.0/0"]).NotTo(ContainElements("169.254.169.254/32", "100.100.100.200/32"), "inside 169.254.0.0/16 and 100.64.0.0/10 already")
	g.Expect(blocks["::/0"]).To(ContainElements("::/3", "4000::/2", "8000::/1", "2001::/32", "2001:db8::/32",
		"2002::/24", "2002:a00::/24", "2002:7f00::/24", "2002:a9fe::/32", "2002:c0a8::/32"))

	// The dedicated dispatcher's, owned by its endpoint.
	var dedicated *networkingv1.NetworkPolicy
	g.Eventually(func(g Gomega) { dedicated = policy(g, names.DedicatedDispatcher("billing")) }).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(dedicated.Spec.PodSelector.MatchLabels).To(HaveKeyWithValue(names.LabelDispatcher, names.DedicatedDispatcher("billing")))
	g.Expect(dedicated.OwnerReferences).To(ConsistOf(HaveField("Name", "billing")))

	// Each goes with its dispatcher.
	g.Expect(k8s.Delete(ctx, endpoint(ns, "billing"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.DedicatedDispatcher("billing")}, &networkingv1.NetworkPolicy{})
		g.Expect(err).To(MatchError(ContainSubstring("not found")))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	policy(g, names.SharedDispatcher)
	g.Expect(k8s.Delete(ctx, endpoint(ns, "orders"))).To(Succeed())
	expectNoDispatcherLeft(t, ns)

	// Someone else's NetworkPolicy in the namespace is none of the controller's business.
	other := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-own"}}
	create(t, other)
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "tenant-own"}, &networkingv1.NetworkPolicy{})).To(Succeed())
}
