package controllers_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/dispatcher/shared"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// With --shared-dispatcher, namespaces get no dispatcher Deployment of their own: the shared
// one in the controller's namespace serves them, listed in its ConfigMap, and each namespace
// lets it create its dispatcher ServiceAccount's tokens and nothing else (the controller's
// generated RBAC is enough to grant that). The endpoints say which Deployment serves them and
// are Ready once it is available. A namespace that asks for its own dispatcher gets one and
// leaves the pool; back in the pool, its own Deployment goes once the shared one is available;
// a namespace whose last endpoint goes leaves the pool and its grant goes.
//
// The suite's controller is not in shared mode: this test runs its own controller, in shared
// and callout mode, on a control plane and NATS server of its own, under the installation's
// admission policy.
func TestTheSharedDispatcherServesNamespacesWithoutAPodOfTheirOwn(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	plane, err := testenv.StartControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = plane.Stop() }()
	kc := plane.Client
	srv, err := testenv.StartNATS("")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Cleanup()

	const ops = "webhook-operator-system"
	for _, ns := range []string{ops, "tenant-a", "tenant-b", "tenant-c"} {
		g.Expect(kc.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	}
	user, err := plane.ControllerUser(ctx)
	if err != nil {
		t.Fatal(err)
	}
	restConfig := rest.CopyConfig(user.Config())
	restConfig.QPS, restConfig.Burst = -1, 0
	// What the controller writes for the shared dispatcher has the shape the admission policy
	// (config/admission) lets it write, as the suite's does for the rest.
	if err := plane.InstallAdmissionPolicy(ctx, restConfig, "webhook-operator-controller", image, ops); err != nil {
		t.Fatal(err)
	}
	// The NATS TLS material, mirrored where dispatchers and producers mount it.
	g.Expect(kc.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ops, Name: "nats-tls"},
		Data: map[string][]byte{"ca.crt": []byte("-----BEGIN CERTIFICATE-----\n")}})).To(Succeed())
	cfg := opconfig.Default()
	cfg.NATS.URL = srv.URL()
	cfg.NATS.CredentialsSecret = ops + "/nats-tls"
	o := &controllers.Options{Config: cfg, DispatcherImage: image, DispatcherReplicas: 2, MaxConcurrentReconciles: 4,
		Namespace: ops, ExcludedNamespaces: []string{"kube-system"}, BusAuth: controllers.BusAuth{Callout: true}, SharedDispatcher: true,
		SharedIdleAfter: 45 * time.Second, DispatcherResources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}}}
	skip := true
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{Scheme: scheme.New(), Cache: controllers.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: &skip}})
	if err != nil {
		t.Fatal(err)
	}
	cjs, err := controllers.ConnectJetStream(&o.Config)
	if err != nil {
		t.Fatal(err)
	}
	defer cjs.Close()
	if err := controllers.Setup(ctx, mgr, o, cjs); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	pool := types.NamespacedName{Namespace: ops, Name: names.SharedPool}
	entries := func(g Gomega) map[string]shared.Entry {
		cm := &corev1.ConfigMap{}
		g.Expect(kc.Get(ctx, pool, cm)).To(Succeed())
		list, err := shared.ParseEntries(cm.Data[shared.NamespacesKey])
		g.Expect(err).NotTo(HaveOccurred())
		out := map[string]shared.Entry{}
		for _, e := range list {
			out[e.Namespace] = e
		}
		return out
	}
	listed := func(g Gomega) []string { return slices.Sorted(maps.Keys(entries(g))) }
	exists := func(obj client.Object, ns, name string) func() bool {
		return func() bool {
			err := kc.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj)
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			return err == nil
		}
	}
	for _, ns := range []string{"tenant-a", "tenant-b"} {
		g.Expect(kc.Create(ctx, endpoint(ns, "orders"))).To(Succeed())
	}

	// The pool: its ConfigMap, its Deployment and the least identity.
	g.Eventually(listed).WithTimeout(timeout).WithPolling(interval).Should(Equal([]string{"tenant-a", "tenant-b"}))
	dep := &appsv1.Deployment{}
	g.Eventually(exists(dep, ops, names.SharedPool)).WithTimeout(timeout).WithPolling(interval).Should(BeTrue())
	ctr := dep.Spec.Template.Spec.Containers[0]
	g.Expect(ctr.Args).To(ContainElements("dispatcher", "--shared", "--namespaces-configmap="+names.SharedPool, "--idle-after=45s", "--shared-memory-budget=268435456"))
	g.Expect(ctr.Args).NotTo(ContainElement(HavePrefix("--namespace=")))
	g.Expect(dep.Spec.Template.Spec.ServiceAccountName).To(Equal(names.SharedPool))
	g.Expect(*dep.Spec.Replicas).To(BeEquivalentTo(2))
	role := &rbacv1.Role{}
	g.Eventually(exists(role, ops, names.SharedPool)).WithTimeout(timeout).WithPolling(interval).Should(BeTrue())
	g.Expect(role.Rules).To(Equal([]rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
		Verbs: []string{"get", "list", "watch"}, ResourceNames: []string{names.SharedPool}}}))

	g.Eventually(exists(&corev1.Secret{}, ops, names.NATSSecret)).WithTimeout(timeout).WithPolling(interval).Should(BeTrue(), "the mirror the shared dispatcher's pods mount")
	g.Expect(dep.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("Secret.SecretName", names.NATSSecret)))

	// Each pooled namespace: its identity and the grant, no Deployment of its own; the mirror
	// its producers mount stays.
	for _, ns := range []string{"tenant-a", "tenant-b"} {
		grant := &rbacv1.RoleBinding{}
		g.Eventually(exists(grant, ns, names.SharedPool)).WithTimeout(timeout).WithPolling(interval).Should(BeTrue())
		g.Expect(grant.Subjects).To(Equal([]rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: names.SharedPool, Namespace: ops}}))
		g.Expect(exists(&corev1.ServiceAccount{}, ns, names.SharedDispatcher)()).To(BeTrue())
		g.Expect(exists(&rbacv1.Role{}, ns, names.SharedDispatcher)()).To(BeTrue())
		g.Expect(exists(&appsv1.Deployment{}, ns, names.SharedDispatcher)()).To(BeFalse(), "namespace %s has a dispatcher Deployment of its own", ns)
		g.Eventually(exists(&corev1.Secret{}, ns, names.NATSSecret)).WithTimeout(timeout).WithPolling(interval).Should(BeTrue())
	}

	// What the shared dispatcher's ServiceAccount may do: create the tokens of the pooled
	// namespaces' dispatcher ServiceAccount, and nothing else.
	g.Expect(kc.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "payments"}})).To(Succeed())
	as := poolIdentity(t, plane, ops)
	tokenOf := func(ns, sa string) error {
		seconds := int64(600)
		_, err := as.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
		return err
	}
	g.Expect(tokenOf("tenant-a", names.SharedDispatcher)).To(Succeed())
	g.Expect(apierrors.IsForbidden(tokenOf("tenant-a", "payments"))).To(BeTrue(), "a token of another ServiceAccount of a pooled namespace")
	g.Expect(apierrors.IsForbidden(tokenOf("tenant-c", names.SharedDispatcher))).To(BeTrue(), "a token in a namespace not pooled")
	_, err = as.CoreV1().Secrets("tenant-a").List(ctx, metav1.ListOptions{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the shared dispatcher listing a pooled namespace's Secrets: %v", err)

	// The endpoints name the shared Deployment and are Ready once it is available.
	ready := func(ns string) func(g Gomega) string {
		return func(g Gomega) string {
			ep := &v1alpha1.WebhookEndpoint{}
			g.Expect(kc.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orders"}, ep)).To(Succeed())
			g.Expect(ep.Status.Dispatcher).To(Equal(&v1alpha1.DispatcherStatus{Name: names.SharedPool, Namespace: ops, Replicas: 2,
				AvailableReplicas: ep.Status.Dispatcher.AvailableReplicas}))
			c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			return string(c.Status) + "/" + c.Reason + ": " + c.Message
		}
	}
	g.Eventually(ready("tenant-a")).WithTimeout(timeout).WithPolling(interval).Should(
		Equal("False/" + v1alpha1.ReasonDispatcherUnavailable + ": waiting for Deployment " + ops + "/" + names.SharedPool + " to report an available replica"))
	available(t, kc, ops, names.SharedPool)
	g.Eventually(ready("tenant-a")).WithTimeout(timeout).WithPolling(interval).Should(
		And(HavePrefix("True/"+v1alpha1.ReasonReady), HaveSuffix("through Deployment "+ops+"/"+names.SharedPool+" (2/2 available)")))

	// Each namespace's entry carries a digest of what its dispatcher acts on, which changes with
	// it (a sleeping namespace is woken then) and not with the status its dispatcher writes;
	// a namespace with an endpoint that reads another's events stays awake.
	digest := func(ns string) func(g Gomega) string {
		return func(g Gomega) string {
			e := entries(g)[ns]
			g.Expect(e.Digest).NotTo(BeEmpty())
			return e.Digest
		}
	}
	before := digest("tenant-a")(g)
	g.Expect(entries(g)["tenant-a"].Awake).To(BeFalse())
	g.Eventually(func() error {
		ep := &v1alpha1.WebhookEndpoint{}
		if err := kc.Get(ctx, types.NamespacedName{Namespace: "tenant-a", Name: "orders"}, ep); err != nil {
			return err
		}
		ep.Spec.EventTypes = append(ep.Spec.EventTypes, "invoice.*")
		return kc.Update(ctx, ep)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Eventually(digest("tenant-a")).WithTimeout(timeout).WithPolling(interval).ShouldNot(Equal(before))
	before = digest("tenant-a")(g)
	other := endpoint("tenant-b", "audit", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.SourceNamespaces = []string{"tenant-a"} })
	g.Expect(kc.Create(ctx, other)).To(Succeed())
	g.Eventually(func(g Gomega) bool { return entries(g)["tenant-b"].Awake }).WithTimeout(timeout).WithPolling(interval).Should(BeTrue())
	g.Expect(digest("tenant-a")(g)).To(Equal(before), "tenant-a's digest changed with another namespace's endpoint")
	g.Expect(kc.Delete(ctx, other)).To(Succeed())
	g.Eventually(func(g Gomega) bool { return entries(g)["tenant-b"].Awake }).WithTimeout(timeout).WithPolling(interval).Should(BeFalse())

	// A namespace that asks for its own dispatcher leaves the pool.
	setLabel(t, kc, "tenant-b", names.LabelOwnDispatcher, "true")
	g.Eventually(exists(&appsv1.Deployment{}, "tenant-b", names.SharedDispatcher)).WithTimeout(timeout).WithPolling(interval).Should(BeTrue())
	g.Eventually(listed).WithTimeout(timeout).WithPolling(interval).Should(Equal([]string{"tenant-a"}))
	g.Eventually(exists(&rbacv1.RoleBinding{}, "tenant-b", names.SharedPool)).WithTimeout(timeout).WithPolling(interval).Should(BeFalse())
	g.Eventually(func(g Gomega) string {
		ep := &v1alpha1.WebhookEndpoint{}
		g.Expect(kc.Get(ctx, types.NamespacedName{Namespace: "tenant-b", Name: "orders"}, ep)).To(Succeed())
		g.Expect(ep.Status.Dispatcher).NotTo(BeNil())
		return ep.Status.Dispatcher.Namespace + "/" + ep.Status.Dispatcher.Name
	}).WithTimeout(timeout).WithPolling(interval).Should(Equal("/" + names.SharedDispatcher))

	// Back in the pool (the shared one is available): its own Deployment goes.
	setLabel(t, kc, "tenant-b", names.LabelOwnDispatcher, "")
	g.Eventually(listed).WithTimeout(timeout).WithPolling(interval).Should(Equal([]string{"tenant-a", "tenant-b"}))
	g.Eventually(exists(&appsv1.Deployment{}, "tenant-b", names.SharedDispatcher)).WithTimeout(timeout).WithPolling(interval).Should(BeFalse())
	g.Eventually(exists(&rbacv1.RoleBinding{}, "tenant-b", names.SharedPool)).WithTimeout(timeout).WithPolling(interval).Should(BeTrue())

	// A namespace whose last endpoint goes leaves the pool, and its grant goes.
	g.Expect(kc.Delete(ctx, &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "orders"}})).To(Succeed())
	g.Eventually(listed).WithTimeout(timeout).WithPolling(interval).Should(Equal([]string{"tenant-b"}))
	g.Eventually(exists(&rbacv1.RoleBinding{}, "tenant-a", names.SharedPool)).WithTimeout(timeout).WithPolling(interval).Should(BeFalse())
	g.Eventually(exists(&rbacv1.Role{}, "tenant-a", names.SharedPool)).WithTimeout(timeout).WithPolling(interval).Should(BeFalse())

	// With no namespace left to serve, the shared dispatcher goes with everything it had.
	g.Expect(kc.Delete(ctx, &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-b", Name: "orders"}})).To(Succeed())
	for _, obj := range []client.Object{&appsv1.Deployment{}, &corev1.ConfigMap{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}, &corev1.ServiceAccount{}} {
		g.Eventually(exists(obj, ops, names.SharedPool)).WithTimeout(timeout).WithPolling(interval).Should(BeFalse(), "%T", obj)
	}
	g.Eventually(exists(&corev1.Secret{}, ops, names.NATSSecret)).WithTimeout(timeout).WithPolling(interval).Should(BeFalse(), "the mirror in the controller's namespace")
}

// poolIdentity is a client of plane acting as the shared dispatcher's ServiceAccount.
func poolIdentity(t *testing.T, plane *testenv.ControlPlane, ns string) kubernetes.Interface {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(plane.Config)
	var tr *authenticationv1.TokenRequest
	g.Eventually(func() error {
		var err error
		seconds := int64(600)
		tr, err = admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, names.SharedPool,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
		return err
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	c := rest.AnonymousClientConfig(plane.Config)
	c.BearerToken = tr.Status.Token
	return kubernetes.NewForConfigOrDie(c)
}

// setLabel sets (or, with an empty value, removes) a label of a namespace.
func setLabel(t *testing.T, c client.Client, ns, key, value string) {
	t.Helper()
	g := NewWithT(t)
	g.Eventually(func() error {
		obj := &corev1.Namespace{}
		if err := c.Get(context.Background(), types.NamespacedName{Name: ns}, obj); err != nil {
			return err
		}
		if obj.Labels == nil {
			obj.Labels = map[string]string{}
		}
		if value == "" {
			delete(obj.Labels, key)
		} else {
			obj.Labels[key] = value
		}
		return c.Update(context.Background(), obj)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}
