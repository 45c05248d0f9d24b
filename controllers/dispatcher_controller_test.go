package controllers_test

import (
	"context"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

func deploymentTemplate(g Gomega, ns, name string) corev1.PodTemplateSpec {
	d := &appsv1.Deployment{}
	g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, d)).To(Succeed())
	return d.Spec.Template
}

// A dedicated endpoint gets its own Deployment and RBAC, with its replicas and
// resources, spread across nodes; it goes with the endpoint while the shared one stays.
func TestDedicatedDispatcher(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "shared-one"))
	create(t, endpoint(ns, "big", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true, Replicas: ptr(int32(3)),
			Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}}
	}))
	long := strings.Repeat("very-long-endpoint-name-", 3) + "x"
	create(t, endpoint(ns, long, func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true}
	}))

	ep := eventuallyReady(t, ns, "big", "False/"+v1alpha1.ReasonDispatcherUnavailable)
	g.Expect(ep.Status.Dispatcher).To(Equal(&v1alpha1.DispatcherStatus{Name: "webhook-dispatcher-big", Dedicated: true, Replicas: 3}))
	d := &appsv1.Deployment{}
	g.Eventually(func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher-big"}, d)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(*d.Spec.Replicas).To(BeEquivalentTo(3))
	g.Expect(d.Labels).To(HaveKeyWithValue("webhook-operator.io/endpoint", "big"))
	g.Expect(d.Labels).To(HaveKeyWithValue("webhook-operator.io/dispatcher", "webhook-dispatcher-big"))
	g.Expect(d.OwnerReferences).To(ConsistOf(HaveField("UID", ep.UID)))
	ctr := d.Spec.Template.Spec.Containers[0]
	g.Expect(ctr.Args).To(ContainElement("--endpoint=big"))
	g.Expect(ctr.Resources.Requests.Cpu().String()).To(Equal("500m"))
	g.Expect(ctr.Env).To(ContainElement(corev1.EnvVar{Name: controllers.EnvReplicas, Value: "3"}))
	g.Expect(ctr.Env).To(ContainElement(corev1.EnvVar{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: "http://otel-collector.observability:4317"}), "the installation's OTEL_* settings reach the dispatcher")
	tsc := d.Spec.Template.Spec.TopologySpreadConstraints
	g.Expect(tsc).To(HaveLen(1))
	g.Expect(tsc[0].TopologyKey).To(Equal("kubernetes.io/hostname"))
	g.Expect(tsc[0].LabelSelector.MatchLabels).To(HaveKeyWithValue("webhook-operator.io/dispatcher", "webhook-dispatcher-big"))
	role := &rbacv1.Role{}
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher-big"}, role)).To(Succeed())
		g.Expect(secretNames(role)).To(Equal([]string{"big-signing"}), "a dedicated dispatcher reads only its endpoint's Secrets")
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	sharedRole := &rbacv1.Role{}
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, sharedRole)).To(Succeed())
		g.Expect(secretNames(sharedRole)).To(Equal([]string{"shared-one-signing"}))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(consumerExists(g, layout.For(ns).EventsStream(), layout.For(ns).EndpointConsumer("big"))).To(BeTrue())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	// A long name is shortened to fit a label, and stays unique.
	longEP := eventuallyReady(t, ns, long, "False/"+v1alpha1.ReasonDispatcherUnavailable)
	name := longEP.Status.Dispatcher.Name
	g.Expect(len(name)).To(BeNumerically("<=", 63))
	g.Expect(name).To(HavePrefix("webhook-dispatcher-very-long"))
	g.Eventually(func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &appsv1.Deployment{})
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	markAvailable(t, ns, "webhook-dispatcher-big")
	eventuallyReady(t, ns, "big", "True/Ready")

	// Deleting the dedicated endpoint removes its dispatcher; the shared one stays.
	g.Expect(k8s.Delete(ctx, endpoint(ns, "big"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "big"}, &v1alpha1.WebhookEndpoint{})
		g.Expect(err).To(MatchError(ContainSubstring("not found")))
		for _, o := range []struct {
			obj  client.Object
			kind string
		}{{&appsv1.Deployment{}, "Deployment"}, {&corev1.ServiceAccount{}, "ServiceAccount"}, {&rbacv1.Role{}, "Role"}, {&rbacv1.RoleBinding{}, "RoleBinding"}} {
			err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher-big"}, o.obj)
			g.Expect(err).To(MatchError(ContainSubstring("not found")), o.kind)
		}
		g.Expect(consumerExists(g, layout.For(ns).EventsStream(), layout.For(ns).EndpointConsumer("big"))).To(BeFalse())
		g.Expect(consumerExists(g, layout.For(ns).DeliveriesStream(), layout.For(ns).EndpointConsumer("big"))).To(BeFalse())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, &appsv1.Deployment{})).To(Succeed())
	g.Expect(consumerExists(g, layout.For(ns).EventsStream(), streams.IntakeConsumer(ns))).To(BeTrue(), "the shared lane's intake")
	g.Expect(consumerExists(g, layout.For(ns).EventsStream(), layout.For(ns).EndpointConsumer("shared-one"))).To(BeFalse(), "a shared-lane endpoint has no consumer of its own")

	// Turning dedicated off moves the endpoint to the shared dispatcher and removes its own.
	updateEndpoint(t, ns, long, func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Dispatcher = nil })
	g.Eventually(func(g Gomega) {
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &appsv1.Deployment{})
		g.Expect(err).To(MatchError(ContainSubstring("not found")))
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, sharedRole)).To(Succeed())
		g.Expect(secretNames(sharedRole)).To(ContainElement(long + "-signing"))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	eventuallyReady(t, ns, long, "False/"+v1alpha1.ReasonDispatcherUnavailable)
	g.Expect(getEndpoint(g, ns, long).Status.Dispatcher.Name).To(Equal("webhook-dispatcher"))
}

// Adding and removing endpoints of a shared dispatcher changes its Role, never its pod
// template: the Pods roll only when something they run with changes. Deleting the last
// endpoint of the namespace removes the dispatcher and everything with it.
func TestSharedDispatcherFollowsItsEndpoints(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "first"))
	markAvailable(t, ns, "webhook-dispatcher")
	eventuallyReady(t, ns, "first", "True/Ready")
	d := &appsv1.Deployment{}
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, d)).To(Succeed())
	generation, template := d.Generation, d.Spec.Template

	create(t, endpoint(ns, "second"))
	eventuallyReady(t, ns, "second", "True/Ready")
	role := &rbacv1.Role{}
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, role)).To(Succeed())
		g.Expect(secretNames(role)).To(Equal([]string{"first-signing", "second-signing"}))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, d)).To(Succeed())
	g.Expect(d.Generation).To(Equal(generation))
	g.Expect(d.Spec.Template).To(Equal(template))

	g.Expect(k8s.Delete(ctx, endpoint(ns, "first"))).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, role)).To(Succeed())
		g.Expect(secretNames(role)).To(Equal([]string{"second-signing"}))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, d)).To(Succeed())
	g.Expect(d.Generation).To(Equal(generation))
	eventuallyReady(t, ns, "second", "True/Ready")

	g.Expect(k8s.Delete(ctx, endpoint(ns, "second"))).To(Succeed())
	expectNoDispatcherLeft(t, ns)
}

// The NATS credentials Secret is mirrored into each dispatcher namespace; a change of it
// updates every mirror and rolls the dispatchers (their environment comes from it).
func TestNATSCredentialsMirror(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "one"))
	var before string
	g.Eventually(func(g Gomega) {
		before = deploymentTemplate(g, ns, "webhook-dispatcher").Annotations[names.AnnotationNATSChecksum]
		g.Expect(before).NotTo(BeEmpty())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	rotate(t, credsRef, map[string]string{"password": "rotated-" + ns, "token": "t0ken"})
	g.Eventually(func(g Gomega) {
		mirror := &corev1.Secret{}
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.NATSSecret}, mirror)).To(Succeed())
		g.Expect(string(mirror.Data["password"])).To(Equal("rotated-" + ns))
		tpl := deploymentTemplate(g, ns, "webhook-dispatcher")
		g.Expect(tpl.Annotations[names.AnnotationNATSChecksum]).NotTo(Equal(before))
		g.Expect(tpl.Spec.Containers[0].Env).To(ContainElement(HaveField("Name", "NATS_TOKEN")))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// The dispatchers' tracing credentials (--dispatcher-otel-env-secret) reach them from a Secret,
// never as a value in their pod templates: the controller mirrors its OTEL_* keys (and no
// other) into the namespace, sets each on the dispatcher by reference, rolls the dispatchers
// when it changes, and no endpoint may use the mirror.
func TestDispatcherOTELCredentialsFromASecret(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "traced"))
	var before string
	g.Eventually(func(g Gomega) {
		tpl := deploymentTemplate(g, ns, "webhook-dispatcher")
		before = tpl.Annotations[names.AnnotationOTELChecksum]
		g.Expect(before).NotTo(BeEmpty())
		g.Expect(tpl.Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: "OTEL_EXPORTER_OTLP_HEADERS", ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: names.OTELSecret}, Key: "OTEL_EXPORTER_OTLP_HEADERS"}}}))
		for _, e := range tpl.Spec.Containers[0].Env {
			g.Expect(e.Value).NotTo(ContainSubstring("collector-s3cret"), "%s shows the collector's credentials", e.Name)
		}
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	mirror := &corev1.Secret{}
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.OTELSecret}, mirror)).To(Succeed())
	g.Expect(mirror.Data).To(Equal(map[string][]byte{"OTEL_EXPORTER_OTLP_HEADERS": []byte("authorization=Bearer collector-s3cret")}))
	g.Expect(mirror.Labels).To(HaveKeyWithValue(names.LabelManagedBy, names.LabelManagedByValue))

	create(t, endpoint(ns, "leak", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.HeadersFrom = []v1alpha1.HeaderFromSecret{{Name: "X-Leak", SecretKeyRef: v1alpha1.SecretKeySelector{Name: names.OTELSecret, Key: "OTEL_EXPORTER_OTLP_HEADERS"}}}
	}))
	eventuallyReady(t, ns, "leak", "False/"+v1alpha1.ReasonSecretNotAllowed)

	rotate(t, otelRef, map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer rotated-" + ns})
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.OTELSecret}, mirror)).To(Succeed())
		g.Expect(string(mirror.Data["OTEL_EXPORTER_OTLP_HEADERS"])).To(Equal("authorization=Bearer rotated-" + ns))
		g.Expect(deploymentTemplate(g, ns, "webhook-dispatcher").Annotations[names.AnnotationOTELChecksum]).NotTo(Equal(before))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// Secure metrics: a dispatcher knows its scrapers by their client certificates of the scraper
// CA, never with a TokenReview or SubjectAccessReview. The controller mirrors the CA's
// certificate (ca.crt, never the scraper's key) into the namespace, mounts it, and tells the
// dispatcher where it is and which subject to require; the dispatcher's ServiceAccount may
// create no TokenReview or SubjectAccessReview (the suite installed config/rbac as the chart
// does); a rotated CA reaches the mirror, and the mirror goes with the last dispatcher.
func TestDispatcherMetricsKnowScrapersByTheScraperCA(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	create(t, endpoint(ns, "scraped"))
	g.Eventually(func(g Gomega) {
		tpl := deploymentTemplate(g, ns, "webhook-dispatcher")
		c := tpl.Spec.Containers[0]
		g.Expect(c.Args).To(ContainElements("--metrics-secure=true", "--metrics-client-ca-file=/etc/webhook-operator/metrics-ca/ca.crt",
			"--metrics-client-name=prometheus"))
		g.Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "metrics-ca", MountPath: "/etc/webhook-operator/metrics-ca", ReadOnly: true}))
		g.Expect(tpl.Spec.Volumes).To(ContainElement(HaveField("VolumeSource.Secret", Equal(&corev1.SecretVolumeSource{
			SecretName: names.MetricsCASecret, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}, DefaultMode: ptr(int32(0o644))}))))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	mirror := &corev1.Secret{}
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.MetricsCASecret}, mirror)).To(Succeed())
	g.Expect(mirror.Data).To(Equal(map[string][]byte{"ca.crt": []byte("-----BEGIN CERTIFICATE-----\nscraper CA\n")}), "only the CA's certificate reaches the namespace")
	g.Expect(mirror.Labels).To(HaveKeyWithValue(names.LabelManagedBy, names.LabelManagedByValue))

	sa := "system:serviceaccount:" + ns + ":webhook-dispatcher"
	for _, ra := range []authorizationv1.ResourceAttributes{
		{Group: "authentication.k8s.io", Resource: "tokenreviews", Verb: "create"},
		{Group: "authorization.k8s.io", Resource: "subjectaccessreviews", Verb: "create"},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: sa,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}, ResourceAttributes: &ra}}
		g.Expect(k8s.Create(ctx, sar)).To(Succeed())
		g.Expect(sar.Status.Allowed).To(BeFalse(), "the dispatcher's ServiceAccount may create %s", ra.Resource)
	}

	rotate(t, scraperRef, map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\nrotated " + ns + "\n"})
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: names.MetricsCASecret}, mirror)).To(Succeed())
		g.Expect(string(mirror.Data["ca.crt"])).To(ContainSubstring("rotated " + ns))
		g.Expect(mirror.Data).NotTo(HaveKey("tls.key"))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	g.Expect(k8s.Delete(ctx, endpoint(ns, "scraped"))).To(Succeed())
	expectNoDispatcherLeft(t, ns)
}

// The dispatcher reconciler follows endpoints through the API server alone: once a deleted
// endpoint's finalizer is gone (its consumers held nothing) while another finalizer keeps the
// endpoint, its dedicated dispatcher is gone and the shared one no longer reads its Secret,
// while the endpoint still exists.
func TestDispatcherFollowsADeletionThroughTheAPIServer(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	const hold = "test.webhook-operator.io/hold"
	held := func(ep *v1alpha1.WebhookEndpoint) { ep.Finalizers = []string{hold} }
	create(t, endpoint(ns, "stays"))
	create(t, endpoint(ns, "shared-held", held))
	create(t, endpoint(ns, "own-held", held, func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true}
	}))
	role := &rbacv1.Role{}
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, role)).To(Succeed())
		g.Expect(secretNames(role)).To(Equal([]string{"shared-held-signing", "stays-signing"}))
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher-own-held"}, &appsv1.Deployment{})).To(Succeed())
		g.Expect(consumerExists(g, layout.For(ns).EventsStream(), layout.For(ns).EndpointConsumer("own-held"))).To(BeTrue())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	for _, name := range []string{"shared-held", "own-held"} {
		g.Expect(k8s.Delete(ctx, endpoint(ns, name))).To(Succeed())
	}
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher"}, role)).To(Succeed())
		g.Expect(secretNames(role)).To(Equal([]string{"stays-signing"}))
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher-own-held"}, &appsv1.Deployment{})
		g.Expect(err).To(MatchError(ContainSubstring("not found")))
		g.Expect(consumerExists(g, layout.For(ns).EventsStream(), layout.For(ns).EndpointConsumer("own-held"))).To(BeFalse())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	for _, name := range []string{"shared-held", "own-held"} {
		g.Expect(getEndpoint(g, ns, name).DeletionTimestamp.IsZero()).To(BeFalse(), "%s is still there, being deleted", name)
		g.Eventually(func(g Gomega) {
			ep := getEndpoint(g, ns, name)
			controllerutil.RemoveFinalizer(ep, hold)
			g.Expect(k8s.Update(ctx, ep)).To(Succeed())
		}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	}
}

// A dedicated dispatcher's replicas and resources are the endpoint's to choose within the
// installation's caps: above them it runs at the caps, a missing limit is the installation's
// default, resources other than cpu and memory are left out, and the endpoint's
// DispatcherCapped condition says what was changed, until the endpoint asks for less.
func TestDedicatedDispatcherIsCapped(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	ns := newNamespace(t)
	gpu := corev1.ResourceName("nvidia.com/gpu")
	create(t, endpoint(ns, "greedy", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true, Replicas: ptr(int32(20)),
			Resources: &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("64Mi"), gpu: resource.MustParse("1")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi"), gpu: resource.MustParse("1")}}}
	}))
	d := &appsv1.Deployment{}
	g.Eventually(func() error {
		return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher-greedy"}, d)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Expect(*d.Spec.Replicas).To(BeEquivalentTo(5))
	res := d.Spec.Template.Spec.Containers[0].Resources
	g.Expect(res.Requests).To(Equal(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("64Mi")}))
	g.Expect(res.Limits).To(Equal(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi")}))

	capped := func(g Gomega) *metav1.Condition {
		return meta.FindStatusCondition(getEndpoint(g, ns, "greedy").Status.Conditions, v1alpha1.ConditionDispatcherCapped)
	}
	g.Eventually(func(g Gomega) {
		c := capped(g)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(c.Reason).To(Equal(v1alpha1.ReasonInstallationCap))
		for _, want := range []string{
			"spec.dispatcher.replicas 20 is above the installation's cap of 5 (--dispatcher-max-replicas): it runs 5",
			"spec.dispatcher.resources.requests.nvidia.com/gpu is left out: a dispatcher asks for cpu and memory only",
			"spec.dispatcher.resources.requests.cpu 4 is above the installation's cap of 2 (--dispatcher-max-cpu): it runs with 2",
			"spec.dispatcher.resources.requests.cpu 2 is above its limit 1: it runs with 1",
			"spec.dispatcher.resources.limits.memory 8Gi is above the installation's cap of 1Gi (--dispatcher-max-memory): it runs with 1Gi",
		} {
			g.Expect(c.Message).To(ContainSubstring(want))
		}
		g.Expect(getEndpoint(g, ns, "greedy").Status.Dispatcher.Replicas).To(BeEquivalentTo(5))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())

	// Within the caps, nothing is changed and the condition goes.
	g.Eventually(func() error {
		ep := &v1alpha1.WebhookEndpoint{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "greedy"}, ep); err != nil {
			return err
		}
		ep.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true, Replicas: ptr(int32(2))}
		return k8s.Update(ctx, ep)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(capped(g)).To(BeNil())
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "webhook-dispatcher-greedy"}, d)).To(Succeed())
		g.Expect(*d.Spec.Replicas).To(BeEquivalentTo(2))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// rotate changes keys of the installation's Secret ref, as its owner rotating them would, and
// puts its data back when the test ends.
func rotate(t *testing.T, ref types.NamespacedName, keys map[string]string) {
	t.Helper()
	ctx := context.Background()
	src := &corev1.Secret{}
	if err := k8s.Get(ctx, ref, src); err != nil {
		t.Fatal(err)
	}
	original := src.DeepCopy().Data
	t.Cleanup(func() {
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, ref, s); err == nil {
			s.Data = original
			_ = k8s.Update(ctx, s)
		}
	})
	for k, v := range keys {
		src.Data[k] = []byte(v)
	}
	if err := k8s.Update(ctx, src); err != nil {
		t.Fatal(err)
	}
}
