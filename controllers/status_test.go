package controllers_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// A missing RetryPolicy or Secret makes Ready False with a reason naming it; creating what is
// missing turns Ready True with no other change to the endpoint.
func TestMissingReferencesFlipReadyWhenCreated(t *testing.T) {
	ns := newNamespace(t)
	create(t, endpoint(ns, "crm", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.RetryPolicyRef = &v1alpha1.LocalObjectReference{Name: "crm-resend"}
	}))
	create(t, endpoint(ns, "payments", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Signing = &v1alpha1.SigningSpec{SecretRef: v1alpha1.SecretKeySelector{Name: "payments-key", Key: "secret"}}
	}))
	create(t, endpoint(ns, "audit", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.HeadersFrom = []v1alpha1.HeaderFromSecret{{Name: "Authorization", SecretKeyRef: v1alpha1.SecretKeySelector{Name: "audit-token", Key: "token"}}}
	}))

	for name, reason := range map[string]string{
		"crm":      v1alpha1.ReasonRetryPolicyNotFound,
		"payments": v1alpha1.ReasonSigningSecretNotFound,
		"audit":    v1alpha1.ReasonSecretNotFound,
	} {
		ep := eventuallyReady(t, ns, name, "False/"+reason)
		NewWithT(t).Expect(meta.IsStatusConditionTrue(ep.Status.Conditions, v1alpha1.ConditionReconciling)).To(BeTrue(),
			"a missing reference is waited for (kstatus InProgress), not a failure")
	}
	ep := eventuallyReady(t, ns, "payments", "False/"+v1alpha1.ReasonSigningSecretNotFound)
	NewWithT(t).Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady).Message).To(ContainSubstring("payments-key"))
	markAvailable(t, ns, "webhook-dispatcher")

	generations := map[string]int64{}
	for _, name := range []string{"crm", "payments", "audit"} {
		generations[name] = getEndpoint(NewWithT(t), ns, name).Generation
	}
	create(t, &v1alpha1.RetryPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "crm-resend"},
		Spec: v1alpha1.RetryPolicySpec{MaxAttempts: ptr(int32(5))}})
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payments-key"},
		StringData: map[string]string{"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}})
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "audit-token"},
		StringData: map[string]string{"token": "Bearer abc"}})
	for _, name := range []string{"crm", "payments", "audit"} {
		ep := eventuallyReady(t, ns, name, "True/Ready")
		NewWithT(t).Expect(ep.Generation).To(Equal(generations[name]), "the endpoint itself did not change")
	}
	ep = getEndpoint(NewWithT(t), ns, "crm")
	NewWithT(t).Expect(ep.Status.RetryPolicyName).To(Equal("crm-resend"))
	ep = getEndpoint(NewWithT(t), ns, "payments")
	NewWithT(t).Expect(ep.Status.SigningSecretName).To(Equal("payments-key"))
	// No secret was generated for an endpoint that names its own.
	err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: "payments-signing"}, &corev1.Secret{})
	NewWithT(t).Expect(err).To(MatchError(ContainSubstring("not found")))
}

// What the installation refuses is Ready False and Stalled (kstatus Failed): http where https
// is required, literal private, loopback and metadata addresses, and other namespaces' events
// when cross-namespace sources are not allowed. Nothing is wired for them.
func TestRefusedSpecsAreStalled(t *testing.T) {
	ns := newNamespace(t)
	cases := map[string]struct {
		change func(*v1alpha1.WebhookEndpoint)
		reason string
	}{
		"plain-http":  {func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.URL = "http://receiver.example.com/" }, v1alpha1.ReasonInvalidURL},
		"private":     {func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.URL = "https://10.1.2.3/hook" }, v1alpha1.ReasonInvalidURL},
		"loopback":    {func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.URL = "https://127.0.0.1:8443/hook" }, v1alpha1.ReasonInvalidURL},
		"metadata":    {func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.URL = "https://169.254.169.254/latest" }, v1alpha1.ReasonInvalidURL},
		"other-space": {func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.SourceNamespaces = []string{"billing"} }, v1alpha1.ReasonSourceNotAllowed},
	}
	for name, c := range cases {
		create(t, endpoint(ns, name, c.change))
	}
	for name, c := range cases {
		ep := eventuallyReady(t, ns, name, "False/"+c.reason)
		g := NewWithT(t)
		g.Expect(meta.IsStatusConditionTrue(ep.Status.Conditions, v1alpha1.ConditionStalled)).To(BeTrue(), name)
		g.Expect(ep.Status.ConsumerName).To(BeEmpty(), "%s: nothing is delivered to a refused endpoint", name)
		g.Expect(consumerExists(g, layout.For(ns).DeliveriesStream(), layout.For(ns).EndpointConsumer(name))).To(BeFalse())
	}

	// Fixing the spec wires it and clears Stalled.
	g := NewWithT(t)
	updateEndpoint(t, ns, "plain-http", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.URL = "https://receiver.example.com/" })
	ep := eventuallyReady(t, ns, "plain-http", "False/"+v1alpha1.ReasonDispatcherUnavailable)
	g.Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionStalled)).To(BeNil())
	g.Expect(ep.Status.ConsumerName).NotTo(BeEmpty())
}

// A suspended endpoint is wired (its deliveries wait in its consumer) but not Ready; resuming
// makes it Ready.
func TestSuspendedEndpoint(t *testing.T) {
	g := NewWithT(t)
	ns := newNamespace(t)
	create(t, endpoint(ns, "paused", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Suspend = true }))
	markAvailable(t, ns, "webhook-dispatcher")
	ep := eventuallyReady(t, ns, "paused", "False/"+v1alpha1.ReasonSuspended)
	g.Expect(ep.Status.ConsumerName).NotTo(BeEmpty())
	g.Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReconciling)).To(BeNil(), "suspension is a settled state")

	updateEndpoint(t, ns, "paused", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Suspend = false })
	eventuallyReady(t, ns, "paused", "True/Ready")
}

// The controller and the dispatcher write the same status with server-side apply and their
// own field managers: the controller's writes leave the dispatcher's health and conditions.
func TestStatusLeavesTheDispatchersFieldsAlone(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "shared"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "shared", "True/Ready")

	// What a dispatcher writes.
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "WebhookEndpoint",
		"metadata": map[string]any{"name": "shared", "namespace": ns},
		"status": map[string]any{
			"health": map[string]any{"attempts": int64(12), "successRate": "91.7%", "circuitState": "Closed"},
			"conditions": []any{map[string]any{"type": "Disabled", "status": "False", "reason": "Enabled",
				"message": "delivering", "lastTransitionTime": metav1.Now().UTC().Format("2006-01-02T15:04:05Z")}},
		},
	}}
	g.Expect(k8s.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("webhook-operator-dispatcher"), client.ForceOwnership)).To(Succeed())

	// A controller write: suspending flips Ready.
	updateEndpoint(t, ns, "shared", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Suspend = true })
	ep := eventuallyReady(t, ns, "shared", "False/"+v1alpha1.ReasonSuspended)
	g.Expect(ep.Status.Health).NotTo(BeNil())
	g.Expect(ep.Status.Health.Attempts).To(BeEquivalentTo(12))
	g.Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionDisabled)).NotTo(BeNil())
}

// A RetryPolicy reports whether it is valid, its attempts and waits, and how many endpoints
// use it.
func TestRetryPolicyStatus(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, &v1alpha1.RetryPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payments"},
		Spec: v1alpha1.RetryPolicySpec{Schedule: durations("0s", "30s", "5m", "30m", "2h", "12h", "24h")}})
	rpStatus := func(g Gomega) v1alpha1.RetryPolicyStatus {
		rp := &v1alpha1.RetryPolicy{}
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "payments"}, rp)).To(Succeed())
		g.Expect(rp.Status.ObservedGeneration).To(Equal(rp.Generation))
		return rp.Status
	}
	g.Eventually(func(g Gomega) {
		st := rpStatus(g)
		g.Expect(meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionReady)).To(BeTrue())
		g.Expect(st.MaxAttempts).To(BeEquivalentTo(7))
		g.Expect(st.Summary).To(Equal("0s, 30s, 5m, 30m, 2h, 12h, 24h"))
		g.Expect(st.Endpoints).To(BeZero())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	usesIt := func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.RetryPolicyRef = &v1alpha1.LocalObjectReference{Name: "payments"}
	}
	create(t, endpoint(ns, "a", usesIt))
	create(t, endpoint(ns, "b", usesIt))
	create(t, endpoint(ns, "c"))
	g.Eventually(func(g Gomega) { g.Expect(rpStatus(g).Endpoints).To(BeEquivalentTo(2)) }).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	g.Expect(k8s.Delete(ctx, endpoint(ns, "a"))).To(Succeed())
	g.Eventually(func(g Gomega) { g.Expect(rpStatus(g).Endpoints).To(BeEquivalentTo(1)) }).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// Rotating a Secret reaches dispatchers without a restart: a new version of a Secret changes
// status.secretsVersion (which dispatchers watch), a new Secret name is added to the Role,
// and neither changes the Deployment's pod template.
func TestSecretRotationUpdatesSecretsVersionAndRole(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "key-2025"}, StringData: map[string]string{"secret": "whsec_b2xkb2xkb2xkb2xkb2xkb2xkb2xkb2xk"}})
	create(t, endpoint(ns, "billing", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Signing = &v1alpha1.SigningSpec{SecretRef: v1alpha1.SecretKeySelector{Name: "key-2025", Key: "secret"}}
	}))
	markAvailable(t, ns, "webhook-dispatcher")
	ep := eventuallyReady(t, ns, "billing", "True/Ready")
	v1 := ep.Status.SecretsVersion
	template := deploymentTemplate(g, ns, "webhook-dispatcher")

	// New contents, same name.
	s := &corev1.Secret{}
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "key-2025"}, s)).To(Succeed())
	s.Data["secret"] = []byte("whsec_bmV3bmV3bmV3bmV3bmV3bmV3bmV3bmV3")
	g.Expect(k8s.Update(ctx, s)).To(Succeed())
	var v2 string
	g.Eventually(func(g Gomega) {
		v2 = getEndpoint(g, ns, "billing").Status.SecretsVersion
		g.Expect(v2).NotTo(Equal(v1))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	// A new secret, the old one kept as previous during the overlap.
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "key-2026"}, StringData: map[string]string{"secret": "whsec_MjAyNjIwMjYyMDI2MjAyNjIwMjYyMDI2"}})
	updateEndpoint(t, ns, "billing", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Signing.PreviousSecretRef = &v1alpha1.SecretKeySelector{Name: "key-2025", Key: "secret"}
		ep.Spec.Signing.SecretRef.Name = "key-2026"
	})
	g.Eventually(func(g Gomega) {
		role := &rbacv1.Role{}
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, role)).To(Succeed())
		g.Expect(secretNames(role)).To(Equal([]string{"key-2025", "key-2026"}))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	ep = eventuallyReady(t, ns, "billing", "True/Ready")
	g.Expect(ep.Status.SigningSecretName).To(Equal("key-2026"))
	g.Expect(ep.Status.SecretsVersion).NotTo(BeElementOf(v1, v2))

	// The overlap ends: only the new one remains readable.
	updateEndpoint(t, ns, "billing", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Signing.PreviousSecretRef = nil })
	g.Eventually(func(g Gomega) {
		role := &rbacv1.Role{}
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, role)).To(Succeed())
		g.Expect(secretNames(role)).To(Equal([]string{"key-2026"}))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(deploymentTemplate(g, ns, "webhook-dispatcher")).To(Equal(template), "rotation must not roll the dispatcher")
}

// updateEndpoint changes an endpoint, retrying when the controller's status writes race it.
func updateEndpoint(t *testing.T, ns, name string, change func(*v1alpha1.WebhookEndpoint)) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) {
		ep := getEndpoint(g, ns, name)
		change(ep)
		g.Expect(k8s.Update(context.Background(), ep)).To(Succeed())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

func ptr[T any](v T) *T { return &v }

func durations(ds ...string) []metav1.Duration {
	out := make([]metav1.Duration, len(ds))
	for i, d := range ds {
		if err := out[i].UnmarshalJSON([]byte(`"` + d + `"`)); err != nil {
			panic(err)
		}
	}
	return out
}
