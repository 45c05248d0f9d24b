package controllers_test

import (
	"context"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/names"
)

// Dispatchers check the scrapers of their /metrics with TokenReviews and SubjectAccessReviews:
// the controller adds each dispatcher's ServiceAccount to the one ClusterRoleBinding installed
// for that (and removes it with the dispatcher), so a dispatcher may create both and another
// ServiceAccount of its namespace may not. The controller itself may change that binding and
// no other, and create none.
//
// The dispatcher labels prove nothing, a tenant may set them: ServiceAccounts a tenant made
// with them, in a namespace with endpoints or without, get no subject.
func TestDispatcherMetricsAccess(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns, elsewhere := newNamespace(t), newNamespace(t)
	// A tenant's ServiceAccounts with every label of the namespace's dispatcher (a labelled
	// one of a dispatcher that does not exist is deleted as a leftover; these are not), made
	// before the endpoint, so the reconcile that adds the dispatcher sees them.
	labelled := func(ns, name string) *corev1.ServiceAccount {
		return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			names.LabelName: names.LabelNameValue, names.LabelManagedBy: names.LabelManagedByValue, names.LabelDispatcher: names.SharedDispatcher}}}
	}
	forged := []*corev1.ServiceAccount{labelled(ns, "builder"), labelled(elsewhere, "helper")}
	for _, sa := range forged {
		create(t, sa)
	}
	create(t, endpoint(ns, "orders"))
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "webhook-dispatcher"}
	subjects := func(g Gomega) []rbacv1.Subject {
		crb := &rbacv1.ClusterRoleBinding{}
		g.Expect(k8s.Get(ctx, types.NamespacedName{Name: controllers.DispatcherMetricsBinding}, crb)).To(Succeed())
		return crb.Subjects
	}
	g.Eventually(func(g Gomega) {
		g.Expect(slices.Contains(subjects(g), sa)).To(BeTrue())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	for _, f := range forged {
		s := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: f.Namespace, Name: f.Name}
		g.Expect(slices.Contains(subjects(g), s)).To(BeFalse(), "a tenant's labelled ServiceAccount %s/%s is bound", f.Namespace, f.Name)
	}

	review := func(user string) (error, error) {
		as := impersonate(t, user)
		tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "x"}}
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "someone",
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}}}
		return as.Create(ctx, tr), as.Create(ctx, sar)
	}
	trErr, sarErr := review("system:serviceaccount:" + ns + ":webhook-dispatcher")
	g.Expect(trErr).NotTo(HaveOccurred())
	g.Expect(sarErr).NotTo(HaveOccurred())
	trErr, sarErr = review("system:serviceaccount:" + ns + ":default")
	g.Expect(trErr).To(MatchError(ContainSubstring("forbidden")))
	g.Expect(sarErr).To(MatchError(ContainSubstring("forbidden")))

	// The controller: this binding only, no new ones.
	ctrlUser := impersonate(t, "webhook-operator-controller")
	g.Expect(ctrlUser.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "grab"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: controllers.DispatcherMetricsBinding}})).
		To(MatchError(ContainSubstring("forbidden")))
	g.Expect(ctrlUser.Get(ctx, types.NamespacedName{Name: "webhook-operator-controller"}, &rbacv1.ClusterRoleBinding{})).
		To(MatchError(ContainSubstring("forbidden")))

	// The dispatcher goes with its last endpoint, and its subject with it.
	g.Expect(k8s.Delete(ctx, endpoint(ns, "orders"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(slices.Contains(subjects(g), sa)).To(BeFalse())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}
