package chart

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// What the chart's ValidatingAdmissionPolicy says when it refuses the controller.
const (
	refusedCreate    = "webhook-operator's controller may only create or update objects labelled app.kubernetes.io/managed-by=webhook-operator"
	refusedChange    = "webhook-operator's controller may only change or delete objects labelled app.kubernetes.io/managed-by=webhook-operator"
	refusedExcluded  = "webhook-operator's controller may not create or change objects in the installation's excluded namespaces (kube-system, kube-public, kube-node-lease, " + releaseNamespace + ")"
	refusedName      = "webhook-operator's controller may only create or change a dispatcher's objects, named webhook-dispatcher, webhook-dispatcher-<endpoint> or webhook-shared-dispatcher"
	refusedConfigMap = "webhook-operator's controller may only create or change the ConfigMaps named webhook-operator-streams"
	refusedPodSA     = "webhook-operator's controller may only run a dispatcher's pods as the ServiceAccount it made for that dispatcher"
	refusedHost      = "webhook-operator's controller may not give a dispatcher's pods host namespaces, host ports, host paths or privileged containers"
	refusedSelector  = "webhook-operator's controller may only select and label a dispatcher's pods as that dispatcher's"
	refusedImage     = "webhook-operator's controller may only run a dispatcher's one container, named dispatcher, of the installation's image"
	refusedSecurity  = "webhook-operator's controller may only run a dispatcher's pods as it makes them"
	refusedVolumes   = "webhook-operator's controller may only give a dispatcher's pods the volumes and environment it makes"
	refusedPlacement = "webhook-operator's controller may not give a dispatcher's pods lifecycle hooks, probes that run commands or reach other hosts"
	refusedNetPol    = "webhook-operator's controller may only write a NetworkPolicy that limits the egress of the pods of the dispatcher of its own name"
	refusedScaled    = "webhook-operator's controller may only write a ScaledObject that scales the Deployment of its own name"
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
//     what it made there earlier can be deleted; in the release's, the shared dispatcher's
//     objects and mirrors only; its token grant in a tenant namespace is of the dispatcher
//     ServiceAccount's tokens only, to the shared dispatcher of the release namespace only;
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
	ctx := context.Background()
	admin, as, ns := policyUnderTest(t)

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

	// Not in an excluded namespace, however labelled; what it made there before can go. In its
	// own namespace, the shared dispatcher's objects and the mirrors its pods mount only.
	for _, excluded := range []string{"kube-system", releaseNamespace} {
		for _, o := range dispatcherObjects(excluded, ours) {
			if _, mirror := o.(*corev1.Secret); mirror && excluded == releaseNamespace {
				continue
			}
			if err := refused(as.Create(ctx, o), refusedExcluded); err != nil {
				t.Errorf("create %T in %s: %v", o, excluded, err)
			}
		}
	}
	for _, o := range poolObjects(releaseNamespace, ours) {
		if err := as.Create(ctx, o); err != nil {
			t.Errorf("create the shared dispatcher's %T in %s: %v", o, releaseNamespace, err)
		}
	}
	for _, o := range poolObjects("kube-system", ours) {
		if err := refused(as.Create(ctx, o), refusedExcluded); err != nil {
			t.Errorf("create the shared dispatcher's %T in kube-system: %v", o, err)
		}
	}
	grant, grantBinding := poolGrant(ns, ours)
	for _, o := range []client.Object{grant, grantBinding} {
		if err := as.Create(ctx, o); err != nil {
			t.Errorf("create the shared dispatcher's token grant (%T) in %s: %v", o, ns, err)
		}
	}
	// The grant is of the dispatcher ServiceAccount's tokens only, to the shared dispatcher of
	// the controller's namespace only; the shared dispatcher's ConfigMap and Role are for the
	// controller's namespace only.
	other, _ := poolGrant(ns, ours)
	other.Name = "webhook-dispatcher-x"
	other.Rules[0].ResourceNames = []string{"builder"}
	if err := refused(as.Create(ctx, other), refusedRole); err != nil {
		t.Errorf("a Role granting the tokens of another ServiceAccount: %v", err)
	}
	_, elsewhere := poolGrant(ns, ours)
	elsewhere.Namespace, elsewhere.Subjects[0].Namespace = "default", "kube-system"
	if err := refused(as.Create(ctx, elsewhere), refusedBinding); err != nil {
		t.Errorf("a RoleBinding of the token grant to a ServiceAccount of another namespace: %v", err)
	}
	if err := refused(as.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhook-shared-dispatcher", Labels: ours}}), refusedConfigMap); err != nil {
		t.Errorf("create the shared dispatcher's ConfigMap in a tenant namespace: %v", err)
	}
	if err := refused(as.Create(ctx, poolObjects(ns, ours)[2]), refusedRole); err != nil {
		t.Errorf("create the shared dispatcher's Role in a tenant namespace: %v", err)
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
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
		},
		"a privileged container": func(p *corev1.PodSpec) {
			p.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged}
		},
	} {
		d := dispatcherDeployment(ns, "webhook-dispatcher-host", ours)
		change(&d.Spec.Template.Spec)
		if err := refused(as.Create(ctx, d), refusedHost); err != nil {
			t.Errorf("a Deployment with %s: %v", name, err)
		}
	}
	// An init container, privileged or not, is no dispatcher's.
	d := dispatcherDeployment(ns, "webhook-dispatcher-init", ours)
	d.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "i", Image: "registry.example/i", SecurityContext: &corev1.SecurityContext{Privileged: &privileged}}}
	if err := refused(as.Create(ctx, d), refusedImage); err != nil {
		t.Errorf("a Deployment with a privileged init container: %v", err)
	}
	// Nor by changing its own Deployment.
	d = &appsv1.Deployment{}
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

// The chart's policy pins a dispatcher's Deployment, NetworkPolicy and ScaledObject to the shape
// the controller makes, against a real API server, acting as the controller's ServiceAccount
// with cluster-admin: each of those objects as the controller writes them is allowed (created
// and updated), and each one that deviates from it in one way is refused with the rule's
// message, whether created or changed from the controller's own.
func TestAdmissionPolicyPinsTheDispatchersObjects(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	ctx := context.Background()
	_, as, ns := policyUnderTest(t)

	const name = "webhook-dispatcher-orders"
	own := []client.Object{dispatcherDeployment(ns, name, ours), dispatcherNetworkPolicy(ns, name, ours), dispatcherScaledObject(ns, name, ours)}
	for _, o := range own {
		if err := as.Create(ctx, o); err != nil {
			t.Fatalf("the controller's own %T: %v", o, err)
		}
		if err := as.Update(ctx, o); err != nil {
			t.Fatalf("updating the controller's own %T: %v", o, err)
		}
	}

	yes, no := true, false
	root := int64(0)
	tenantSecret := corev1.LocalObjectReference{Name: "database"}
	for what, c := range map[string]struct {
		change func(*corev1.PodSpec, *appsv1.Deployment)
		want   string
	}{
		"another image": {func(p *corev1.PodSpec, _ *appsv1.Deployment) { p.Containers[0].Image = "registry.example/miner:1" }, refusedImage},
		"a command": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Containers[0].Command = []string{"/bin/sh", "-c", "id"}
		}, refusedImage},
		"arguments of another command": {func(p *corev1.PodSpec, _ *appsv1.Deployment) { p.Containers[0].Args = []string{"controller"} }, refusedImage},
		"a second container": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Containers = append(p.Containers, corev1.Container{Name: "side", Image: dispatcherImage()})
		}, refusedImage},
		"another container name": {func(p *corev1.PodSpec, _ *appsv1.Deployment) { p.Containers[0].Name = "worker" }, refusedImage},
		"an init container": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.InitContainers = []corev1.Container{{Name: "i", Image: dispatcherImage()}}
		}, refusedImage},
		"an added capability": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		}, refusedSecurity},
		"capabilities not dropped": {func(p *corev1.PodSpec, _ *appsv1.Deployment) { p.Containers[0].SecurityContext.Capabilities = nil }, refusedSecurity},
		"privilege escalation": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Containers[0].SecurityContext.AllowPrivilegeEscalation = &yes
		}, refusedSecurity},
		"an unconfined seccomp profile": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}, refusedSecurity},
		"an unconfined container": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Containers[0].SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}, refusedSecurity},
		"root": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.SecurityContext.RunAsNonRoot, p.Containers[0].SecurityContext.RunAsNonRoot = &no, nil
		}, refusedSecurity},
		"user 0": {func(p *corev1.PodSpec, _ *appsv1.Deployment) { p.Containers[0].SecurityContext.RunAsUser = &root }, refusedSecurity},
		"a sysctl": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.SecurityContext.Sysctls = []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}}
		}, refusedSecurity},
		"a host port":                   {func(p *corev1.PodSpec, _ *appsv1.Deployment) { p.Containers[0].Ports[0].HostPort = 8080 }, refusedHost},
		"a tenant's Secret as a volume": {func(p *corev1.PodSpec, _ *appsv1.Deployment) { p.Volumes[0].Secret.SecretName = tenantSecret.Name }, refusedVolumes},
		"an emptyDir": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		}, refusedVolumes},
		"a projected Secret": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Volumes[1].Projected.Sources = append(p.Volumes[1].Projected.Sources, corev1.VolumeProjection{Secret: &corev1.SecretProjection{LocalObjectReference: tenantSecret}})
		}, refusedVolumes},
		"a tenant's Secret in a variable": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Containers[0].Env[2].ValueFrom.SecretKeyRef.Name = tenantSecret.Name
		}, refusedVolumes},
		"variables from a Secret": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: tenantSecret}}}
		}, refusedVolumes},
		"a probe that runs a command": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Containers[0].LivenessProbe.ProbeHandler = corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"id"}}}
		}, refusedPlacement},
		"a probe of another host": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Containers[0].ReadinessProbe.HTTPGet.Host = "169.254.169.254"
		}, refusedPlacement},
		"a lifecycle hook": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Containers[0].Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Host: "10.0.0.1", Port: intstr.FromInt32(80)}}}
		}, refusedPlacement},
		"a node": {func(p *corev1.PodSpec, _ *appsv1.Deployment) { p.NodeName = "control-plane-1" }, refusedPlacement},
		"a toleration": {func(p *corev1.PodSpec, _ *appsv1.Deployment) {
			p.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		}, refusedPlacement},
		"a runtime class": {func(p *corev1.PodSpec, _ *appsv1.Deployment) { rc := "unsandboxed"; p.RuntimeClassName = &rc }, refusedPlacement},
		"pods labelled as a tenant's": {func(p *corev1.PodSpec, d *appsv1.Deployment) {
			d.Spec.Template.Labels["app"] = "checkout"
		}, refusedSelector},
		"another dispatcher's pods": {func(p *corev1.PodSpec, d *appsv1.Deployment) {
			d.Spec.Selector.MatchLabels = dispatcherSelector("webhook-dispatcher")
			d.Spec.Template.Labels = dispatcherSelector("webhook-dispatcher")
		}, refusedSelector},
	} {
		d := dispatcherDeployment(ns, "webhook-dispatcher-new", ours)
		c.change(&d.Spec.Template.Spec, d)
		if err := refused(as.Create(ctx, d), c.want); err != nil {
			t.Errorf("creating a dispatcher's Deployment with %s: %v", what, err)
		}
		live := &appsv1.Deployment{}
		if err := as.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, live); err != nil {
			t.Fatal(err)
		}
		if what == "another dispatcher's pods" {
			continue // a Deployment's selector cannot change
		}
		c.change(&live.Spec.Template.Spec, live)
		if err := refused(as.Update(ctx, live), c.want); err != nil {
			t.Errorf("changing its dispatcher's Deployment to %s: %v", what, err)
		}
	}

	for what, change := range map[string]func(*networkingv1.NetworkPolicy){
		"every pod of the namespace": func(np *networkingv1.NetworkPolicy) { np.Spec.PodSelector = metav1.LabelSelector{} },
		"a tenant's pods": func(np *networkingv1.NetworkPolicy) {
			np.Spec.PodSelector.MatchLabels = map[string]string{"app": "checkout"}
		},
		"another dispatcher's pods": func(np *networkingv1.NetworkPolicy) {
			np.Spec.PodSelector.MatchLabels = dispatcherSelector("webhook-dispatcher")
		},
		"pods matched by an expression besides": func(np *networkingv1.NetworkPolicy) {
			np.Spec.PodSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}
		},
		"ingress opened": func(np *networkingv1.NetworkPolicy) {
			np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
		},
	} {
		np := dispatcherNetworkPolicy(ns, "webhook-dispatcher-new", ours)
		change(np)
		if err := refused(as.Create(ctx, np), refusedNetPol); err != nil {
			t.Errorf("creating a NetworkPolicy for %s: %v", what, err)
		}
		live := &networkingv1.NetworkPolicy{}
		if err := as.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, live); err != nil {
			t.Fatal(err)
		}
		change(live)
		if err := refused(as.Update(ctx, live), refusedNetPol); err != nil {
			t.Errorf("changing its NetworkPolicy to %s: %v", what, err)
		}
	}

	for what, change := range map[string]func(*unstructured.Unstructured){
		"a tenant's Deployment": func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "checkout", "spec", "scaleTargetRef", "name")
		},
		"a StatefulSet of its name": func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "StatefulSet", "spec", "scaleTargetRef", "kind")
		},
		"a trigger of another type": func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedSlice(u.Object, []any{map[string]any{"type": "metrics-api", "metadata": map[string]any{"url": "https://attacker.example/"}}}, "spec", "triggers")
		},
		"a trigger with credentials": func(u *unstructured.Unstructured) {
			triggers, _, _ := unstructured.NestedSlice(u.Object, "spec", "triggers")
			triggers[0].(map[string]any)["authenticationRef"] = map[string]any{"name": "tenant-secrets"}
			_ = unstructured.SetNestedSlice(u.Object, triggers, "spec", "triggers")
		},
	} {
		so := dispatcherScaledObject(ns, "webhook-dispatcher-new", ours)
		change(so)
		if err := refused(as.Create(ctx, so), refusedScaled); err != nil {
			t.Errorf("creating a ScaledObject scaling %s: %v", what, err)
		}
		live := &unstructured.Unstructured{}
		live.SetGroupVersionKind(scaledObjectGVK)
		if err := as.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, live); err != nil {
			t.Fatal(err)
		}
		change(live)
		if err := refused(as.Update(ctx, live), refusedScaled); err != nil {
			t.Errorf("changing its ScaledObject to scale %s: %v", what, err)
		}
	}
}

// policyUnderTest starts a control plane serving KEDA's ScaledObject (a stand-in), applies the
// chart's ValidatingAdmissionPolicy to it and waits until it is in force; it returns the
// administrator's client, a client acting as the controller's ServiceAccount (with
// cluster-admin, so that only the policy can refuse) and a tenant namespace.
func policyUnderTest(t *testing.T) (admin, as client.Client, ns string) {
	t.Helper()
	cp, err := testenv.StartControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	if err := cp.InstallCRDs(testenv.StandInCRD(scaledObjectGVK, nil)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admin = cp.Client
	r := render(t, "")
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if err := admin.Create(ctx, r.must(t, kind, controllerName)); err != nil {
			t.Fatal(err)
		}
	}
	ns = "tenant"
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
	as = impersonate(t, cp.Config, "system:serviceaccount:"+releaseNamespace+":"+controllerName)

	// The policy takes effect once the API server has loaded it.
	testenv.Eventually(t, 30*time.Second, func() error {
		return refused(as.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "probe"}}, client.DryRunAll), refusedCreate)
	}, "the policy refusing an unlabelled ConfigMap")
	return admin, as, ns
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
		dispatcherNetworkPolicy(ns, name, labels),
		dispatcherDeployment(ns, name, labels),
		dispatcherScaledObject(ns, name, labels),
	}
}

// dispatcherImage is the image the chart's controller runs its dispatchers with by default:
// its own, of the chart's appVersion.
var dispatcherImage = sync.OnceValue(func() string {
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	b, err := os.ReadFile(filepath.Join(testenv.Root(), "charts", "webhook-operator", "Chart.yaml"))
	if err == nil {
		err = yaml.Unmarshal(b, &chart)
	}
	if err != nil || chart.AppVersion == "" {
		panic(fmt.Sprintf("reading the chart's appVersion: %v", err))
	}
	return "ghcr.io/webhook-operator/webhook-operator:" + chart.AppVersion
})

// dispatcherSelector are the labels that select the pods of dispatcher name.
func dispatcherSelector(name string) map[string]string {
	return map[string]string{"app.kubernetes.io/name": "webhook-dispatcher", "webhook-operator.io/dispatcher": name}
}

// dispatcherDeployment is a dispatcher's Deployment of the shape the controller makes
// (controllers/dispatcher_objects.go): its pods selected and labelled as its own, its
// ServiceAccount, one container of the installation's image, non-root, no privilege
// escalation, every capability dropped, RuntimeDefault seccomp, the NATS credentials and a
// projected token mounted, probes on its own port.
func dispatcherDeployment(ns, name string, labels map[string]string) *appsv1.Deployment {
	podLabels := dispatcherSelector(name)
	podLabels["app.kubernetes.io/managed-by"] = "webhook-operator"
	yes, no := true, false
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("probes")}}, PeriodSeconds: 10}
	}
	runtimeDefault := &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	expiration := int64(3600)
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: dispatcherSelector(name)},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
			Spec: corev1.PodSpec{
				ServiceAccountName: name,
				SecurityContext:    &corev1.PodSecurityContext{RunAsNonRoot: &yes, SeccompProfile: runtimeDefault},
				Volumes: []corev1.Volume{
					{Name: "nats", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "webhook-dispatcher-nats"}}},
					{Name: "nats-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
						{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "nats.webhook-operator.io", ExpirationSeconds: &expiration, Path: "token"}}}}}},
				},
				Containers: []corev1.Container{{
					Name:  "dispatcher",
					Image: dispatcherImage(),
					Args:  []string{"dispatcher", "--namespace=" + ns, "--metrics-bind-address=:8080", "--health-probe-bind-address=:8081"},
					Env: []corev1.EnvVar{
						{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
						{Name: "WEBHOOK_DISPATCHER_REPLICAS", Value: "1"},
						{Name: "NATS_PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
							LocalObjectReference: corev1.LocalObjectReference{Name: "webhook-dispatcher-nats"}, Key: "password"}}},
					},
					Ports:          []corev1.ContainerPort{{Name: "metrics", ContainerPort: 8080}, {Name: "probes", ContainerPort: 8081}},
					LivenessProbe:  probe("/healthz"),
					ReadinessProbe: probe("/readyz"),
					VolumeMounts: []corev1.VolumeMount{{Name: "nats", MountPath: "/etc/webhook-operator/nats", ReadOnly: true},
						{Name: "nats-token", MountPath: "/var/run/secrets/nats.webhook-operator.io", ReadOnly: true}},
					SecurityContext: &corev1.SecurityContext{RunAsNonRoot: &yes, ReadOnlyRootFilesystem: &yes, AllowPrivilegeEscalation: &no,
						Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, SeccompProfile: runtimeDefault},
				}},
			}}}}
}

// dispatcherNetworkPolicy limits the egress of dispatcher name's pods, as the controller's does.
func dispatcherNetworkPolicy(ns, name string, labels map[string]string) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: dispatcherSelector(name)},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress: []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp}},
			To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.0.0.0/8"}}}}}},
	}}
}

// scaledObjectGVK is KEDA's ScaledObject.
var scaledObjectGVK = schema.GroupVersionKind{Group: "keda.sh", Version: "v1alpha1", Kind: "ScaledObject"}

// dispatcherScaledObject scales dispatcher name's Deployment on one endpoint's consumer lag, as
// the controller's does.
func dispatcherScaledObject(ns, name string, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"scaleTargetRef":  map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
			"pollingInterval": int64(15), "minReplicaCount": int64(1), "maxReplicaCount": int64(10),
			"triggers": []any{map[string]any{"type": "nats-jetstream", "name": "events-orders", "metadata": map[string]any{
				"natsServerMonitoringEndpoint": "nats.nats.svc:8222", "account": "WEBHOOKS", "stream": "WEBHOOKS_" + ns,
				"consumer": "orders", "lagThreshold": "1000", "useHttps": "false"}}},
		},
	}}
	u.SetGroupVersionKind(scaledObjectGVK)
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(labels)
	return u
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

// poolObjects are the shared dispatcher's objects (--shared-dispatcher), as the controller makes
// them in its own namespace ns: its ConfigMap, ServiceAccount, Role, RoleBinding, Deployment (a
// memory-backed emptyDir for the namespaces' tokens) and a mirror its pods mount.
func poolObjects(ns string, labels map[string]string) []client.Object {
	const name = "webhook-shared-dispatcher"
	dep := dispatcherDeployment(ns, name, labels)
	dep.Spec.Template.Spec.Volumes = append(dep.Spec.Template.Spec.Volumes[:1], corev1.Volume{Name: "tokens",
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
	ctr := &dep.Spec.Template.Spec.Containers[0]
	for i := range ctr.VolumeMounts {
		if ctr.VolumeMounts[i].Name == "nats-token" {
			ctr.VolumeMounts[i] = corev1.VolumeMount{Name: "tokens", MountPath: "/var/run/webhook-operator/tokens"}
		}
	}
	ctr.Args = []string{"dispatcher", "--shared", "--namespaces-configmap=" + name}
	return []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}, ResourceNames: []string{name}}}},
		dispatcherRoleBinding(ns, name, labels),
		dep,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhook-dispatcher-nats", Labels: labels}, Type: corev1.SecretTypeOpaque},
	}
}

// poolGrant is the Role and RoleBinding that let the shared dispatcher of the release namespace
// create the tokens of namespace ns's dispatcher ServiceAccount.
func poolGrant(ns string, labels map[string]string) (*rbacv1.Role, *rbacv1.RoleBinding) {
	const name = "webhook-shared-dispatcher"
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, Verbs: []string{"create"}, ResourceNames: []string{"webhook-dispatcher"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: releaseNamespace}}}
	return role, binding
}
