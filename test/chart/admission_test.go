package chart

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/kube"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

const (
	refusedCreate = "webhook-operator's controller may only create or update objects labelled app.kubernetes.io/managed-by=webhook-operator"
	refusedChange = "webhook-operator's controller may only change or delete objects labelled app.kubernetes.io/managed-by=webhook-operator"
)

// The chart's ValidatingAdmissionPolicy, applied to a real API server, keeps the controller's
// ServiceAccount to the objects labelled as the operator's. Acting as that ServiceAccount (with
// cluster-admin, so that only the policy can refuse): an unlabelled Deployment,
// ServiceAccount, Role, RoleBinding, ConfigMap, Secret or NetworkPolicy is refused, a labelled
// one allowed; an object someone else made can be neither changed, nor made its own by adding
// the label, nor deleted; its own cannot lose the label. Other users are not affected.
func TestAdmissionPolicyKeepsTheControllerToItsObjects(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	cp, err := testenv.StartControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	ctx := context.Background()
	admin := cp.Client
	r := render(t, "")
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if err := admin.Create(ctx, r.must(t, kind, controllerName)); err != nil {
			t.Fatal(err)
		}
	}
	const ns = "tenant"
	sa := "system:serviceaccount:" + releaseNamespace + ":" + controllerName
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "controller-as-admin"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: releaseNamespace, Name: controllerName}}},
	} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate.UserName = sa
	as, err := client.New(cfg, client.Options{Scheme: kube.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	// The policy takes effect once the API server has loaded it.
	testenv.Eventually(t, 30*time.Second, func() error {
		return refused(as.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"}}, client.DryRunAll), refusedCreate)
	}, "the policy to refuse an unlabelled ConfigMap")

	ours := map[string]string{"app.kubernetes.io/managed-by": "webhook-operator"}
	objects := func(name string, labels map[string]string) []client.Object {
		m := metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}
		sel := map[string]string{"app": name}
		return []client.Object{
			&corev1.ConfigMap{ObjectMeta: m},
			&corev1.Secret{ObjectMeta: m},
			&corev1.ServiceAccount{ObjectMeta: m},
			&rbacv1.Role{ObjectMeta: m},
			&rbacv1.RoleBinding{ObjectMeta: m, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}},
			&networkingv1.NetworkPolicy{ObjectMeta: m},
			&appsv1.Deployment{ObjectMeta: m, Spec: appsv1.DeploymentSpec{
				Selector: &metav1.LabelSelector{MatchLabels: sel},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/c"}}}}}},
		}
	}
	for _, o := range objects("unlabelled", map[string]string{"app.kubernetes.io/managed-by": "someone-else"}) {
		if err := refused(as.Create(ctx, o), refusedCreate); err != nil {
			t.Errorf("create %T: %v", o, err)
		}
	}
	for _, o := range objects("ours", ours) {
		if err := as.Create(ctx, o); err != nil {
			t.Errorf("create labelled %T: %v", o, err)
		}
	}

	// A tenant's Secret: not the controller's to change, adopt or delete.
	theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "theirs"}, StringData: map[string]string{"k": "v"}}
	if err := admin.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	adopt := theirs.DeepCopy()
	adopt.Labels = ours
	if err := refused(as.Update(ctx, adopt), refusedChange); err != nil {
		t.Errorf("adopting a tenant's Secret by labelling it: %v", err)
	}
	if err := refused(as.Delete(ctx, theirs), refusedChange); err != nil {
		t.Errorf("deleting a tenant's Secret: %v", err)
	}

	// Its own objects: changed while labelled, never unlabelled; deleted.
	cm := &corev1.ConfigMap{}
	if err := as.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ours"}, cm); err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{"k": "v"}
	if err := as.Update(ctx, cm); err != nil {
		t.Errorf("updating its own ConfigMap: %v", err)
	}
	cm.Labels = nil
	if err := refused(as.Update(ctx, cm), refusedCreate); err != nil {
		t.Errorf("removing its own label: %v", err)
	}
	for _, o := range objects("ours", nil) {
		if err := as.Delete(ctx, o); err != nil {
			t.Errorf("deleting its own %T: %v", o, err)
		}
	}

	// Anyone else is not affected.
	if err := admin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "admins"}}); err != nil {
		t.Errorf("another user creating an unlabelled ConfigMap: %v", err)
	}
}

// refused checks that err is the API server's Forbidden with message want.
func refused(err error, want string) error {
	switch {
	case err == nil:
		return errAllowed
	case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want):
		return err
	}
	return nil
}

var errAllowed = errors.New("allowed, want refused by the admission policy")
