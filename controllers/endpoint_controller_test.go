package controllers_test

import (
	"context"
	"os/exec"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Creating an endpoint produces its signing Secret, the namespace's shared dispatcher with its
// RBAC and NATS credentials, its consumers on the events and deliveries streams; Ready turns True once the
// Deployment reports an available replica, and `kubectl wait` sees it.
func TestEndpointIsWiredThenReadyWhenDispatcherAvailable(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "orders"))

	ep := eventuallyReady(t, ns, "orders", "False/"+v1alpha1.ReasonDispatcherUnavailable)
	g.Expect(ep.Finalizers).To(ContainElement(controllers.Finalizer))
	// The shared lane: the namespace's intake consumer, its queue subject, none of its own.
	g.Expect(ep.Status.ConsumerName).To(Equal(streams.IntakeConsumer(ns)))
	g.Expect(ep.Status.Lane).To(Equal("Shared"))
	g.Expect(ep.Status.SharedSince).NotTo(BeNil())
	g.Expect(ep.Status.SharedSince.Time).To(Equal(ep.CreationTimestamp.Time), "an endpoint without consumers of its own joins the shared lane at its creation")
	g.Expect(ep.Status.DrainingConsumers).To(BeEmpty())
	g.Expect(ep.Status.DeliverySubject).To(Equal("whk.q." + ns + ".orders"))
	g.Expect(ep.Status.SigningSecretName).To(Equal("orders-signing"))
	g.Expect(ep.Status.RetryPolicyName).To(Equal("(default)"))
	g.Expect(ep.Status.SecretsVersion).NotTo(BeEmpty())
	g.Expect(ep.Status.Dispatcher).To(Equal(&v1alpha1.DispatcherStatus{Name: "webhook-dispatcher", Replicas: 1}))
	g.Expect(meta.IsStatusConditionTrue(ep.Status.Conditions, v1alpha1.ConditionReconciling)).To(BeTrue())

	// The generated signing secret: Standard Webhooks form, owned by the endpoint.
	sec := &corev1.Secret{}
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orders-signing"}, sec)).To(Succeed())
	g.Expect(string(sec.Data["secret"])).To(HavePrefix("whsec_"))
	g.Expect(len(sec.Data["secret"])).To(Equal(len("whsec_") + 44))
	g.Expect(sec.OwnerReferences).To(HaveLen(1))
	g.Expect(sec.OwnerReferences[0].UID).To(Equal(ep.UID))

	// The consumers: the namespace's intake (every event, from the first endpoint's creation)
	// and queue consumers; none of its own.
	g.Expect(consumerExists(g, layout.For(ns).DeliveriesStream(), layout.For(ns).EndpointConsumer("orders"))).To(BeFalse())
	g.Expect(consumerExists(g, layout.For(ns).EventsStream(), layout.For(ns).EndpointConsumer("orders"))).To(BeFalse())
	ev, err := testJS.Consumer(ctx, layout.For(ns).EventsStream(), streams.IntakeConsumer(ns))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(ev.CachedInfo().Config.FilterSubject).To(Equal("webhooks." + ns + ".>"))
	g.Expect(ev.CachedInfo().Config.OptStartTime.Equal(ep.CreationTimestamp.Time)).To(BeTrue(), "starts at the endpoint's creation")
	c, err := testJS.Consumer(ctx, layout.For(ns).DeliveriesStream(), layout.For(ns).QueueConsumer())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(c.CachedInfo().Config.FilterSubject).To(Equal("whk.q." + ns + ".>"))

	// The Deployment.
	d := &appsv1.Deployment{}
	g.Eventually(func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, d)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(d.Labels).To(And(
		HaveKeyWithValue("app.kubernetes.io/name", "webhook-dispatcher"),
		HaveKeyWithValue("app.kubernetes.io/managed-by", "webhook-operator"),
		HaveKeyWithValue("webhook-operator.io/dispatcher", "webhook-dispatcher"),
		Not(HaveKey("webhook-operator.io/endpoint"))))
	g.Expect(*d.Spec.Replicas).To(BeEquivalentTo(1))
	pod := d.Spec.Template.Spec
	g.Expect(pod.ServiceAccountName).To(Equal("webhook-dispatcher"))
	g.Expect(pod.TopologySpreadConstraints).To(BeEmpty(), "one replica needs no spreading")
	g.Expect(*pod.SecurityContext.RunAsNonRoot).To(BeTrue())
	g.Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
	g.Expect(pod.Containers).To(HaveLen(1))
	ctr := pod.Containers[0]
	g.Expect(ctr.Image).To(Equal(image))
	g.Expect(ctr.Args[:5]).To(Equal([]string{"dispatcher", "--namespace=" + ns, "--metrics-bind-address=:8080", "--health-probe-bind-address=:8081", "--nats-url=" + natsSrv.URL()}))
	g.Expect(ctr.Args).To(ContainElement("--nats-ca-file=/etc/webhook-operator/nats/ca.crt"))
	g.Expect(ctr.Args).NotTo(ContainElement(HavePrefix("--nats-creds-file")))
	g.Expect(ctr.Args).NotTo(ContainElement(HavePrefix("--endpoint")))
	sc := ctr.SecurityContext
	g.Expect(*sc.RunAsNonRoot && *sc.ReadOnlyRootFilesystem && !*sc.AllowPrivilegeEscalation).To(BeTrue())
	g.Expect(sc.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}))
	g.Expect(sc.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
	g.Expect(ctr.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
	g.Expect(ctr.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
	g.Expect(ctr.LivenessProbe.HTTPGet.Port.String()).To(Equal("probes"))
	g.Expect(ctr.Ports).To(ContainElements(
		HaveField("ContainerPort", BeEquivalentTo(8080)), HaveField("ContainerPort", BeEquivalentTo(8081))))
	g.Expect(ctr.Resources.Requests.Cpu().String()).To(Equal("100m"))
	g.Expect(ctr.Resources.Requests.Memory().String()).To(Equal("64Mi"))
	g.Expect(ctr.Resources.Limits.Memory().String()).To(Equal("256Mi"))
	g.Expect(ctr.Resources.Limits.Cpu().String()).To(Equal("1"))
	env := map[string]corev1.EnvVar{}
	for _, e := range ctr.Env {
		env[e.Name] = e
	}
	g.Expect(env["POD_NAME"].ValueFrom.FieldRef.FieldPath).To(Equal("metadata.name"))
	g.Expect(env["POD_NAMESPACE"].ValueFrom.FieldRef.FieldPath).To(Equal("metadata.namespace"))
	g.Expect(env[controllers.EnvReplicas].Value).To(Equal("1"))
	g.Expect(env["NATS_USER"].ValueFrom.SecretKeyRef.Name).To(Equal(names.NATSSecret))
	g.Expect(env["NATS_PASSWORD"].ValueFrom.SecretKeyRef.Key).To(Equal("password"))
	g.Expect(env).NotTo(HaveKey("NATS_TOKEN"))
	// The NATS files, and the scraper CA of secure metrics.
	g.Expect(ctr.VolumeMounts).To(ConsistOf(HaveField("MountPath", "/etc/webhook-operator/nats"), HaveField("MountPath", "/etc/webhook-operator/metrics-ca")))

	// RBAC: a ServiceAccount, a Role reading exactly the endpoint's Secret (once the Secret,
	// which consents to it, is seen), a RoleBinding.
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, &corev1.ServiceAccount{})).To(Succeed())
	expectRoleSecrets(t, ns, "webhook-dispatcher", "orders-signing")
	rb := &rbacv1.RoleBinding{}
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, rb)).To(Succeed())
	g.Expect(rb.RoleRef.Name).To(Equal("webhook-dispatcher"))
	g.Expect(rb.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "webhook-dispatcher", Namespace: ns}}))

	// The NATS credentials, mirrored.
	mirror := &corev1.Secret{}
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.NATSSecret}, mirror)).To(Succeed())
	g.Expect(string(mirror.Data["user"])).To(Equal("dispatcher"))

	markAvailable(t, ns, "webhook-dispatcher")
	ep = eventuallyReady(t, ns, "orders", "True/Ready")
	g.Expect(ep.Status.Dispatcher.AvailableReplicas).To(BeEquivalentTo(1))
	g.Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReconciling)).To(BeNil())
	g.Expect(meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionStalled)).To(BeNil())
	// One Event: Ready. A new endpoint waiting for its dispatcher is not news, nor the Secret
	// made for it (its status names it): a thousand applied at once are a thousand Events, not
	// three thousand writes to the API server.
	g.Eventually(func(g Gomega) {
		g.Expect(eventReasons(g, ns, "orders")).To(ConsistOf(v1alpha1.ReasonReady))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	// kubectl wait, as a user or a GitOps pipeline would.
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	g.Expect(err).NotTo(HaveOccurred())
	out, err := exec.Command(testenv.Kubectl(), "--kubeconfig", kubeconfig, "-n", ns,
		"wait", "--for=condition=Ready", "whe/orders", "--timeout=20s").CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), string(out))

	// A Ready endpoint whose dispatcher goes away: that is news.
	g.Eventually(func() error {
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, d); err != nil {
			return err
		}
		d.Status.AvailableReplicas, d.Status.ReadyReplicas = 0, 0
		return k8s.Status().Update(ctx, d)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	eventuallyReady(t, ns, "orders", "False/"+v1alpha1.ReasonDispatcherUnavailable)
	g.Eventually(func(g Gomega) {
		g.Expect(eventReasons(g, ns, "orders")).To(ConsistOf(v1alpha1.ReasonReady, v1alpha1.ReasonDispatcherUnavailable))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// The dispatcher's Role reads exactly the Secrets of its endpoints: acting as the dispatcher's
// ServiceAccount, the signing secret can be read and no other Secret, and Secrets cannot be
// listed.
func TestDispatcherRoleIsLeastPrivilege(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unrelated"}, StringData: map[string]string{"k": "v"}})
	create(t, endpoint(ns, "orders"))
	g.Eventually(func(g Gomega) {
		role := &rbacv1.Role{}
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, role)).To(Succeed())
		g.Expect(secretNames(role)).To(Equal([]string{"orders-signing"}))
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, &rbacv1.RoleBinding{})).To(Succeed())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	as := impersonate(t, "system:serviceaccount:"+ns+":webhook-dispatcher")
	g.Eventually(func() error {
		return as.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orders-signing"}, &corev1.Secret{})
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(as.Get(ctx, types.NamespacedName{Namespace: ns, Name: "unrelated"}, &corev1.Secret{})).To(MatchError(ContainSubstring("forbidden")))
	g.Expect(as.List(ctx, &corev1.SecretList{}, client.InNamespace(ns))).To(MatchError(ContainSubstring("forbidden")))
	g.Expect(as.List(ctx, &v1alpha1.WebhookEndpointList{}, client.InNamespace(ns))).To(Succeed())
	g.Expect(as.List(ctx, &v1alpha1.RetryPolicyList{}, client.InNamespace(ns))).To(Succeed())
	g.Expect(as.List(ctx, &v1alpha1.WebhookEndpointList{}, client.InNamespace("default"))).To(MatchError(ContainSubstring("forbidden")))
	g.Expect(as.Create(ctx, endpoint(ns, "sneaky"))).To(MatchError(ContainSubstring("forbidden")))
}

func secretNames(role *rbacv1.Role) []string {
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, "secrets") {
			return r.ResourceNames
		}
	}
	return nil
}

func impersonate(t *testing.T, user string) client.Client {
	t.Helper()
	cfg := *cp.Config
	cfg.Impersonate.UserName = user
	c, err := client.New(&cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// eventReasons are the reasons of the Events recorded about an endpoint.
func eventReasons(g Gomega, ns, name string) []string {
	list := &corev1.EventList{}
	g.Expect(k8s.List(context.Background(), list, client.InNamespace(ns))).To(Succeed())
	var reasons []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "WebhookEndpoint" && e.InvolvedObject.Name == name {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}
