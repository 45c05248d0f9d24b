package controllers_test

import (
	"context"
	"maps"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// An endpoint in a namespace the installation excludes (kube-system and the like) or in the
// operator's own namespace is Stalled NamespaceExcluded and gets nothing: no finalizer, no
// dispatcher, ServiceAccount, Role, signing Secret or streams ConfigMap, no consumer.
func TestEndpointInAnExcludedNamespaceGetsNothing(t *testing.T) {
	ctx := context.Background()
	for _, ns := range []string{"kube-system", credsRef.Namespace} {
		t.Run(ns, func(t *testing.T) {
			create(t, endpoint(ns, "excluded"))
			t.Cleanup(func() { _ = k8s.Delete(ctx, endpoint(ns, "excluded")) })
			ep := eventuallyReady(t, ns, "excluded", "False/"+v1alpha1.ReasonNamespaceExcluded)
			stalled := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionStalled)
			if stalled == nil || stalled.Status != "True" || stalled.Reason != v1alpha1.ReasonNamespaceExcluded {
				t.Errorf("Stalled %+v, want True/%s", stalled, v1alpha1.ReasonNamespaceExcluded)
			}
			if len(ep.Finalizers) != 0 {
				t.Errorf("finalizers %v on an endpoint nothing is made for", ep.Finalizers)
			}
			ours := client.MatchingLabels{names.LabelManagedBy: names.LabelManagedByValue}
			g := NewWithT(t)
			g.Consistently(func(g Gomega) {
				for _, list := range []client.ObjectList{&appsv1.DeploymentList{}, &corev1.ServiceAccountList{}, &rbacv1.RoleList{},
					&rbacv1.RoleBindingList{}, &corev1.SecretList{}, &corev1.ConfigMapList{}} {
					g.Expect(k8s.List(ctx, list, client.InNamespace(ns), ours)).To(Succeed())
					g.Expect(meta.LenList(list)).To(BeZero(), "%T made in %s", list, ns)
				}
				g.Expect(consumerNames(g, layout.For(ns).EventsStream())).To(BeEmpty())
			}).WithTimeout(3 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		})
	}
}

// The controller reads tenants' Secrets by metadata only, and its cache keeps of that
// metadata only what it reads: its labels and the annotations of consent, not the copy of the
// whole Secret that `kubectl apply` leaves in kubectl.kubernetes.io/last-applied-configuration.
// A Secret read whole through the cache would have no data either.
func TestControllerCacheHoldsNoSecretData(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	applied := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"api-key","namespace":"` + ns + `"},"stringData":{"key":"s3cret-value"}}`
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api-key", Labels: map[string]string{"team": "shop"},
		Annotations: map[string]string{corev1.LastAppliedConfigAnnotation: applied, consent.AllowedEndpoints: "orders", "note": "rotate monthly"}},
		StringData: map[string]string{"key": "s3cret-value"}}
	create(t, s)
	key := client.ObjectKeyFromObject(s)
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	testenv.Eventually(t, timeout, func() error { return ctrlCache.Get(ctx, key, m) }, "the Secret in the controller's cache")
	if want := map[string]string{consent.AllowedEndpoints: "orders"}; !maps.Equal(m.Annotations, want) {
		t.Errorf("cached annotations %v, want %v", m.Annotations, want)
	}
	if m.Labels["team"] != "shop" {
		t.Errorf("cached labels %v", m.Labels)
	}
	whole := &corev1.Secret{}
	testenv.Eventually(t, timeout, func() error { return ctrlCache.Get(ctx, key, whole) }, "the Secret read whole through the controller's cache")
	if len(whole.Data) != 0 || len(whole.Annotations) != 1 {
		t.Errorf("the controller's cache holds a Secret's data: %v, annotations %v", whole.Data, whole.Annotations)
	}
}
