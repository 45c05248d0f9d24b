package controllers_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// The suite runs one controller, as a user holding only the ClusterRole generated from the
// RBAC markers, against a real kube-apiserver and a real nats-server.
var (
	cp      *testenv.ControlPlane
	natsSrv *testenv.NATS
	k8s     client.Client // cluster-admin, for the tests' own reads and writes
	// ctrlCache is the controller's own cache (what its reconcilers read).
	ctrlCache cache.Cache
	testJS    jetstream.JetStream
	layout    = streams.DefaultConfig()
	opts      *controllers.Options
	credsRef  = types.NamespacedName{Namespace: "webhook-operator-system", Name: "nats-credentials"}
	// otelRef holds the dispatchers' tracing credentials (--dispatcher-otel-env-secret).
	otelRef = types.NamespacedName{Namespace: "webhook-operator-system", Name: "otel-collector-auth"}
	// scraperRef holds the scraper CA and its client certificate (--dispatcher-metrics-ca-secret).
	scraperRef = types.NamespacedName{Namespace: "webhook-operator-system", Name: "metrics-scraper-tls"}
)

const (
	timeout  = 30 * time.Second
	interval = 50 * time.Millisecond
	image    = "registry.example/webhook-operator:test"
)

func TestMain(m *testing.M) {
	code, err := runSuite(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "controllers suite:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func runSuite(m *testing.M) (int, error) {
	if os.Getenv("CONTROLLERS_TEST_LOG") != "" {
		ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
	}
	var err error
	if cp, err = testenv.StartControlPlane(); err != nil {
		return 0, err
	}
	defer func() { _ = cp.Stop() }()
	k8s = cp.Client
	controllers.SuiteClient = k8s
	if natsSrv, err = testenv.StartNATS(""); err != nil {
		return 0, err
	}
	defer natsSrv.Cleanup()
	nc, js, err := natsSrv.Connect()
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	testJS = js

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: credsRef.Namespace}}); err != nil {
		return 0, err
	}
	if err := k8s.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: credsRef.Name, Namespace: credsRef.Namespace},
		Data:       map[string][]byte{"user": []byte("dispatcher"), "password": []byte("s3cret"), "ca.crt": []byte("-----BEGIN CERTIFICATE-----\n")},
	}); err != nil {
		return 0, err
	}
	if err := k8s.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: otelRef.Name, Namespace: otelRef.Namespace},
		Data:       map[string][]byte{"OTEL_EXPORTER_OTLP_HEADERS": []byte("authorization=Bearer collector-s3cret"), "notes": []byte("not for dispatchers")},
	}); err != nil {
		return 0, err
	}
	if err := k8s.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: scraperRef.Name, Namespace: scraperRef.Namespace},
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{"ca.crt": []byte("-----BEGIN CERTIFICATE-----\nscraper CA\n"),
			"tls.crt": []byte("-----BEGIN CERTIFICATE-----\nscraper\n"), "tls.key": []byte("-----BEGIN PRIVATE KEY-----\nscraper's key\n")},
	}); err != nil {
		return 0, err
	}
	restConfig, err := controllerIdentity(ctx)
	if err != nil {
		return 0, err
	}
	// Every test shows the controller creates, changes and deletes only objects labelled as its
	// own, of the shape it makes (config/admission), its user in place of its ServiceAccount.
	if err := cp.InstallAdmissionPolicy(ctx, restConfig, "webhook-operator-controller", image, credsRef.Namespace); err != nil {
		return 0, err
	}
	if err := createFromFile(ctx, filepath.Join(testenv.Root(), "config", "rbac", "metrics.yaml"), nil); err != nil {
		return 0, err
	}

	cfg := opconfig.Default()
	cfg.NATS.URL = natsSrv.URL()
	cfg.NATS.CredentialsSecret = credsRef.String()
	opts = &controllers.Options{
		Config:              cfg,
		DispatcherImage:     image,
		DispatcherReplicas:  1,
		DispatcherResources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: mustQuantity("100m"), corev1.ResourceMemory: mustQuantity("64Mi")}, Limits: corev1.ResourceList{corev1.ResourceCPU: mustQuantity("1"), corev1.ResourceMemory: mustQuantity("256Mi")}},
		DispatcherCaps:      controllers.DispatcherCaps{MaxReplicas: 5, MaxResources: corev1.ResourceList{corev1.ResourceCPU: mustQuantity("2"), corev1.ResourceMemory: mustQuantity("1Gi")}},
		// Above the 98 endpoints TestEndpointsBeyondTheSourceGrantSaySo makes in one namespace
		// (TestInstallationBoundsEndpointsWithoutAQuota).
		MaxEndpointsPerNamespace: 100,
		MaxConcurrentReconciles:  4,
		DispatcherOTELEnv:        []corev1.EnvVar{{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: "http://otel-collector.observability:4317"}},
		DispatcherOTELSecret:     otelRef,
		// Secure metrics (opconfig's default): the dispatchers know scrapers by certificate.
		DispatcherMetricsCA:         scraperRef,
		DispatcherMetricsClientName: "prometheus",
		Namespace:                   credsRef.Namespace,
		ExcludedNamespaces:          []string{"kube-system", "kube-public", "kube-node-lease"},
		StorageCheckInterval:        time.Second,
		RetentionInterval:           time.Second,
		// Every dispatcher of the suite gets its egress NetworkPolicy (TestDispatcherEgressPolicy).
		DispatcherEgress: &controllers.EgressPolicy{
			DNS: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}}}},
			APIServer:      []netip.Prefix{netip.MustParsePrefix("10.96.0.1/32")},
			APIServerPorts: []int32{443, 6443},
		},
	}
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                 scheme.New(),
		Cache:                  controllers.CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return 0, err
	}
	ctrlCache = mgr.GetCache()
	cjs, err := controllers.ConnectJetStream(&opts.Config)
	if err != nil {
		return 0, err
	}
	defer cjs.Close()
	if err := controllers.Setup(ctx, mgr, opts, cjs); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		return code, fmt.Errorf("manager: %w", err)
	}
	return code, nil
}

// controllerIdentity is a user bound to config/rbac/role.yaml and nothing else, so the tests
// prove the generated RBAC is enough (including granting each dispatcher its Role).
func controllerIdentity(ctx context.Context) (*rest.Config, error) {
	u, err := cp.ControllerUser(ctx)
	if err != nil {
		return nil, err
	}
	c := rest.CopyConfig(u.Config())
	c.QPS, c.Burst = -1, 0
	return c, nil
}

// createFromFile creates the objects of a YAML file (or of text, when given).
func createFromFile(ctx context.Context, path string, text []byte) error {
	if text == nil {
		var err error
		if text, err = os.ReadFile(path); err != nil {
			return err
		}
	}
	docs := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(text)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		obj, _, err := scheme.Decoder().Decode(doc, nil, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := k8s.Create(ctx, obj.(client.Object)); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
}

// --- helpers ---

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "whe-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// endpoint returns a valid endpoint; change adjusts it before it is created.
func endpoint(ns, name string, change ...func(*v1alpha1.WebhookEndpoint)) *v1alpha1.WebhookEndpoint {
	ep := &v1alpha1.WebhookEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.WebhookEndpointSpec{
			URL:        "https://receiver.example.com/hooks/" + name,
			EventTypes: []v1alpha1.EventTypePattern{"order.*"},
		},
	}
	for _, c := range change {
		c(ep)
	}
	return ep
}

func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := k8s.Create(context.Background(), obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

func getEndpoint(g Gomega, ns, name string) *v1alpha1.WebhookEndpoint {
	ep := &v1alpha1.WebhookEndpoint{}
	g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, ep)).To(Succeed())
	return ep
}

// readyOf is the endpoint's Ready condition as "Status/Reason", or "" without one.
func readyOf(ep *v1alpha1.WebhookEndpoint) string {
	c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady)
	if c == nil {
		return ""
	}
	return string(c.Status) + "/" + c.Reason
}

// eventuallyReady waits until the endpoint's Ready is want ("True/Ready", "False/InvalidURL", ...)
// for its current generation, and returns it.
func eventuallyReady(t *testing.T, ns, name, want string) *v1alpha1.WebhookEndpoint {
	t.Helper()
	g := NewWithT(t)
	var ep *v1alpha1.WebhookEndpoint
	g.Eventually(func(g Gomega) {
		ep = getEndpoint(g, ns, name)
		g.Expect(readyOf(ep)).To(Equal(want), "Ready of %s/%s: %+v", ns, name, ep.Status.Conditions)
		g.Expect(ep.Status.ObservedGeneration).To(Equal(ep.Generation))
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
	return ep
}

// markAvailable sets a Deployment's status as the deployment controller would once its Pods
// are ready (envtest runs no controller-manager).
func markAvailable(t *testing.T, ns, name string) { available(t, k8s, ns, name) }

// available is markAvailable on the API server c reaches.
func available(t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		d := &appsv1.Deployment{}
		g.Expect(c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, d)).To(Succeed())
		n := *d.Spec.Replicas
		d.Status = appsv1.DeploymentStatus{
			ObservedGeneration: d.Generation, Replicas: n, UpdatedReplicas: n, ReadyReplicas: n, AvailableReplicas: n,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
				Reason: "MinimumReplicasAvailable", LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}
		g.Expect(c.Status().Update(context.Background(), d)).To(Succeed())
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// consumerNames lists the consumers of a stream; a stream that does not exist has none.
func consumerNames(g Gomega, stream string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := testJS.Stream(ctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	g.Expect(err).NotTo(HaveOccurred())
	var names []string
	l := s.ConsumerNames(ctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	g.Expect(l.Err()).NotTo(HaveOccurred())
	return names
}

func consumerExists(g Gomega, stream, name string) bool {
	for _, n := range consumerNames(g, stream) {
		if n == name {
			return true
		}
	}
	return false
}

// expectNoDispatcherLeft checks that nothing the controller made for namespace ns remains:
// no Deployment, NetworkPolicy, ServiceAccount, Role, RoleBinding, NATS or tracing Secret, and
// no consumer.
func expectNoDispatcherLeft(t *testing.T, ns string) {
	t.Helper()
	g := NewWithT(t)
	ctx := context.Background()
	ours := client.MatchingLabels{names.LabelManagedBy: names.LabelManagedByValue}
	g.Eventually(func(g Gomega) {
		for _, list := range []client.ObjectList{&appsv1.DeploymentList{}, &corev1.ServiceAccountList{}, &rbacv1.RoleList{}, &rbacv1.RoleBindingList{}, &networkingv1.NetworkPolicyList{}} {
			g.Expect(k8s.List(ctx, list, client.InNamespace(ns), ours)).To(Succeed())
			g.Expect(meta.LenList(list)).To(BeZero(), "%T left in %s", list, ns)
		}
		for _, name := range []string{names.NATSSecret, names.OTELSecret, names.MetricsCASecret} {
			err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &corev1.Secret{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "Secret %s left in %s: %v", name, ns, err)
		}
		for _, stream := range []string{layout.For(ns).EventsStream(), layout.For(ns).DeliveriesStream()} {
			for _, n := range consumerNames(g, stream) {
				g.Expect(n).NotTo(ContainSubstring("_"+ns), "consumer %s left on %s", n, stream)
			}
		}
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// publishDelivery writes one delivery for ns/ep as a router would.
func publishDelivery(t *testing.T, ns, ep, eventID string) string {
	t.Helper()
	return publishDeliveryTo(t, ns, ep, eventID, layout.For(ns).DeliverySubject(ep))
}

// publishQueued writes one delivery for a shared-lane endpoint onto its queue subject, as a
// replay or a retry coming due would.
func publishQueued(t *testing.T, ns, ep, eventID string) string {
	t.Helper()
	return publishDeliveryTo(t, ns, ep, eventID, layout.For(ns).QueueSubject(ep))
}

func publishDeliveryTo(t *testing.T, ns, ep, eventID, subject string) string {
	t.Helper()
	id := records.DeliveryID(eventID, ns, ep)
	msg := nats.NewMsg(subject)
	setMeta(msg, ns, ep, eventID)
	msg.Data = []byte(`{"id":"` + eventID + `"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := testJS.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	return id
}

// scheduleRetry writes one retry due far in the future, as a dispatcher would after a failure.
func scheduleRetry(t *testing.T, ns, ep, eventID string) string {
	t.Helper()
	id := records.DeliveryID(eventID, ns, ep)
	msg := nats.NewMsg(layout.For(ns).RetrySubject(ep, id))
	setMeta(msg, ns, ep, eventID)
	msg.Header.Set("Nats-Schedule", "@at "+time.Now().Add(24*time.Hour).UTC().Format(time.RFC3339))
	msg.Header.Set("Nats-Schedule-Target", layout.For(ns).DeliverySubject(ep))
	msg.Data = []byte(`{"id":"` + eventID + `"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := testJS.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	return id
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }

func setMeta(msg *nats.Msg, ns, ep, eventID string) {
	records.SetDeliveryMeta(msg.Header, records.DeliveryMeta{
		DeliveryID: records.DeliveryID(eventID, ns, ep), EventID: eventID, EventType: "order.created",
		Namespace: ns, Endpoint: ep, Created: time.Now(), Attempts: 1,
	})
}

func hasPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}
