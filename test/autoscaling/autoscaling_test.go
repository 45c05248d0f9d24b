// Package autoscaling tests the dispatchers' optional autoscaling end to end on the control
// plane: the real `webhook-operator controller` process, logged in as a user bound to the
// generated ClusterRole only, renders KEDA ScaledObjects into a real kube-apiserver that
// serves a stand-in for KEDA's CRD (with the schema of the fields the controller sets), with a
// real nats-server; the tests play the autoscaler through the Deployments' scale subresource.
package autoscaling

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
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
	"github.com/webhook-operator/webhook-operator/internal/streams"
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
	many    = "many"
	timeout = 60 * time.Second
	poll    = 100 * time.Millisecond
)

// TestDispatcherAutoscaling runs the controller three times on one control plane, under the
// admission policy (config/admission): without autoscaling, with it, and without it again.
//
//   - Off: the controller sets every dispatcher's replicas and removes a ScaledObject of its own
//     left from an earlier setting.
//   - On: every dispatcher with an endpoint whose deliveries spread across replicas
//     (BestEffort, not rate-limited, not suspended) gets a ScaledObject with two
//     nats-jetstream triggers per such endpoint (its consumers on the namespace's events
//     stream and on its deliveries stream), every such endpoint, more than ten included, the
//     Deployment's owner and labels, and the configured replicas as its minimum. Playing KEDA
//     and its HPA from the triggers (the real nats-server's monitoring endpoint), a backlog
//     held in the deliveries stream alone scales the dispatcher up, and working it off scales
//     it back down. A dedicated dispatcher scales up to the installation's cap on its replicas
//     and its namespace's WebhookQuota dedicatedDispatchers.maxReplicas at most. The controller hands the replicas it set over instead of resetting them,
//     and no apply of it changes them afterwards. A dispatcher left with no such endpoint
//     loses its ScaledObject and gets its replicas from the controller again.
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
	natsSrv := testenv.NewMonitoredNATS(t)
	k8s := cp.Client

	dir := t.TempDir()
	bin := filepath.Join(dir, "webhook-operator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/webhook-operator")
	build.Dir = testenv.Root()
	out, err := build.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "go build: %s", out)
	user, err := cp.ControllerUser(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	// Under the admission policy: every ScaledObject and Deployment it writes has the shape it
	// may write.
	const image = "registry.example/webhook-operator:test"
	g.Expect(cp.InstallAdmissionPolicy(ctx, user.Config(), "webhook-operator-controller", image, "default")).To(Succeed())
	kc, err := user.KubeConfig()
	g.Expect(err).NotTo(HaveOccurred())
	kubeconfig := filepath.Join(dir, "kubeconfig")
	g.Expect(os.WriteFile(kubeconfig, kc, 0o600)).To(Succeed())
	run := func(args ...string) func() {
		return startController(t, bin, dir, append([]string{"--kubeconfig=" + kubeconfig, "--nats-url=" + natsSrv.URL(),
			"--dispatcher-image=" + image, "--dispatcher-replicas=2"}, args...)...)
	}
	monitoring := natsSrv.MonitoringEndpoint()
	autoscaling := []string{"--autoscaling", "--autoscaling-nats-monitoring-endpoint=" + monitoring,
		"--autoscaling-max-replicas=8", "--autoscaling-lag-threshold=500", "--autoscaling-polling-interval=10s",
		"--dispatcher-max-replicas=7"}

	for _, name := range []string{ns, "elsewhere", many} {
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
	g.Eventually(func() []any { return triggers(ctx, k8s, shared) }, timeout, poll).Should(HaveLen(2))
	so := get(ctx, t, k8s, shared)
	trigger := func(name, stream, consumer string) map[string]any {
		return map[string]any{"type": "nats-jetstream", "name": name, "metadata": map[string]any{
			"natsServerMonitoringEndpoint": monitoring, "useHttps": "false", "account": "$G",
			"stream": stream, "consumer": consumer, "lagThreshold": "500",
		}}
	}
	g.Expect(so.Object["spec"]).To(Equal(map[string]any{
		"scaleTargetRef":  map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": shared},
		"pollingInterval": int64(10), "minReplicaCount": int64(2), "maxReplicaCount": int64(8),
		"triggers": []any{trigger("intake", "WEBHOOKS_shop", "in_shop"), trigger("queue", "WEBHOOKS_DELIVERIES_shop", "q_shop")},
	}), "the shared lane's two consumers are the triggers; the PerKey endpoint ledger is delivered by one replica and is no trigger")
	g.Expect(so.GetLabels()).To(HaveKeyWithValue(names.LabelDispatcher, shared))
	g.Expect(so.GetOwnerReferences()).To(BeEmpty(), "the shared dispatcher's objects have no owner")
	// Handed over: the replicas the controller had set stay until the autoscaler changes them.
	g.Expect(replicas(ctx, k8s, shared)).To(Equal(int32(2)))

	// A backlog held in the deliveries stream alone: 2,600 deliveries of orders on its queue
	// (retries, replays, deliveries brought back; no event waiting) ask for ceil(2600/500) = 6
	// replicas.
	nc, js, err := natsSrv.Connect()
	g.Expect(err).NotTo(HaveOccurred())
	defer nc.Close()
	set := streams.DefaultNames().For(ns)
	g.Eventually(func() error {
		_, err := js.Consumer(ctx, set.DeliveriesStream(), set.QueueConsumer())
		return err
	}, timeout, poll).Should(Succeed(), "the queue consumer of the namespace")
	const backlog = 2600
	for i := range backlog {
		_, err := js.PublishAsync(set.QueueSubject("orders"), []byte(fmt.Sprintf(`{"n":%d}`, i)))
		g.Expect(err).NotTo(HaveOccurred())
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(timeout):
		t.Fatal("the backlog was not stored")
	}
	lags, err := autoscale(ctx, k8s, ns, shared)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lags).To(Equal(map[string]int64{"intake": 0, "queue": backlog}))
	g.Expect(replicas(ctx, k8s, shared)).To(Equal(int32(6)), "a backlog in the deliveries stream alone scales the dispatcher")
	// The dispatcher works it off: the lag goes to 0 and the replicas back to the minimum.
	cons, err := js.Consumer(ctx, set.DeliveriesStream(), set.QueueConsumer())
	g.Expect(err).NotTo(HaveOccurred())
	for done := 0; done < backlog; {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		g.Expect(err).NotTo(HaveOccurred())
		for m := range batch.Messages() {
			g.Expect(m.Ack()).To(Succeed())
			done++
		}
		g.Expect(batch.Error()).NotTo(HaveOccurred())
	}
	g.Eventually(func() (map[string]int64, error) { return autoscale(ctx, k8s, ns, shared) }, timeout, poll).
		Should(Equal(map[string]int64{"intake": 0, "queue": 0}))
	g.Expect(replicas(ctx, k8s, shared)).To(Equal(int32(2)), "the worked-off backlog leaves the minimum")

	// Twelve endpoints on the shared lane: still the two triggers (KEDA's calls do not grow
	// with endpoints).
	for i := range 12 {
		ep := endpoint(fmt.Sprintf("ep-%02d", i))
		ep.Namespace = many
		g.Expect(k8s.Create(ctx, ep)).To(Succeed())
	}
	g.Eventually(func() []string { return triggerNames(ctx, k8s, many, shared) }, timeout, poll).Should(ConsistOf("intake", "queue"))

	g.Eventually(func() []any { return triggers(ctx, k8s, hot) }, timeout, poll).Should(HaveLen(2))
	owners := get(ctx, t, k8s, hot).GetOwnerReferences()
	g.Expect(owners).To(HaveLen(1))
	g.Expect(owners[0].Kind).To(Equal("WebhookEndpoint"))
	g.Expect(owners[0].Name).To(Equal("hot"))
	g.Expect(owners[0].Controller).To(Equal(ptr(true)), "a dedicated dispatcher's ScaledObject goes with its endpoint")
	// A dedicated dispatcher scales within the installation's cap on its replicas (7, below
	// the autoscaling maximum of 8 the shared one has), and within its namespace's WebhookQuota
	// when that is lower; without the quota, the cap again.
	g.Expect(maxReplicaCount(ctx, k8s, hot)).To(Equal(int64(7)), "a dedicated dispatcher's ScaledObject above --dispatcher-max-replicas")
	q := &v1alpha1.WebhookQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.QuotaName},
		Spec: v1alpha1.WebhookQuotaSpec{DedicatedDispatchers: &v1alpha1.DedicatedDispatcherQuota{MaxReplicas: ptr(int32(6))}}}
	g.Expect(k8s.Create(ctx, q)).To(Succeed())
	g.Eventually(func() int64 { return maxReplicaCount(ctx, k8s, hot) }, timeout, poll).Should(Equal(int64(6)),
		"a dedicated dispatcher's ScaledObject above its WebhookQuota's dedicatedDispatchers.maxReplicas")
	g.Expect(maxReplicaCount(ctx, k8s, shared)).To(Equal(int64(8)), "the quota bounds dedicated dispatchers only")
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

	g.Expect(k8s.Delete(ctx, q)).To(Succeed())
	g.Eventually(func() int64 { return maxReplicaCount(ctx, k8s, hot) }, timeout, poll).Should(Equal(int64(7)),
		"the cap after the quota was deleted")

	// A new BestEffort endpoint on the shared dispatcher brings no trigger of its own.
	scale(ctx, t, k8s, shared, 4)
	g.Expect(k8s.Create(ctx, endpoint("refunds"))).To(Succeed())
	g.Eventually(func() bool { return sharedLane(ctx, k8s, ns, "refunds") }, timeout, poll).Should(BeTrue())
	g.Expect(triggerNames(ctx, k8s, ns, shared)).To(Equal([]string{"intake", "queue"}))
	g.Expect(replicas(ctx, k8s, shared)).To(Equal(int32(4)))

	// Suspended, neither spreads: the ScaledObject goes and the controller sets the replicas.
	for _, name := range []string{"orders", "refunds"} {
		g.Expect(updateEndpoint(ctx, k8s, ns, name, func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Suspend = true })).To(Succeed())
	}
	g.Eventually(func() bool { return exists(ctx, k8s, scaledObject(ns, shared)) }, timeout, poll).Should(BeFalse())
	g.Eventually(func() int32 { return replicas(ctx, k8s, shared) }, timeout, poll).Should(Equal(int32(2)))
	// Resumed: autoscaled again, from the controller's replicas.
	g.Expect(updateEndpoint(ctx, k8s, ns, "orders", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.Suspend = false })).To(Succeed())
	g.Eventually(func() []any { return triggers(ctx, k8s, shared) }, timeout, poll).Should(HaveLen(2))
	g.Expect(replicas(ctx, k8s, shared)).To(Equal(int32(2)))
	stop()

	// Off again.
	stop = run()
	defer stop()
	for _, so := range []*unstructured.Unstructured{scaledObject(ns, shared), scaledObject(ns, hot), scaledObject(many, shared)} {
		g.Eventually(func() bool { return exists(ctx, k8s, so) }, timeout, poll).Should(BeFalse(),
			"ScaledObject %s/%s after autoscaling was turned off", so.GetNamespace(), so.GetName())
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
	cmd := exec.Command(bin, append([]string{"controller", "--metrics-bind-address=0", "--metrics-secure=false", "--leader-elect=false",
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

// maxReplicaCount is the maxReplicaCount of a dispatcher's ScaledObject (0 when it has none).
func maxReplicaCount(ctx context.Context, c client.Client, name string) int64 {
	so := scaledObject(ns, name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(so), so); err != nil {
		return 0
	}
	n, _, _ := unstructured.NestedInt64(so.Object, "spec", "maxReplicaCount")
	return n
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

// triggerNames are the names of the triggers of a dispatcher's ScaledObject in namespace.
func triggerNames(ctx context.Context, c client.Client, namespace, name string) []string {
	so := scaledObject(namespace, name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(so), so); err != nil {
		return nil
	}
	tr, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	var out []string
	for _, t := range tr {
		n, _, _ := unstructured.NestedString(t.(map[string]any), "name")
		out = append(out, n)
	}
	return out
}

// autoscale plays KEDA and the HPA it makes, once, for a dispatcher's ScaledObject: it reads
// each trigger's lag as KEDA's nats-jetstream scaler does (the /jsz answer of the trigger's
// monitoring endpoint for its account; the pending plus unacknowledged deliveries of its
// consumer, the stream's last sequence when the consumer is missing), takes the replicas the
// busiest trigger asks for (ceil(lag / lagThreshold), what the HPA settles on for an
// AverageValue target) within the ScaledObject's bounds, and sets them through the
// Deployment's scale subresource. It returns the lags by trigger name.
func autoscale(ctx context.Context, c client.Client, namespace, name string) (map[string]int64, error) {
	so := scaledObject(namespace, name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(so), so); err != nil {
		return nil, err
	}
	minimum, _, _ := unstructured.NestedInt64(so.Object, "spec", "minReplicaCount")
	maximum, _, _ := unstructured.NestedInt64(so.Object, "spec", "maxReplicaCount")
	tr, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
	lags := map[string]int64{}
	want := minimum
	for _, t := range tr {
		t := t.(map[string]any)
		md, _, _ := unstructured.NestedStringMap(t, "metadata")
		threshold, err := strconv.ParseInt(md["lagThreshold"], 10, 64)
		if err != nil {
			return nil, err
		}
		lag, err := consumerLag(ctx, md["natsServerMonitoringEndpoint"], md["account"], md["stream"], md["consumer"])
		if err != nil {
			return nil, err
		}
		lags[t["name"].(string)] = lag
		want = max(want, (lag+threshold-1)/threshold)
	}
	want = min(want, maximum)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	s := &autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: int32(want)}}
	return lags, c.SubResource("scale").Update(ctx, d, client.WithSubResourceBody(s))
}

// consumerLag reads a consumer's lag from a NATS server's monitoring endpoint as KEDA's
// nats-jetstream scaler does.
func consumerLag(ctx context.Context, endpoint, account, stream, consumer string) (int64, error) {
	u := fmt.Sprintf("http://%s/jsz?acc=%s&consumers=true&config=true", endpoint, url.QueryEscape(account))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var info server.JSInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return 0, fmt.Errorf("%s: %w", u, err)
	}
	for _, a := range info.AccountDetails {
		if a.Name != account {
			continue
		}
		for _, s := range a.Streams {
			if s.Name != stream {
				continue
			}
			for _, ci := range s.Consumer {
				if ci.Name == consumer {
					return int64(ci.NumPending) + int64(ci.NumAckPending), nil
				}
			}
			return int64(s.State.LastSeq), nil
		}
	}
	return 0, fmt.Errorf("%s has no stream %s in account %s", u, stream, account)
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

// sharedLane reports whether the controller put endpoint name of namespace on the shared lane.
func sharedLane(ctx context.Context, c client.Client, namespace, name string) bool {
	ep := &v1alpha1.WebhookEndpoint{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, ep); err != nil {
		return false
	}
	return ep.Status.Lane == streams.LaneShared.String()
}
