package controllers_test

import (
	"context"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/webhook-operator/webhook-operator/controllers"
)

// Dispatchers check the scrapers of their /metrics with TokenReviews and SubjectAccessReviews:
// the controller adds each dispatcher's ServiceAccount to the one ClusterRoleBinding installed
// for that (and removes it with the dispatcher), so a dispatcher may create both and another
// ServiceAccount of its namespace may not. The controller itself may change that binding and
// no other, and create none.
func TestDispatcherMetricsAccess(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
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
