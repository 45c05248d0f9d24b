package dispatcher_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"k8s.io/client-go/util/retry"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

var cp *testenv.ControlPlane

// refusals are the operations NATS refused the dispatchers of this process, as they log them
// (opconfig.RefusedMessage). Tests run one at a time: newEnv fails a test during which one
// was refused.
var refusals struct {
	sync.Mutex
	lines []string
}

func TestMain(m *testing.M) {
	ctrllog.SetLogger(funcr.New(func(prefix, args string) {
		if strings.Contains(args, opconfig.RefusedMessage) {
			refusals.Lock()
			refusals.lines = append(refusals.lines, records.Bound(args, 512))
			refusals.Unlock()
		}
	}, funcr.Options{}))
	var err error
	cp, err = testenv.StartControlPlane()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = cp.Stop()
	if binary != "" {
		// The operator binary the process-level tests built (operatorBinary).
		_ = os.RemoveAll(filepath.Dir(binary))
	}
	os.Exit(code)
}

// env is one test's world: a namespace, a JetStream server with the operator's streams, and
// what the controller would have created (consumers, signing Secrets, the dispatcher's
// ServiceAccount). The server runs in auth-callout mode, as every installation does: the
// test's own connection (js) is the controller's JetStream admin, while dispatchers connect
// with their ServiceAccount's token and get the namespace's dispatcher permissions only,
// which never include creating a consumer.
type env struct {
	t    testing.TB
	ns   string
	nats *testenv.NATS
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  opconfig.Config
	set  streams.Set // the namespace's streams and bucket
	k8s  client.Client
}

func newEnv(t testing.TB) *env {
	t.Helper()
	n, js := testenv.NewCalloutNATS(t, nil)
	nc := js.Conn()
	svc, err := n.Auth.CalloutService(&natsauth.Kube{Client: kubernetes.NewForConfigOrDie(cp.Config), Audience: natsauth.DefaultAudience,
		Dispatchers: controllers.DispatcherServiceAccounts(cp.Client), SourceConsumers: controllers.SourceConsumers(cp.Client, streams.DefaultNames(), true)}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	n.ServeCallout(t, svc)
	refusals.Lock()
	seen := len(refusals.lines)
	refusals.Unlock()
	t.Cleanup(func() {
		refusals.Lock()
		defer refusals.Unlock()
		if got := refusals.lines[seen:]; len(got) > 0 {
			t.Errorf("NATS refused a dispatcher %d operations its bus identity may not do:\n%s", len(got), strings.Join(got, "\n"))
		}
	})
	cfg := opconfig.Default()
	cfg.NATS.URL = n.URL()
	cfg.NATS.AllowPlaintextTokens = true // the test's server is on loopback, without TLS
	cfg.AllowHTTP = true
	cfg.AllowedCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	cfg.MaxEventBytes = 64 << 10
	e := &env{t: t, nats: n, nc: nc, js: js, cfg: cfg, k8s: cp.Client}
	return e.sibling()
}

// dispatcherToken creates the shared dispatcher's ServiceAccount of namespace ns as the
// controller does (labelled as its own) and writes a token of it, of the NATS audience, to a
// file, as the kubelet projects it.
func dispatcherToken(t testing.TB, ns string) (file string) {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: names.SharedDispatcher, Labels: map[string]string{
		names.LabelName: names.LabelNameValue, names.LabelManagedBy: names.LabelManagedByValue, names.LabelDispatcher: names.SharedDispatcher}}}
	if err := cp.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	seconds := int64(3600)
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{natsauth.DefaultAudience}, ExpirationSeconds: &seconds}}
	if err := cp.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatal(err)
	}
	file = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// endpoint creates a WebhookEndpoint with its signing Secret and consumer, as the controller
// would. It returns the signing secret.
func (e *env) endpoint(name string, spec v1alpha1.WebhookEndpointSpec) string {
	e.t.Helper()
	ctx := context.Background()
	secret := newSecret()
	if spec.Signing == nil {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: names.SigningSecret(name),
			Annotations: map[string]string{consent.AllowedEndpoints: name}}, StringData: map[string]string{names.SigningSecretKey: secret}}
		if err := e.k8s.Create(ctx, s); err != nil {
			e.t.Fatal(err)
		}
	}
	if len(spec.EventTypes) == 0 {
		spec.EventTypes = []v1alpha1.EventTypePattern{">"}
	}
	ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name}, Spec: spec}
	if err := e.k8s.Create(ctx, ep); err != nil {
		e.t.Fatal(err)
	}
	e.consumers(ep)
	return secret
}

// consumers creates (or updates) what the endpoint is delivered through, as the controller
// does: on the shared lane the namespace's intake and queue consumers (once), on its own lane
// its durable consumers on the deliveries stream and on the events stream.
func (e *env) consumers(ep *v1alpha1.WebhookEndpoint) {
	e.t.Helper()
	ctx := context.Background()
	if streams.LaneOf(&ep.Spec) == streams.LaneShared {
		if err := e.set.EnsureSharedLane(ctx, e.js, ep.CreationTimestamp.Time); err != nil {
			e.t.Fatal(err)
		}
		if ep.Status.SharedSince == nil {
			patch := client.MergeFrom(ep.DeepCopy())
			ep.Status.SharedSince = &ep.CreationTimestamp
			if err := e.k8s.Status().Patch(ctx, ep, patch); err != nil {
				e.t.Fatal(err)
			}
		}
		return
	}
	e.ownConsumers(ep)
}

// ownConsumers creates the endpoint's durable consumers of its own, on the deliveries stream
// and on the events stream from its creation on: its own lane's, or those a version before the
// shared lane made for every endpoint.
func (e *env) ownConsumers(ep *v1alpha1.WebhookEndpoint) {
	e.t.Helper()
	ctx := context.Background()
	opts := streams.EndpointConsumerOptionsFor(&ep.Spec)
	if err := e.set.EnsureDeliveriesConsumer(ctx, e.js, ep.Name, opts); err != nil {
		e.t.Fatal(err)
	}
	start := streams.ConsumerStart{Time: ep.CreationTimestamp.Time}
	if err := e.set.EnsureEventsConsumer(ctx, e.js, e.ns, ep.Name, streams.EventPatterns(&ep.Spec), opts, start); err != nil {
		e.t.Fatal(err)
	}
}

// dispatcher runs a dispatcher in this process until the test ends or stop is called.
func (e *env) dispatcher(identity string, mutate ...func(*dispatcher.Options)) (stop func()) {
	e.t.Helper()
	o := dispatcher.Options{
		Namespace: e.ns, Config: e.cfg, Identity: identity, RestConfig: cp.Config,
		StatusInterval: 200 * time.Millisecond, HealthFlushInterval: 100 * time.Millisecond, LeaseTTL: 3 * time.Second,
		ShutdownGrace: 5 * time.Second, Registry: prometheus.NewRegistry(), Logger: quietLogger(e.t),
	}
	for _, m := range mutate {
		m(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	e.t.Logf("dispatcher %s starting at %s", identity, time.Now().Format("15:04:05.000"))
	go func() { done <- dispatcher.Run(ctx, o) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					e.t.Errorf("dispatcher %s: %v", identity, err)
				}
			case <-time.After(30 * time.Second):
				e.t.Errorf("dispatcher %s did not stop", identity)
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

func quietLogger(t testing.TB) logr.Logger {
	if os.Getenv("DISPATCHER_TEST_LOG") != "" {
		return testr.NewWithInterface(t, testr.Options{Verbosity: 1})
	}
	return logr.Discard()
}

// publish publishes an event as a producer would.
func (e *env) publish(eventType, id string, body []byte, hdr ...string) uint64 {
	e.t.Helper()
	msg := nats.NewMsg(e.set.EventSubject(eventType))
	if id != "" {
		msg.Header.Set(records.HeaderMsgID, id)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		msg.Header.Set(hdr[i], hdr[i+1])
	}
	msg.Data = body
	ack, err := e.js.PublishMsg(context.Background(), msg)
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

func (e *env) get(name string) *v1alpha1.WebhookEndpoint {
	e.t.Helper()
	var ep v1alpha1.WebhookEndpoint
	if err := e.k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: name}, &ep); err != nil {
		e.t.Fatal(err)
	}
	return &ep
}

// updateSpec changes an endpoint's spec, retrying when the dispatcher's status writes
// changed the object in between.
func (e *env) updateSpec(name string, change func(*v1alpha1.WebhookEndpointSpec)) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ep := e.get(name)
		change(&ep.Spec)
		return e.k8s.Update(context.Background(), ep)
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// updateStatus changes endpoint name's status as the controller would, reading it again on
// a conflict (the dispatcher writes the status too).
func (e *env) updateStatus(name string, change func(*v1alpha1.WebhookEndpointStatus)) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ep := e.get(name)
		change(&ep.Status)
		return e.k8s.Status().Update(context.Background(), ep)
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// deadLetters reads every dead letter of the namespace.
func (e *env) deadLetters() []records.DeadLetter {
	e.t.Helper()
	return readAll(e.t, e.js, e.set.DeadLetterStream(), e.set.DeadLetterFilter(""), func(m jetstream.Msg) (records.DeadLetter, bool) {
		dl, err := records.ParseDeadLetter(m.Headers())
		return dl, err == nil
	})
}

// logRecords reads the delivery log of an endpoint (a message may hold several records).
func (e *env) logRecords(ep string) []records.LogRecord {
	e.t.Helper()
	var out []records.LogRecord
	for _, rs := range readAll(e.t, e.js, e.set.AttemptsStream(), e.set.AttemptSubject(ep), func(m jetstream.Msg) ([]records.LogRecord, bool) {
		return records.LogRecords(m.Data()), true
	}) {
		out = append(out, rs...)
	}
	return out
}

func readAll[T any](t testing.TB, js jetstream.JetStream, stream, filter string, parse func(jetstream.Msg) (T, bool)) []T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{FilterSubject: filter, AckPolicy: jetstream.AckNonePolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy, InactiveThreshold: 10 * time.Second, MemoryStorage: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = js.DeleteConsumer(context.Background(), stream, c.CachedInfo().Name) }()
	var out []T
	for {
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 {
			return out
		}
		b, err := c.Fetch(int(min(info.NumPending, 500)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			if v, ok := parse(m); ok {
				out = append(out, v)
			}
		}
		if ctx.Err() != nil {
			t.Fatal("reading the stream took too long")
		}
	}
}

// lazy defers building a failure message until it is printed.
type lazy func() string

func (l lazy) String() string { return l() }

// lazyN is a count computed when a failure message is printed.
type lazyN func() int

func (l lazyN) Format(f fmt.State, _ rune) { fmt.Fprint(f, l()) }

// newReceiver starts a webhook receiver on /hook (testenv.Receiver) that answers as respond
// says (nil: 200) and stops when the test ends.
func newReceiver(t testing.TB, respond testenv.Responder) *testenv.Receiver {
	return testenv.StartReceiver(t, testenv.ReceiverOptions{Respond: respond, Path: "/hook"})
}

func ptr[T any](v T) *T { return &v }

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func condition(ep *v1alpha1.WebhookEndpoint, t string) *metav1.Condition {
	for i := range ep.Status.Conditions {
		if ep.Status.Conditions[i].Type == t {
			return &ep.Status.Conditions[i]
		}
	}
	return nil
}

// dump describes the JetStream state, for failure messages.
func (e *env) dump() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var b strings.Builder
	fmt.Fprintf(&b, "\ndump at %s", time.Now().Format("15:04:05.000"))
	for _, s := range e.set.Streams() {
		st, err := e.js.Stream(ctx, s)
		if err != nil {
			fmt.Fprintf(&b, "\n%s: %v", s, err)
			continue
		}
		fmt.Fprintf(&b, "\n%s: msgs=%d", s, st.CachedInfo().State.Msgs)
		for cl := st.ListConsumers(ctx); ; {
			ci, ok := <-cl.Info()
			if !ok {
				break
			}
			fmt.Fprintf(&b, "\n  %s pending=%d ackPending=%d delivered=%d redelivered=%d waiting=%d", ci.Name, ci.NumPending, ci.NumAckPending, ci.Delivered.Stream, ci.NumRedelivered, ci.NumWaiting)
		}
	}
	return b.String()
}
