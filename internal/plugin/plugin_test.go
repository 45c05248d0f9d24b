package plugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/dataapi"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

var (
	cp         *testenv.ControlPlane
	kubeconfig string
	nsCounter  atomic.Int64
	// bus is the NATS server every test's namespace has its streams on, which the data API
	// server reads.
	bus *testenv.NATS
)

// dataAPIService is the Service the data API server is registered behind.
const dataAPIService = "webhook-operator-apiserver"

func TestMain(m *testing.M) {
	// The test binary doubles as a kubeconfig exec credential plugin.
	if tok := os.Getenv(execTokenEnv); tok != "" {
		fmt.Printf(`{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":%q}}`, tok)
		os.Exit(0)
	}
	// The data API server's own log is not the test's.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	code, err := runTests(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// runTests starts what every test shares: a control plane that aggregates, a NATS server, and
// the data API server in this process, registered as its APIService, through which the plugin
// reads, as it does in a cluster.
func runTests(m *testing.M) (int, error) {
	var err error
	if cp, err = testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{Aggregation: true}); err != nil {
		return 1, err
	}
	defer func() { _ = cp.Stop() }()
	dir, err := os.MkdirTemp("", "kubectl-webhooks-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(dir)
	if kubeconfig, err = cp.WriteKubeconfig(dir); err != nil {
		return 1, err
	}
	if bus, err = testenv.StartNATS(""); err != nil {
		return 1, err
	}
	defer bus.Cleanup()
	nc, js, err := bus.Connect()
	if err != nil {
		return 1, err
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	defer func() {
		cancel()
		<-done
	}()
	if err := startDataAPI(ctx, dir, &dataapi.Bus{NC: nc, JS: js, Streams: streams.DefaultConfig()}, done); err != nil {
		return 1, err
	}
	return m.Run(), nil
}

// startDataAPI runs the data API server on b until ctx ends (its end is sent on done) and
// registers it with the aggregator.
func startDataAPI(ctx context.Context, dir string, b *dataapi.Bus, done chan<- error) error {
	serving, err := testenv.WriteTLSFor(filepath.Join(dir, "serving"), testenv.APIServiceHost(dataAPIService))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	o := dataapi.NewOptions()
	o.SecureServing.Listener, o.SecureServing.BindPort = ln, port
	o.SecureServing.ServerCert.CertKey.CertFile, o.SecureServing.ServerCert.CertKey.KeyFile = serving.ServerCert, serving.ServerKey
	o.Kubeconfig = kubeconfig
	s, err := dataapi.New(o, b)
	if err != nil {
		_ = ln.Close()
		return err
	}
	go func() { done <- s.Run(ctx) }()
	ca, err := os.ReadFile(serving.CA)
	if err != nil {
		return err
	}
	return cp.RegisterAPIService(ctx, dataAPIService, datav1alpha1.GroupName, datav1alpha1.SchemeGroupVersion.Version, port, ca)
}

// env is one test's world: a namespace of its own on the shared control plane and NATS server.
type env struct {
	t    *testing.T
	ns   string
	nats *testenv.NATS
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  streams.Config
	// getenv is the environment the plugin sees.
	getenv map[string]string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	n := bus
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := streams.DefaultConfig()
	e := &env{t: t, ns: fmt.Sprintf("team-%d", nsCounter.Add(1)), nats: n, nc: nc, js: js, cfg: cfg, getenv: map[string]string{}}
	e.createNamespace(e.ns)
	return e
}

// createNamespace creates a namespace and its streams, as the controller does with the
// namespace's first endpoint.
func (e *env) createNamespace(name string) {
	e.t.Helper()
	if err := cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		e.t.Fatal(err)
	}
	if err := e.cfg.For(name).Ensure(context.Background(), e.js); err != nil {
		e.t.Fatal(err)
	}
}

// result is what one run of the plugin printed and returned.
type result struct {
	code        int
	out, errOut string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.errOut)
}

// run runs `kubectl webhooks args...` in-process, in the test's namespace, against its NATS.
func (e *env) run(args ...string) result {
	e.t.Helper()
	return e.runIn("", args...)
}

func (e *env) runIn(stdin string, args ...string) result {
	e.t.Helper()
	var out, errOut bytes.Buffer
	full := append([]string{"--kubeconfig", kubeconfig, "-n", e.ns, "--nats-url", e.nats.URL()}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code := plugin.Run(ctx, full, genericiooptions.IOStreams{In: strings.NewReader(stdin), Out: &out, ErrOut: &errOut},
		func(k string) string { return e.getenv[k] })
	return result{code: code, out: out.String(), errOut: errOut.String()}
}

// runRaw runs the plugin without the test's --nats-url.
func (e *env) runRaw(args ...string) result {
	e.t.Helper()
	var out, errOut bytes.Buffer
	full := append([]string{"--kubeconfig", kubeconfig, "-n", e.ns}, args...)
	code := plugin.Run(context.Background(), full, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
		func(k string) string { return e.getenv[k] })
	return result{code: code, out: out.String(), errOut: errOut.String()}
}

// must fails the test unless the run exited with code.
func (r result) must(t *testing.T, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %s", code, r)
	}
	return r
}

// decode parses the run's JSON output into v.
func (r result) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.out), v); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, r)
	}
}

// createEndpoint creates an endpoint in the test's namespace.
func (e *env) createEndpoint(name string) *v1alpha1.WebhookEndpoint {
	e.t.Helper()
	ep := &v1alpha1.WebhookEndpoint{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: v1alpha1.WebhookEndpointSpec{
			URL:        "https://receiver.example.com/" + name,
			EventTypes: []v1alpha1.EventTypePattern{"order.*"},
		},
	}
	if err := cp.Client.Create(context.Background(), ep); err != nil {
		e.t.Fatal(err)
	}
	return ep
}

// setStatus writes an endpoint's status as the controller and dispatcher would.
func (e *env) setStatus(name string, mutate func(*v1alpha1.WebhookEndpoint)) {
	e.t.Helper()
	ctx := context.Background()
	ep := &v1alpha1.WebhookEndpoint{}
	if err := cp.Client.Get(ctx, keyOf(e.ns, name), ep); err != nil {
		e.t.Fatal(err)
	}
	mutate(ep)
	if err := cp.Client.Status().Update(ctx, ep); err != nil {
		e.t.Fatal(err)
	}
}

// disable marks an endpoint auto-disabled, as the dispatcher does.
func (e *env) disable(name string, since time.Time) {
	e.setStatus(name, func(ep *v1alpha1.WebhookEndpoint) {
		meta.SetStatusCondition(&ep.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionDisabled, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonFailureRate,
			Message: "96% of 25 attempts failed in 72h", LastTransitionTime: metav1.NewTime(since),
		})
		if ep.Status.Health == nil {
			ep.Status.Health = &v1alpha1.DeliveryHealth{}
		}
		ep.Status.Health.DisabledSince = &metav1.Time{Time: since}
		ep.Status.Health.DisabledReason = "FailureRate: 96% of 25 attempts failed in 72h"
	})
}

// delivery is the metadata of a delivery of a fresh event to an endpoint, as the router makes it.
func (e *env) delivery(ep string, i int, created time.Time) records.DeliveryMeta {
	eventID := fmt.Sprintf("evt_%s_%d", ep, i)
	return records.DeliveryMeta{
		DeliveryID: records.DeliveryID(eventID, e.ns, ep),
		EventID:    eventID,
		EventType:  "order.created",
		EventTime:  created,
		EventSeq:   uint64(i + 1),
		Namespace:  e.ns,
		Endpoint:   ep,
		Created:    created,
	}
}

// stored writes and reads the records of namespace ns's streams, as testenv.Stored does.
func (e *env) stored(ns string) testenv.Stored {
	return testenv.Stored{T: e.t, JS: e.js, Set: e.cfg.For(ns)}
}

// writeAttempt appends a delivery-log record, as the dispatcher does after each attempt.
func (e *env) writeAttempt(ns string, rec records.LogRecord) uint64 {
	e.t.Helper()
	return e.stored(ns).Log(rec)
}

// writeDelivery puts a delivery on its endpoint's subject, as the router does.
func (e *env) writeDelivery(m records.DeliveryMeta, payload string) {
	e.t.Helper()
	e.writeTo(e.cfg.For(m.Namespace).DeliverySubject(m.Endpoint), m, payload)
}

// writeTo puts a delivery on subject of the deliveries stream (a queue, a park).
func (e *env) writeTo(subject string, m records.DeliveryMeta, payload string) {
	e.t.Helper()
	msg := nats.NewMsg(subject)
	msg.Header.Set(records.HeaderContentType, "application/json")
	records.SetDeliveryMeta(msg.Header, m)
	msg.Header.Set(records.HeaderMsgID, m.DeliveryID)
	msg.Data = []byte(payload)
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		e.t.Fatal(err)
	}
}

// writeRetry schedules a delivery's next attempt, as the dispatcher does after a failure.
func (e *env) writeRetry(m records.DeliveryMeta, due time.Time, payload string) {
	e.t.Helper()
	msg := nats.NewMsg(e.cfg.For(m.Namespace).RetrySubject(m.Endpoint, m.DeliveryID))
	msg.Header.Set("Nats-Schedule", "@at "+due.UTC().Format(time.RFC3339))
	msg.Header.Set("Nats-Schedule-Target", e.cfg.For(m.Namespace).DeliverySubject(m.Endpoint))
	msg.Header.Set(records.HeaderContentType, "application/json")
	records.SetDeliveryMeta(msg.Header, m)
	msg.Data = []byte(payload)
	if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
		e.t.Fatal(err)
	}
}

// writeDeadLetter dead-letters a delivery after its attempts, as the dispatcher does.
func (e *env) writeDeadLetter(m records.DeliveryMeta, attempts int, reason, payload string, at time.Time) records.DeadLetter {
	e.t.Helper()
	return e.stored(m.Namespace).DeadLetter(m, attempts, reason, payload, at, nil)
}

// subjectMsgs returns every message on subject in stream, oldest first.
func (e *env) subjectMsgs(stream, subject string) []*jetstream.RawStreamMsg {
	e.t.Helper()
	return e.stored(e.ns).Msgs(stream, subject)
}

func yamlValid(t *testing.T, r result) map[string]any {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(r.out), &v); err != nil || len(v) == 0 {
		t.Fatalf("output is not a YAML object: %v\n%s", err, r)
	}
	return v
}

func keyOf(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
