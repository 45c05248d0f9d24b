// Package autoscaling tests the dispatchers' optional autoscaling end to end on the control
// plane: the real `webhook-operator controller` process, logged in as a user bound to the
// generated ClusterRole only, renders KEDA ScaledObjects into a real kube-apiserver that
// serves a stand-in for KEDA's CRD (with the schema of the fields the controller sets), with a
// real nats-server; the tests play the autoscaler through the Deployments' scale subresource.
package autoscaling

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// scaledObjectSchema is the stand-in's schema: the fields of KEDA's ScaledObject (keda.sh
// v1alpha1) the controller sets, with KEDA's types (trigger metadata values are strings).
// Unknown fields are pruned, so a field KEDA does not know would not be stored.
const scaledObjectSchema = `
type: object
properties:
  spec:
    type: object
    required: [scaleTargetRef, triggers]
    properties:
      scaleTargetRef:
        type: object
        required: [name]
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          name: {type: string}
      pollingInterval: {type: integer, format: int32}
      cooldownPeriod: {type: integer, format: int32}
      minReplicaCount: {type: integer, format: int32}
      maxReplicaCount: {type: integer, format: int32}
      triggers:
        type: array
        items:
          type: object
          required: [type, metadata]
          properties:
            type: {type: string}
            name: {type: string}
            metadata:
              type: object
              additionalProperties: {type: string}
            authenticationRef:
              type: object
              required: [name]
              properties:
                name: {type: string}
  status:
    type: object
    x-kubernetes-preserve-unknown-fields: true
`

const (
	ns      = "shop"
	timeout = 60 * time.Second
	poll    = 100 * time.Millisecond
)

// TestDispatcherAutoscaling runs the controller three times on one control plane: without
// autoscaling, with it, and without it again.
//
//   - Off: the controller sets every dispatcher's replicas and removes a ScaledObject of its own
//     left from an earlier setting.
//   - On: every dispatcher with an endpoint whose deliveries spread across replicas
//     (BestEffort, not rate-limited, not suspended) gets a ScaledObject with one
//     nats-jetstream trigger per such endpoint (its consumer on the namespace's deliveries
//     stream), the Deployment's owner and labels, and the configured replicas as its minimum.
//     The controller hands the replicas it set over instead of resetting them, and no apply
//     of it changes them afterwards. A dispatcher left with no such endpoint loses its
//     ScaledObject and gets its replicas from the controller again.
//   - Off again: the ScaledObjects go and the controller sets the replicas.
func TestDispatcherAutoscaling(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane and builds the operator")
	}
	g := NewWithT(t)
	ctx := context.Background()
	cp, err := testenv.StartControlPlane()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = cp.Stop() })
	schema := &apiextensionsv1.JSONSchemaProps{}
	g.Expect(yaml.Unmarshal([]byte(scaledObjectSchema), schema)).To(Succeed())
	g.Expect(cp.InstallCRDs(testenv.StandInCRD(controllers.ScaledObjectGVK, schema))).To(Succeed())
	natsSrv := testenv.NewNATS(t)
	k8s := cp.Client

	dir := t.TempDir()
	bin := filepath.Join(dir, "webhook-operator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/webhook-operator")
	build.Dir = testenv.Root()
	out, err := build.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "go build: %s", out)
	user, err := cp.ControllerUser(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	kc, err := user.KubeConfig()
	g.Expect(err).NotTo(HaveOccurred())
	kubeconfig := filepath.Join(dir, "kubeconfig")
	g.Expect(os.WriteFile(kubeconfig, kc, 0o600)).To(Succeed())
	run := func(args ...string) func() {
		return startController(t, bin, dir, append([]string{"--kubeconfig=" + kubeconfig, "--nats-url=" + natsSrv.URL(),
			"--dispatcher-image=registry.example/webhook-operator:test", "--dispatcher-replicas=2"}, args...)...)
	}
	autoscaling := []string{"--autoscaling", "--autoscaling-nats-monitoring-endpoint=nats.nats.svc:8222",
		"--autoscaling-max-replicas=8", "--autoscaling-lag-threshold=500", "--autoscaling-polling-interval=10s"}

	for _, name := range []string{ns, "elsewhere"} {
		g.Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	}
	// A ScaledObject the controller rendered under an earlier setting, its dispatcher gone.
	stale := scaledObject("elsewhere", names.SharedDispatcher)
	stale.SetLabels(map[string]string{names.LabelName: names.LabelNameValue, names.LabelManagedBy: names.LabelManagedByValue})
	g.Expect(unstructured.SetNestedMap(stale.Object, map[string]any{
		"scaleTargetRef": map[string]any{"name": names.SharedDispatcher},
		"triggers":       []any{map[string]any{"type": "cpu", "metadata": map[string]any{"value": "50"}}},
	}, "spec")).To(Succeed())
	g.Expect(k8s.Create(ctx, stale)).To(Succeed())

	shared, hot, limited := names.SharedDispatcher, names.DedicatedDispatcher("hot"), names.DedicatedDispatcher("limited")

	// Off.
	stop := run()
	for _, ep := range []*v1alpha1.WebhookEndpoint{
		endpoint("orders"),
		endpoint("ledger", func(e *v1alpha1.WebhookEndpoint) {
			e.Spec.Ordering = &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{JSONField: "data.id"}}
		}),
		endpoint("hot", func(e *v1alpha1.WebhookEndpoint) { e.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true} }),
		endpoint("limited", func(e *v1alpha1.WebhookEndpoint) {
			e.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true}
			e.Spec.RateLimit = &v1alpha1.RateLimitSpec{RequestsPerSecond: 10}
		}),
	} {
		g.Expect(k8s.Create(ctx, ep)).To(Succeed())
	}
	for _, name := range []string{shared, hot, limited} {
		g.Eventually(func() int32 { return replicas(ctx, k8s, name) }, timeout, poll).Should(Equal(int32(2)), "replicas of %s", name)
	}
	g.Eventually(func() bool { return exists(ctx, k8s, stale) }, timeout, poll).Should(BeFalse(),
		"a ScaledObject of the controller's is left while autoscaling is off")
	for _, name := range []string{shared, hot, limited} {
		g.Expect(exists(ctx, k8s, scaledObject(ns, name))).To(BeFalse(), "ScaledObject %s while autoscaling is off", name)
	}
	stop()

	// On.
	stop = run(autoscaling...)
	g.Eventually(func() []any { return triggers(ctx, k8s, shared) }, timeout, poll).Should(HaveLen(1))
	so := get(ctx, t, k8s, shared)
	g.Expect(so.Object["spec"]).To(Equal(map[string]any{
		"scaleTargetRef":  map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": shared},
		"pollingInterval": int64(10), "minReplicaCount": int64(2), "maxReplicaCount": int64(8),
		"triggers": []any{map[string]any{"type": "nats-jetstream", "name": "orders", "metadata": map[string]any{
			"natsServerMonitoringEndpoint": "nats.nats.svc:8222", "useHttps": "false", "account": "$G",
			"stream": "WEBHOOKS_shop", "consumer": "ep_shop_orders", "lagThreshold": "500",
		}}},
	}), "the PerKey endpoint ledger is delivered by one replica and is no trigger")
	g.Expect(so.GetLabels()).To(HaveKeyWithValue(names.LabelDispatcher, shared))
	g.Expect(so.GetOwnerReferences()).To(BeEmpty(), "the shared dispatcher's objects have no owner")
	// Handed over: the replicas the controller had set stay until the autoscaler changes them.
	g.Expect(replicas(ctx, k8s, shared)).To(Equal(int32(2)))

	g.Eventually(func() []any { return triggers(ctx, k8s, hot) }, timeout, poll).Should(HaveLen(1))
	owners := get(ctx, t, k8s, hot).GetOwnerReferences()
	g.Expect(owners).To(HaveLen(1))
	g.Expect(owners[0].Kind).To(Equal("WebhookEndpoint"))
	g.Expect(owners[0].Name).To(Equal("hot"))
	g.Expect(owners[0].Controller).To(Equal(ptr(true)), "a dedicated dispatcher's ScaledObject goes with its endpoint")
	g.Expect(exists(ctx, k8s, scaledObject(ns, limited))).To(BeFalse(), "a rate-limited endpoint is delivered by one replica")
	g.Expect(replicas(ctx, k8s, limited)).To(Equal(int32(2)))

	// The autoscaler scales hot to 5; an apply of the controller's (new resources in the
	// endpoint's spec, so a new pod template) leaves them so.
	scale(ctx, t, k8s, hot, 5)
	g.Expect(updateEndpoint(ctx, k8s, ns, "hot", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Dispatcher.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("300m")}}
	})).To(Succeed())
	g.Eventually(func() string {
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: hot}, d); err != nil {
			return err.Error()
		}
		return d.Spec.Template.Spec.Containers[0].Resources.Requests.Cpu().String()
	}, timeout, poll).Should(Equal("300m"))
	g.Expect(replicas(ctx, k8s, hot)).To(Equal(int32(5)), "the controller set the replicas of an autoscaled Deployment")

	// A new BestEffort endpoint on the shared dispatcher is a second trigger.
	scale(ctx, t, k8s, shared, 4)
	g.Expect(k8s.Create(ctx, endpoint("refunds"))).To(Succeed())
	g.Eventually(func() []any { return triggers(ctx, k8s, shared) }, timeout, poll).Should(HaveLen(2))
	g.Expect(replicas(ctx, k8s, shared)).To(Equal(int32(4)))

	// Suspended, neither spreads: the ScaledObject goes and the controller sets the replicas.
	for _, name := range []string{"orders", "refunds"} {
		g.Expect(updateEndpoint(ctx, k8s, ns, name, func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Suspend = true })).To(Succeed())
	}
	g.Eventually(func() bool { return exists(ctx, k8s, scaledObject(ns, shared)) }, timeout, poll).Should(BeFalse())
	g.Eventually(func() int32 { return replicas(ctx, k8s, shared) }, timeout, poll).Should(Equal(int32(2)))
	// Resumed: autoscaled again, from the controller's replicas.
	g.Expect(updateEndpoint(ctx, k8s, ns, "orders", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Suspend = false })).To(Succeed())
	g.Eventually(func() []any { return triggers(ctx, k8s, shared) }, timeout, poll).Should(HaveLen(1))
	g.Expect(replicas(ctx, k8s, shared)).To(Equal(int32(2)))
	stop()

	// Off again.
	stop = run()
	defer stop()
	for _, name := range []string{shared, hot} {
		g.Eventually(func() bool { return exists(ctx, k8s, scaledObject(ns, name)) }, timeout, poll).Should(BeFalse(),
			"ScaledObject %s after autoscaling was turned off", name)
	}
	g.Eventually(func() int32 { return replicas(ctx, k8s, hot) }, timeout, poll).Should(Equal(int32(2)))
}

// startController runs `webhook-operator controller args...` (its log in dir) until the
// returned stop is called, and waits until it is ready.
func startController(t *testing.T, bin, dir string, args ...string) (stop func()) {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.OpenFile(filepath.Join(dir, "controller.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"controller", "--metrics-bind-address=0", "--leader-elect=false",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", port)}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = log.Close()
	}
	t.Cleanup(stop)
	ready := func() error {
		select {
		case <-done:
			b, _ := os.ReadFile(log.Name())
			return StopTrying(fmt.Sprintf("the controller exited:\n%s", b))
		default:
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	}
	NewWithT(t).Eventually(ready, timeout, poll).Should(Succeed())
	return stop
}

// endpoint is a valid endpoint of the test's namespace; change adjusts it.
func endpoint(name string, change ...func(*v1alpha1.WebhookEndpoint)) *v1alpha1.WebhookEndpoint {
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

// scaledObject is an empty ScaledObject to read, create or delete.
func scaledObject(namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(controllers.ScaledObjectGVK)
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

func exists(ctx context.Context, c client.Client, o *unstructured.Unstructured) bool {
	err := c.Get(ctx, client.ObjectKeyFromObject(o), o.DeepCopy())
	return !apierrors.IsNotFound(err)
}

func get(ctx context.Context, t *testing.T, c client.Client, name string) *unstructured.Unstructured {
	t.Helper()
	so := scaledObject(ns, name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(so), so); err != nil {
		t.Fatal(err)
	}
	return so
}

// triggers are the triggers of a dispatcher's ScaledObject (none when it has none).
func triggers(ctx context.Context, c client.Client, name string) []any {
	so := scaledObject(ns, name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(so), so); err != nil {
		return nil
	}
	tr, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	return tr
}

// replicas are a dispatcher Deployment's (-1 while it does not exist).
func replicas(ctx context.Context, c client.Client, name string) int32 {
	d := &appsv1.Deployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d); err != nil || d.Spec.Replicas == nil {
		return -1
	}
	return *d.Spec.Replicas
}

// scale sets a Deployment's replicas through its scale subresource, as the HPA does.
func scale(ctx context.Context, t *testing.T, c client.Client, name string, n int32) {
	t.Helper()
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	s := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: n}}
	if err := c.SubResource("scale").Update(ctx, d, client.WithSubResourceBody(s)); err != nil {
		t.Fatalf("scaling %s to %d: %v", name, n, err)
	}
	if got := replicas(ctx, c, name); got != n {
		t.Fatalf("scaled %s to %d, it has %d", name, n, got)
	}
}

func ptr[T any](v T) *T { return &v }

// updateEndpoint changes an endpoint's spec, reading it again when the controller's status
// patch got in between (a conflict).
func updateEndpoint(ctx context.Context, k8s client.Client, ns, name string, change func(*v1alpha1.WebhookEndpoint)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var ep v1alpha1.WebhookEndpoint
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &ep); err != nil {
			return err
		}
		change(&ep)
		return k8s.Update(ctx, &ep)
	})
}
