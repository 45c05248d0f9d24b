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

	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// What the chart's ValidatingAdmissionPolicy says when it refuses the controller.
const (
	refusedCreate    = "webhook-operator's controller may only create or update objects labelled app.kubernetes.io/managed-by=webhook-operator"
	refusedChange    = "webhook-operator's controller may only change or delete objects labelled app.kubernetes.io/managed-by=webhook-operator"
	refusedExcluded  = "webhook-operator's controller may not create or change objects in the installation's excluded namespaces (kube-system, kube-public, kube-node-lease, " + releaseNamespace + ")"
	refusedName      = "webhook-operator's controller may only create or change a dispatcher's objects, named webhook-dispatcher or webhook-dispatcher-<endpoint>"
	refusedConfigMap = "webhook-operator's controller may only create or change the ConfigMaps named webhook-operator-streams"
	refusedPodSA     = "webhook-operator's controller may only run a dispatcher's pods as the ServiceAccount it made for that dispatcher"
	refusedHost      = "webhook-operator's controller may not give a dispatcher's pods host namespaces, host paths or privileged containers"
	refusedToken     = "webhook-operator's controller may not create or change Secrets of type kubernetes.io/service-account-token"
	refusedRole      = "webhook-operator's controller may only grant a dispatcher's Role what a dispatcher needs"
	refusedBinding   = "webhook-operator's controller may only bind the dispatcher Role it made to the dispatcher's ServiceAccount"
)

// ours is the label the controller sets on everything it makes.
var ours = map[string]string{"app.kubernetes.io/managed-by": "webhook-operator"}

// The chart's ValidatingAdmissionPolicy, applied to a real API server, keeps the controller's
// ServiceAccount to the objects it makes. Acting as that ServiceAccount (with cluster-admin, so
// that only the policy can refuse):
//   - an unlabelled object is refused, a labelled one of the shape the controller makes
//     allowed; an object someone else made can be neither changed, nor made its own by adding
//     the label, nor deleted; its own cannot lose the label;
//   - nothing is created or changed in an excluded namespace (kube-system, the release's), but
//     what it made there earlier can be deleted;
//   - a dispatcher's Deployment runs its pods only as the ServiceAccount of its own name,
//     without host namespaces, host paths or privileged containers; a Role grants only what a
//     dispatcher needs; a RoleBinding binds only the Role of its own name to the ServiceAccount
//     of its own name; no ServiceAccount token Secret; a dispatcher's objects are named as
//     dispatchers, ConfigMaps as the streams ConfigMap;
//   - other users are not affected.
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
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: releaseNamespace}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "controller-as-admin"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: releaseNamespace, Name: controllerName}}},
	} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	as := impersonate(t, cp.Config, "system:serviceaccount:"+releaseNamespace+":"+controllerName)

	// The policy takes effect once the API server has loaded it.
	testenv.Eventually(t, 30*time.Second, func() error {
		return refused(as.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"}}, client.DryRunAll), refusedCreate)
	}, "the policy refusing an unlabelled ConfigMap")

	for _, o := range dispatcherObjects(ns, map[string]string{"app.kubernetes.io/managed-by": "someone-else"}) {
		if err := refused(as.Create(ctx, o), refusedCreate); err != nil {
			t.Errorf("create unlabelled %T: %v", o, err)
		}
	}
	for _, o := range dispatcherObjects(ns, ours) {
		if err := as.Create(ctx, o); err != nil {
			t.Errorf("create labelled %T: %v", o, err)
		}
	}

	// Not in an excluded namespace, however labelled; what it made there before can go.
	for _, excluded := range []string{"kube-system", releaseNamespace} {
		for _, o := range dispatcherObjects(excluded, ours) {
			if err := refused(as.Create(ctx, o), refusedExcluded); err != nil {
				t.Errorf("create %T in %s: %v", o, excluded, err)
			}
		}
	}
	left := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "webhook-dispatcher", Labels: ours}}
	if err := admin.Create(ctx, left); err != nil {
		t.Fatal(err)
	}
	if err := as.Delete(ctx, left); err != nil {
		t.Errorf("deleting its dispatcher's ServiceAccount left in a namespace excluded since: %v", err)
	}

	// Pods run as the dispatcher's own ServiceAccount, and reach nothing of the node.
	for name, change := range map[string]func(*corev1.PodSpec){
		"another ServiceAccount": func(p *corev1.PodSpec) { p.ServiceAccountName = "default" },
		"no ServiceAccount":      func(p *corev1.PodSpec) { p.ServiceAccountName = "" },
		// The API server defaults the deprecated serviceAccount to serviceAccountName and the
		// other way round: the policy sees the one the pods run as.
		"only the deprecated field's": func(p *corev1.PodSpec) { p.ServiceAccountName, p.DeprecatedServiceAccount = "", "admin" },
	} {
		d := dispatcherDeployment(ns, "webhook-dispatcher-sa", ours)
		change(&d.Spec.Template.Spec)
		if err := refused(as.Create(ctx, d), refusedPodSA); err != nil {
			t.Errorf("a Deployment with %s: %v", name, err)
		}
	}
	privileged := true
	for name, change := range map[string]func(*corev1.PodSpec){
		"host network": func(p *corev1.PodSpec) { p.HostNetwork = true },
		"host PID":     func(p *corev1.PodSpec) { p.HostPID = true },
		"host path": func(p *corev1.PodSpec) {
			p.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
		},
		"a privileged container": func(p *corev1.PodSpec) {
			p.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged}
		},
		"a privileged init container": func(p *corev1.PodSpec) {
			p.InitContainers = []corev1.Container{{Name: "i", Image: "registry.example/i", SecurityContext: &corev1.SecurityContext{Privileged: &privileged}}}
		},
	} {
		d := dispatcherDeployment(ns, "webhook-dispatcher-host", ours)
		change(&d.Spec.Template.Spec)
		if err := refused(as.Create(ctx, d), refusedHost); err != nil {
			t.Errorf("a Deployment with %s: %v", name, err)
		}
	}
	// Nor by changing its own Deployment.
	d := &appsv1.Deployment{}
	if err := as.Get(ctx, client.ObjectKey{Namespace: ns, Name: "webhook-dispatcher"}, d); err != nil {
		t.Fatal(err)
	}
	d.Spec.Template.Spec.ServiceAccountName = "default"
	if err := refused(as.Update(ctx, d), refusedPodSA); err != nil {
		t.Errorf("moving its dispatcher to another ServiceAccount: %v", err)
	}

	// No ServiceAccount token, for any ServiceAccount.
	token := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhook-dispatcher-token", Labels: ours,
		Annotations: map[string]string{corev1.ServiceAccountNameKey: "webhook-dispatcher"}}, Type: corev1.SecretTypeServiceAccountToken}
	if err := refused(as.Create(ctx, token), refusedToken); err != nil {
		t.Errorf("a ServiceAccount token Secret: %v", err)
	}

	// A RoleBinding binds its own Role to its own ServiceAccount, nothing else.
	for name, change := range map[string]func(*rbacv1.RoleBinding){
		"cluster-admin": func(b *rbacv1.RoleBinding) {
			b.RoleRef = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"}
		},
		"another Role":               func(b *rbacv1.RoleBinding) { b.RoleRef.Name = "admin" },
		"another ServiceAccount":     func(b *rbacv1.RoleBinding) { b.Subjects[0].Name = "default" },
		"a ServiceAccount elsewhere": func(b *rbacv1.RoleBinding) { b.Subjects[0].Namespace = "kube-system" },
		"a user besides": func(b *rbacv1.RoleBinding) {
			b.Subjects = append(b.Subjects, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"})
		},
		"a group": func(b *rbacv1.RoleBinding) {
			b.Subjects[0] = rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}
		},
		"no subject (nothing to bind)": func(b *rbacv1.RoleBinding) { b.Subjects = nil },
	} {
		b := dispatcherRoleBinding(ns, "webhook-dispatcher-rb", ours)
		change(b)
		if err := refused(as.Create(ctx, b), refusedBinding); err != nil {
			t.Errorf("a RoleBinding to %s: %v", name, err)
		}
	}

	// A Role grants what a dispatcher needs and no more.
	for name, rule := range map[string]rbacv1.PolicyRule{
		"everything":             {APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}},
		"every Secret":           {APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}},
		"listing Secrets":        {APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list"}, ResourceNames: []string{"s"}},
		"pods":                   {APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}},
		"changing endpoints":     {APIGroups: []string{"webhook-operator.io"}, Resources: []string{"webhookendpoints"}, Verbs: []string{"update"}},
		"impersonation":          {APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"impersonate"}},
		"events in another kind": {APIGroups: []string{"apps"}, Resources: []string{"events"}, Verbs: []string{"create"}},
	} {
		role := dispatcherRole(ns, "webhook-dispatcher-role", ours)
		role.Rules = append(role.Rules, rule)
		if err := refused(as.Create(ctx, role), refusedRole); err != nil {
			t.Errorf("a Role granting %s: %v", name, err)
		}
	}

	// A dispatcher's objects are named as dispatchers; ConfigMaps are the streams ConfigMap.
	for _, o := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "builder", Labels: ours}},
		dispatcherDeployment(ns, "builder", ours),
	} {
		if err := refused(as.Create(ctx, o), refusedName); err != nil {
			t.Errorf("create %T named builder: %v", o, err)
		}
	}
	if err := refused(as.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settings", Labels: ours}}), refusedConfigMap); err != nil {
		t.Errorf("create a ConfigMap of another name: %v", err)
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
	if err := as.Get(ctx, client.ObjectKey{Namespace: ns, Name: "webhook-operator-streams"}, cm); err != nil {
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
	for _, o := range dispatcherObjects(ns, nil) {
		if err := as.Delete(ctx, o); err != nil {
			t.Errorf("deleting its own %T: %v", o, err)
		}
	}

	// Anyone else is not affected.
	if err := admin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "admins"}}); err != nil {
		t.Errorf("another user creating an unlabelled ConfigMap in kube-system: %v", err)
	}
	if err := admin.Create(ctx, dispatcherDeployment(ns, "admins", nil)); err != nil {
		t.Errorf("another user creating a Deployment of any name: %v", err)
	}
}

// impersonate is a client acting as user.
func impersonate(t *testing.T, config *rest.Config, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(config)
	cfg.Impersonate.UserName = user
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dispatcherObjects are the objects the controller makes for a namespace's shared dispatcher,
// as it makes them (named webhook-dispatcher, its pods running as its ServiceAccount), with
// labels.
func dispatcherObjects(ns string, labels map[string]string) []client.Object {
	const name = "webhook-dispatcher"
	m := metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}
	return []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhook-operator-streams", Labels: labels}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhook-dispatcher-nats", Labels: labels}, Type: corev1.SecretTypeOpaque},
		&corev1.ServiceAccount{ObjectMeta: m},
		dispatcherRole(ns, name, labels),
		dispatcherRoleBinding(ns, name, labels),
		&networkingv1.NetworkPolicy{ObjectMeta: m},
		dispatcherDeployment(ns, name, labels),
	}
}

func dispatcherDeployment(ns, name string, labels map[string]string) *appsv1.Deployment {
	sel := map[string]string{"app": name}
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: sel},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
			Spec: corev1.PodSpec{ServiceAccountName: name, Containers: []corev1.Container{{Name: "dispatcher", Image: "registry.example/webhook-operator"}}}}}}
}

// dispatcherRole grants what the controller grants a dispatcher.
func dispatcherRole(ns, name string, labels map[string]string) *rbacv1.Role {
	return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"webhook-operator.io"}, Resources: []string{"webhookendpoints", "retrypolicies"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"webhook-operator.io"}, Resources: []string{"webhookendpoints/status"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{"orders-signing"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}}
}

func dispatcherRoleBinding(ns, name string, labels map[string]string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}
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
