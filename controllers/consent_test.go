package controllers_test

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/names"
)

// A Secret an endpoint references is used only with the Secret's consent: without the
// annotation naming the endpoint the endpoint is Ready False SecretNotAllowed (Stalled: only the
// Secret's owner can change that), with a message naming the Secret and the annotation to add,
// and the dispatcher's Role does not let it read the Secret. Consent given, the endpoint is
// wired and the Role grants the Secret; consent withdrawn, both go back. The Secret the
// controller generates consents to its endpoint by itself.
func TestSecretsByConsent(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orders-auth"}, StringData: map[string]string{"token": "Bearer abc"}})
	create(t, endpoint(ns, "orders", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.HeadersFrom = []v1alpha1.HeaderFromSecret{{Name: "Authorization", SecretKeyRef: v1alpha1.SecretKeySelector{Name: "orders-auth", Key: "token"}}}
	}))
	markAvailable(t, ns, "webhook-dispatcher")

	refused := func(msg ...string) {
		t.Helper()
		ep := eventuallyReady(t, ns, "orders", "False/"+v1alpha1.ReasonSecretNotAllowed)
		ready := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady)
		for _, m := range msg {
			g.Expect(ready.Message).To(ContainSubstring(m))
		}
		g.Expect(meta.IsStatusConditionTrue(ep.Status.Conditions, v1alpha1.ConditionStalled)).To(BeTrue(), "kstatus Failed: only the Secret's owner can fix it")
		expectHealth(t, ns, "orders", &v1alpha1.WebhookEndpoint{}, status.FailedStatus, "Degraded")
		expectRoleSecrets(t, ns, "webhook-dispatcher", "orders-signing")
	}
	refused("Secret "+ns+"/orders-auth (spec.headersFrom[Authorization]) does not consent to endpoint orders",
		`annotate it with webhook-operator.io/allowed-endpoints: "orders"`)

	setSecretAnnotation(t, ns, "orders-auth", consent.AllowedEndpoints, "crm, orders")
	eventuallyReady(t, ns, "orders", "True/Ready")
	expectRoleSecrets(t, ns, "webhook-dispatcher", "orders-auth", "orders-signing")

	setSecretAnnotation(t, ns, "orders-auth", consent.AllowedEndpoints, "crm")
	refused(`(webhook-operator.io/allowed-endpoints is "crm"): its owner must set it to "crm,orders"`)

	setSecretAnnotation(t, ns, "orders-auth", consent.AllowedEndpoints, "*")
	eventuallyReady(t, ns, "orders", "True/Ready")
	expectRoleSecrets(t, ns, "webhook-dispatcher", "orders-auth", "orders-signing")
}

// The exfiltration endpoint of the audit: a header taken from the dispatcher's NATS
// credentials. It is refused whatever the Secret says, its dispatcher's Role never lets it read
// the Secret, and so is a header taken from a ServiceAccount token, from another endpoint's
// generated signing Secret, or from anything the operator manages.
func TestExfiltrationEndpointRefused(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "orders"))
	g.Eventually(func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.NATSSecret}, &corev1.Secret{})
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed(), "the NATS credentials are mirrored into the namespace")
	// Even annotated as consenting, the operator's Secrets are never usable.
	setSecretAnnotation(t, ns, names.NATSSecret, consent.AllowedEndpoints, "*")
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sa-token", Annotations: map[string]string{
		corev1.ServiceAccountNameKey: "default", consent.AllowedEndpoints: "*"}}, Type: corev1.SecretTypeServiceAccountToken})
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ours", Labels: map[string]string{
		names.LabelManagedBy: names.LabelManagedByValue}, Annotations: map[string]string{consent.AllowedEndpoints: "*"}}})

	for name, c := range map[string]struct{ secret, key, says string }{
		"leak":     {names.NATSSecret, "password", "is the operator's NATS credentials (mirrored into dispatcher namespaces), which no endpoint may ever use"},
		"token":    {"sa-token", "token", "is a ServiceAccount token, which no endpoint may ever use"},
		"signing":  {"orders-signing", "secret", "is an object the operator manages (labelled app.kubernetes.io/managed-by=webhook-operator), which no endpoint may ever use"},
		"operator": {"ours", "x", "is an object the operator manages (labelled app.kubernetes.io/managed-by=webhook-operator), which no endpoint may ever use"},
	} {
		create(t, endpoint(ns, name, func(ep *v1alpha1.WebhookEndpoint) {
			ep.Spec.HeadersFrom = []v1alpha1.HeaderFromSecret{{Name: "X-Leak", SecretKeyRef: v1alpha1.SecretKeySelector{Name: c.secret, Key: c.key}}}
		}))
		ep := eventuallyReady(t, ns, name, "False/"+v1alpha1.ReasonSecretNotAllowed)
		g.Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady).Message).To(
			Equal("Secret " + ns + "/" + c.secret + " (spec.headersFrom[X-Leak]) " + c.says))
		g.Expect(meta.IsStatusConditionTrue(ep.Status.Conditions, v1alpha1.ConditionStalled)).To(BeTrue())
	}
	// The dispatcher serving all of them reads orders' signing Secret and the signing Secrets
	// generated for each of them, nothing else.
	expectRoleSecrets(t, ns, "webhook-dispatcher", "leak-signing", "operator-signing", "orders-signing", "signing-signing", "token-signing")
	as := impersonate(t, "system:serviceaccount:"+ns+":webhook-dispatcher")
	for _, s := range []string{names.NATSSecret, "sa-token", "ours"} {
		g.Expect(as.Get(ctx, types.NamespacedName{Namespace: ns, Name: s}, &corev1.Secret{})).To(MatchError(ContainSubstring("forbidden")), s)
	}
}

// expectRoleSecrets waits until the dispatcher's Role grants exactly the Secrets secrets.
func expectRoleSecrets(t *testing.T, ns, dispatcher string, secrets ...string) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		role := &rbacv1.Role{}
		g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: dispatcher}, role)).To(Succeed())
		g.Expect(secretNames(role)).To(Equal(secrets))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// setSecretAnnotation sets one annotation of a Secret, as its owner would.
func setSecretAnnotation(t *testing.T, ns, name, key, value string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"`+key+`":"`+value+`"}}}`))
	if err := k8s.Patch(context.Background(), s, patch); err != nil {
		t.Fatal(err)
	}
}

// The reserved Secrets come before ownership: a Secret labelled as the operator's that its
// writer made "controlled" by the endpoint (an owner reference is written by whoever may write
// the Secret) is still refused, and the dispatcher's Role does not grant it.
func TestReservedSecretOwnedByTheEndpointRefused(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ours", Labels: map[string]string{
		names.LabelManagedBy: names.LabelManagedByValue}}, StringData: map[string]string{"x": "y"}})
	ep := endpoint(ns, "owner", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.HeadersFrom = []v1alpha1.HeaderFromSecret{{Name: "X-Leak", SecretKeyRef: v1alpha1.SecretKeySelector{Name: "ours", Key: "x"}}}
	})
	create(t, ep)
	owner := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":%q,"kind":"WebhookEndpoint","name":"owner","uid":%q,"controller":true}]}}`,
		v1alpha1.GroupVersion.String(), ep.UID)
	g.Expect(k8s.Patch(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ours"}},
		client.RawPatch(types.MergePatchType, []byte(owner)))).To(Succeed())
	got := eventuallyReady(t, ns, "owner", "False/"+v1alpha1.ReasonSecretNotAllowed)
	g.Expect(meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady).Message).To(Equal("Secret " + ns +
		"/ours (spec.headersFrom[X-Leak]) is an object the operator manages (labelled app.kubernetes.io/managed-by=webhook-operator), which no endpoint may ever use"))
	expectRoleSecrets(t, ns, "webhook-dispatcher", "owner-signing")
}
