package dispatcher_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/nats-io/nats.go/jetstream"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// During a secret rotation both signatures are sent: a receiver that knows only the previous
// secret and one that knows only the new secret both verify every request (official library).
// A rotated Secret reaches the running dispatcher without a restart.
func TestSigningSecretRotation(t *testing.T) {
	e := newEnv(t)
	oldKey, newKey := newSecret(), newSecret()
	for name, v := range map[string]string{"sig-old": oldKey, "sig-new": newKey} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, Annotations: map[string]string{consent.AllowedEndpoints: "*"}},
			StringData: map[string]string{"secret": v}}
		if err := e.k8s.Create(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	oldOnly := newReceiver(t, nil)
	oldOnly.Trust(oldKey)
	newOnly := newReceiver(t, nil)
	newOnly.Trust(newKey)
	signing := &v1alpha1.SigningSpec{SecretRef: v1alpha1.SecretKeySelector{Name: "sig-new", Key: "secret"},
		PreviousSecretRef: &v1alpha1.SecretKeySelector{Name: "sig-old", Key: "secret"}}
	e.endpoint("old", v1alpha1.WebhookEndpointSpec{URL: oldOnly.URL(), Signing: signing})
	e.endpoint("new", v1alpha1.WebhookEndpointSpec{URL: newOnly.URL(), Signing: signing})
	e.dispatcher("d1")
	for i := range 5 {
		e.publish("a", fmt.Sprintf("evt_%d", i), []byte(`{"x":1}`))
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return oldOnly.Stats().Requests == 5 && newOnly.Stats().Requests == 5 }, "not delivered")
	if oldOnly.Stats().BadSignatures != 0 || newOnly.Stats().BadSignatures != 0 {
		t.Fatalf("during rotation a receiver could not verify: old-only %d bad, new-only %d bad", oldOnly.Stats().BadSignatures, newOnly.Stats().BadSignatures)
	}
	if sig := newOnly.Requests()[0].Header.Get("webhook-signature"); len(strings.Fields(sig)) != 2 {
		t.Errorf("want two signatures during rotation, got %q", sig)
	}

	// Rotation ends: the Secret sig-new gets a third value; the controller bumps secretsVersion.
	third := newSecret()
	var s corev1.Secret
	if err := e.k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "sig-new"}, &s); err != nil {
		t.Fatal(err)
	}
	s.Data = map[string][]byte{"secret": []byte(third)}
	if err := e.k8s.Update(context.Background(), &s); err != nil {
		t.Fatal(err)
	}
	e.updateStatus("new", func(st *v1alpha1.WebhookEndpointStatus) { st.SecretsVersion = "rotated" })
	thirdOnly := newReceiver(t, nil)
	thirdOnly.Trust(third)
	// The "new" endpoint now points at a receiver that knows only the third secret.
	e.updateSpec("new", func(s *v1alpha1.WebhookEndpointSpec) { s.URL = thirdOnly.URL() })
	testenv.Eventually(t, 10*time.Second, func() bool {
		e.publish("a", fmt.Sprintf("evt_probe_%d", time.Now().UnixNano()), []byte(`{}`))
		return thirdOnly.Stats().Requests > 0 && thirdOnly.Stats().BadSignatures < thirdOnly.Stats().Requests
	}, "the rotated secret was not used without a restart")
}

// spec.signing.rotationEndsAt ends the rotation when it says, not at the next resync minutes
// later: once the dispatcher has the end (set on a rotating endpoint), every request
// timestamped before it carries both signatures, every one from it on the current secret's
// alone, and a receiver that knows only the previous secret verifies no more of them.
func TestSigningRotationEndsAtRotationEndsAt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	oldKey, newKey := newSecret(), newSecret()
	for name, v := range map[string]string{"sig-old": oldKey, "sig-new": newKey} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, Annotations: map[string]string{consent.AllowedEndpoints: "*"}},
			StringData: map[string]string{"secret": v}}
		if err := e.k8s.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	rcv := newReceiver(t, nil)
	rcv.Trust(newKey)
	e.endpoint("rotating", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Headers: []v1alpha1.HTTPHeader{{Name: "X-Config", Value: "first"}},
		Signing: &v1alpha1.SigningSpec{SecretRef: v1alpha1.SecretKeySelector{Name: "sig-new", Key: "secret"},
			PreviousSecretRef: &v1alpha1.SecretKeySelector{Name: "sig-old", Key: "secret"}}})
	e.dispatcher("d1")
	e.publish("a", "evt_rotating", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return rcv.Stats().Requests == 1 }, "not delivered")

	// The rotation gets an end a few seconds away (the API keeps whole seconds); the header
	// tells the requests made with that configuration.
	end := time.Now().Truncate(time.Second).Add(4 * time.Second)
	ep := e.get("rotating")
	patch := client.MergeFrom(ep.DeepCopy())
	ep.Spec.Signing.RotationEndsAt = &metav1.Time{Time: end}
	ep.Spec.Headers = []v1alpha1.HTTPHeader{{Name: "X-Config", Value: "ending"}}
	if err := e.k8s.Patch(ctx, ep, patch); err != nil {
		t.Fatal(err)
	}
	// One event after another, until one was sent with the end a second after it.
	sent := 1
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, r := range rcv.Requests() {
			if ts, _ := strconv.ParseInt(r.Header.Get("webhook-timestamp"), 10, 64); ts > end.Unix() && r.Header.Get("X-Config") == "ending" {
				return true
			}
		}
		if rcv.Stats().Requests == sent {
			e.publish("a", fmt.Sprintf("evt_%03d", sent), []byte(`{}`))
			sent++
		}
		return false
	}, "no request after the rotation's end: %d sent", lazyN(func() int { return sent }))
	before, after := 0, 0
	for _, r := range rcv.Requests() {
		ts, err := strconv.ParseInt(r.Header.Get("webhook-timestamp"), 10, 64)
		if err != nil {
			t.Fatalf("%s: webhook-timestamp %q", r.ID, r.Header.Get("webhook-timestamp"))
		}
		sigs := strings.Fields(r.Header.Get("webhook-signature"))
		switch {
		case ts < end.Unix() && len(sigs) != 2:
			t.Errorf("%s, timestamped %ds before the rotation's end: %d signatures, want both", r.ID, end.Unix()-ts, len(sigs))
		case ts < end.Unix():
			before++
		case r.Header.Get("X-Config") != "ending":
			// Sent before the dispatcher had the end.
		case len(sigs) != 1:
			t.Errorf("%s, timestamped %ds after the rotation's end: %d signatures, want the current secret's alone", r.ID, ts-end.Unix(), len(sigs))
		default:
			after++
			if err := verifyWith(oldKey, r); err == nil {
				t.Errorf("%s, sent after the rotation's end, verifies with the previous secret", r.ID)
			}
		}
	}
	if before == 0 || after == 0 {
		t.Errorf("%d requests before the rotation's end and %d after, want some of each", before, after)
	}
	if n := rcv.Stats().BadSignatures; n != 0 {
		t.Errorf("%d requests the current secret does not verify", n)
	}
}

// An endpoint whose name is too long for "<name>-signing" (over 245 characters) is signed with
// the Secret the controller generates for it: both name it with names.SigningSecret (the
// dispatcher read the long name, missed the Secret and failed every attempt).
func TestLongEndpointNameIsSignedWithTheGeneratedSecret(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	name := strings.Repeat("a", 250)
	rcv.Trust(e.endpoint(name, v1alpha1.WebhookEndpointSpec{URL: rcv.URL()}))
	e.dispatcher("d1")
	e.publish("a", "evt_1", []byte(`{}`))
	testenv.Eventually(t, 20*time.Second, func() bool { return rcv.Stats().Requests == 1 }, "not delivered: %v", lazy(func() string { return fmt.Sprint(e.get(name).Status.Health) }))
	if rcv.Stats().BadSignatures != 0 {
		t.Error("the request was not signed with the generated secret")
	}
}

// spec.suspend holds deliveries in the stream; resuming delivers them.
func TestSuspendHoldsAndResumeDelivers(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	e.endpoint("hold", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Suspend: true})
	e.dispatcher("d1")
	for i := range 20 {
		e.publish("a", fmt.Sprintf("evt_%d", i), []byte(`{}`))
	}
	// The deliveries are written and wait: 20 pending, none attempted.
	testenv.Eventually(t, 10*time.Second, func() bool {
		h := e.get("hold").Status.Health
		return h != nil && h.Pending == 20
	}, "status does not show 20 pending: %v", lazy(e.dump))
	if rcv.Stats().Requests != 0 {
		t.Fatalf("a suspended endpoint received %d requests", rcv.Stats().Requests)
	}
	e.updateSpec("hold", func(s *v1alpha1.WebhookEndpointSpec) { s.Suspend = false })
	testenv.Eventually(t, 10*time.Second, func() bool { return len(rcv.RequestsByID()) == 20 }, "not delivered after resuming")
}

// A suspended endpoint holds its events in the deliveries stream only while the stream is
// below its hold threshold: the rest stay in the events stream, not acknowledged, and the
// stream never reaches its bound (beyond which it would discard its oldest). Resumed, the
// endpoint delivers every event. Two replicas holding at once, each counting only its own
// copies between readings of the stream, stay within the bound too.
func TestSuspendedEndpointHoldsOnlyUpToTheDeliveriesBound(t *testing.T) {
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d replicas", replicas), func(t *testing.T) { holdsUpToTheBound(t, replicas) })
	}
}

func holdsUpToTheBound(t *testing.T, replicas int) {
	e := newEnv(t)
	ctx := context.Background()
	const bound, total = 32 << 10, 60
	if err := e.set.WithBounds(streams.Bounds{Deliveries: bound}).Ensure(ctx, e.js); err != nil {
		t.Fatal(err)
	}
	rcv := newReceiver(t, nil)
	e.endpoint("hold", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), Suspend: true})
	for i := range replicas {
		e.dispatcher(fmt.Sprintf("d%d", i+1))
	}
	body := []byte(fmt.Sprintf(`{"pad":%q}`, strings.Repeat("p", 1000)))
	for i := range total {
		e.publish("a", fmt.Sprintf("evt_%d", i), body)
	}
	var held jetstream.StreamState
	var waiting uint64
	testenv.Eventually(t, 30*time.Second, func() error {
		s, err := e.js.Stream(ctx, e.set.DeliveriesStream())
		if err != nil {
			return err
		}
		// The shared lane's intake keeps what its endpoint could not park.
		c, err := e.js.Consumer(ctx, e.set.EventsStream(), streams.IntakeConsumer(e.ns))
		if err != nil {
			return err
		}
		held, waiting = s.CachedInfo().State, c.CachedInfo().NumPending+uint64(c.CachedInfo().NumAckPending)
		if held.Bytes*100 < bound*streams.DeliveriesHoldPercent || held.Msgs+waiting != total {
			return fmt.Errorf("%d copies held (%d bytes of %d), %d events wait", held.Msgs, held.Bytes, bound, waiting)
		}
		return nil
	}, "")
	t.Logf("%d copies held (%d bytes of %d), %d events wait in the events stream", held.Msgs, held.Bytes, bound, waiting)
	if held.Bytes*100 > bound*streams.DeliveriesHoldMaxPercent || held.FirstSeq != 1 || held.LastSeq != held.Msgs || waiting == 0 {
		t.Errorf("the deliveries stream went past its hold bounds or dropped copies: %+v, %d waiting", held, waiting)
	}
	if rcv.Stats().Requests != 0 {
		t.Fatalf("a suspended endpoint received %d requests", rcv.Stats().Requests)
	}
	// A merge patch: the dispatchers write the endpoint's status meanwhile, which an update
	// of the object read before would conflict with.
	ep := e.get("hold")
	patch := client.MergeFrom(ep.DeepCopy())
	ep.Spec.Suspend = false
	if err := e.k8s.Patch(ctx, ep, patch); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return len(rcv.RequestsByID()) == total }, "not all delivered after resuming: %v", lazy(func() string { return fmt.Sprint(rcv.Stats()) }))
}

// A retry due in 24 hours holds nothing: 2,000 deliveries waiting for it leave the endpoint's
// consumer with nothing pending, and new deliveries keep flowing.
func TestLateRetriesDoNotStallTheConsumer(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		if strings.HasPrefix(h.ID, "evt_late_") {
			return testenv.Response{Status: 500, Body: "later"}
		}
		return testenv.Response{Status: 200}
	})
	ref := e.policy("daily", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: 24 * time.Hour}}, CircuitBreaker: noCircuit()})
	e.endpoint("busy", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref, MaxInFlight: ptr[int32](20)})
	e.dispatcher("d1")
	const late = 2000
	for i := range late {
		e.publish("a", fmt.Sprintf("evt_late_%04d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 60*time.Second, func() bool { return rcv.Stats().Requests >= late }, "late ones not attempted: %d", lazyN(func() int { return rcv.Stats().Requests }))
	for i := range 50 {
		e.publish("a", fmt.Sprintf("evt_new_%d", i), []byte(`{}`))
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		n := 0
		for id := range rcv.RequestsByID() {
			if strings.HasPrefix(id, "evt_new_") {
				n++
			}
		}
		return n == 50
	}, "new deliveries stalled behind %d late retries%v", late, lazy(e.dump))
	// A delivery is acknowledged after the receiver answered and its outcome is logged: the
	// last ones settle just after the receiver saw them.
	ci, err := e.js.Consumer(context.Background(), e.set.DeliveriesStream(), e.set.QueueConsumer())
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.ConsumerInfo
	testenv.Eventually(t, 10*time.Second, func() bool {
		info, err = ci.Info(context.Background())
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}, "the consumer holds ack-pending or pending deliveries while retries wait: %v", lazy(func() string { return fmt.Sprint(info, err) }))
	var msgs uint64
	testenv.Eventually(t, 10*time.Second, func() bool {
		st, err := e.js.Stream(context.Background(), e.set.DeliveriesStream())
		msgs = 0
		if err == nil {
			msgs = st.CachedInfo().State.Msgs
		}
		return msgs == late
	}, "%v messages wait in the deliveries stream, want the %d scheduled retries", lazyN(func() int { return int(msgs) }), late)
	testenv.Eventually(t, 10*time.Second, func() bool { h := e.get("busy").Status.Health; return h != nil && h.Pending == late }, "status pending does not count scheduled retries: %v",
		lazy(func() string { return fmt.Sprint(e.get("busy").Status.Health) }))
}

// Signing secrets and Secret-sourced header values never appear in logs, status, the delivery
// log or dead letters.
func TestSecretsNeverLeak(t *testing.T) {
	e := newEnv(t)
	token := "Bearer sup3r-s3cret-t0ken"
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "auth", Annotations: map[string]string{consent.AllowedEndpoints: "leaky"}},
		StringData: map[string]string{"token": token}}
	if err := e.k8s.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		return testenv.Response{Status: 500, Body: "echo: " + h.Header.Get("Authorization")}
	})
	ref := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	secret := e.endpoint("leaky", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: ref,
		HeadersFrom: []v1alpha1.HeaderFromSecret{{Name: "Authorization", SecretKeyRef: v1alpha1.SecretKeySelector{Name: "auth", Key: "token"}}}})
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := funcr.New(func(prefix, args string) { mu.Lock(); logs.WriteString(prefix + args + "\n"); mu.Unlock() }, funcr.Options{Verbosity: 5})
	e.dispatcher("d1", func(o *dispatcher.Options) { o.Logger = logger })
	e.publish("a", "evt_1", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "no dead letter")
	if got := rcv.Requests()[0].Header.Get("Authorization"); got != token {
		t.Fatalf("the receiver did not get the Secret-sourced header: %q", got)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return e.get("leaky").Status.Health != nil }, "no status")
	status, _ := json.Marshal(e.get("leaky").Status)
	logRecords, _ := json.Marshal(e.logRecords("leaky"))
	dls, _ := json.Marshal(e.deadLetters())
	mu.Lock()
	logText := logs.String()
	mu.Unlock()
	key := strings.TrimPrefix(secret, "whsec_")
	for what, text := range map[string]string{"status": string(status), "delivery log": string(logRecords), "logs": logText} {
		for _, leak := range []string{secret, key, "sup3r-s3cret-t0ken"} {
			if strings.Contains(text, leak) {
				t.Errorf("the %s contains a secret (%q)", what, leak[:8])
			}
		}
	}
	// The dead letter keeps the receiver's response body (which echoed the token: that is the
	// receiver's doing) but never the request's secret header or the signing secret.
	if strings.Contains(string(dls), secret) || strings.Contains(string(dls), key) {
		t.Errorf("the dead letter contains the signing secret")
	}
	if !strings.Contains(string(logRecords), `"Authorization":"[redacted]"`) {
		t.Errorf("the delivery log does not show the redacted header: %s", logRecords)
	}
}

var buildOnce sync.Once
var binary string

// operatorBinary builds bin/webhook-operator for process-level tests.
func operatorBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "webhook-operator-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binary = filepath.Join(dir, "webhook-operator")
		cmd := exec.Command("go", "build", "-o", binary, "./cmd/webhook-operator")
		cmd.Dir = testenv.Root()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the operator: %v\n%s", err, out)
		}
	})
	return binary
}

// process runs `webhook-operator dispatcher` as a real process.
func (e *env) process(identity, kubeconfig string) *exec.Cmd {
	e.t.Helper()
	cmd := exec.Command(operatorBinary(e.t), "dispatcher", "--namespace="+e.ns, "--identity="+identity,
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--shutdown-grace=10s",
		"--lease-ttl=3s", "--nats-url="+e.nats.URL(), "--nats-token-file="+e.cfg.NATS.TokenFile, "--nats-allow-plaintext-tokens", "--allow-http", "--allowed-cidrs=127.0.0.0/8")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
		}
		if e.t.Failed() {
			e.t.Logf("dispatcher %s output:\n%s", identity, out.String())
		}
	})
	return cmd
}

// processWorld is a test world whose dispatchers run as real processes: its kubeconfig, and
// an endpoint "orders" with maxInFlight and a receiver that takes latency per request (and
// calls hold, when set, before answering), and n events published.
func processWorld(t *testing.T, maxInFlight int32, latency time.Duration, n int, hold func()) (*env, string, *testenv.Receiver) {
	e := newEnv(t)
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		time.Sleep(latency)
		if hold != nil {
			hold()
		}
		return testenv.Response{Status: 200}
	})
	e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), MaxInFlight: ptr(maxInFlight), Timeout: dur(2 * time.Second)})
	for i := range n {
		e.publish("order.created", fmt.Sprintf("evt_%04d", i), []byte(`{}`))
	}
	return e, kubeconfig, rcv
}

// signalAfter sends sig to a dispatcher process once the receiver got at least n requests.
func (e *env) signalAfter(p *exec.Cmd, rcv *testenv.Receiver, n int, sig syscall.Signal) *exec.Cmd {
	e.t.Helper()
	testenv.Eventually(e.t, 30*time.Second, func() bool { return rcv.Stats().Requests >= n }, "the process delivered %d of the %d requests wanted before %s", lazyN(func() int { return rcv.Stats().Requests }), n, sig)
	if err := p.Process.Signal(sig); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// A dispatcher killed with SIGKILL mid-delivery loses nothing: after a restart the receiver,
// deduplicating by webhook-id, has seen every event. Health counts are a fold of the durable
// delivery log: status.health.delivered equals the distinct events the receiver got, exactly
// (batched in memory, it read 457 of 600 after a kill).
func TestSIGKILLLosesNothing(t *testing.T) {
	const n = 600
	// The receiver answers the first 100 requests and holds the rest until the kill, so the
	// process dies with deliveries in flight and most events undelivered, however slow the
	// machine is.
	var served atomic.Int64
	release := make(chan struct{})
	e, kubeconfig, rcv := processWorld(t, 10, 20*time.Millisecond, n, func() {
		if served.Add(1) > 100 {
			<-release
		}
	})
	t.Cleanup(func() { closeOnce(release) })
	first := e.signalAfter(e.process("p1", kubeconfig), rcv, 101, syscall.SIGKILL)
	_, _ = first.Process.Wait()
	killedAt := len(rcv.RequestsByID())
	closeOnce(release)
	if killedAt >= n {
		t.Fatalf("the receiver had all %d events before the kill: its hold did not hold", n)
	}
	e.process("p2", kubeconfig)
	testenv.Eventually(t, 90*time.Second, func() bool { return len(rcv.RequestsByID()) == n }, "after SIGKILL and restart %d of %d events arrived", lazyN(func() int { return len(rcv.RequestsByID()) }), n)
	t.Logf("killed after %d events; %d requests for %d events (%d duplicates)", killedAt, rcv.Stats().Requests, n, rcv.Stats().Requests-n)
	// The deliveries in flight at the kill reached the receiver (it counts them) but were never
	// answered: they come back once the consumer's ack wait runs out (streams.SharedAckWait
	// after their last progress report), and only then are they delivered and logged.
	testenv.Eventually(t, streams.SharedAckWait+60*time.Second, func() bool {
		h := e.get("orders").Status.Health
		return h != nil && h.Delivered == int64(n)
	}, "status.health.delivered = %v, the receiver got %d distinct events", lazy(func() string { return fmt.Sprint(e.get("orders").Status.Health) }), n)
}

// SIGTERM drains: in-flight deliveries finish, the process exits 0, and nothing is lost.
func TestSIGTERMDrainsAndExitsZero(t *testing.T) {
	const n = 60
	e, kubeconfig, rcv := processWorld(t, 5, 300*time.Millisecond, n, nil)
	p := e.signalAfter(e.process("p1", kubeconfig), rcv, 5, syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dispatcher exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dispatcher did not exit after SIGTERM")
	}
	// Everything sent was answered (no request cut off), and a restart delivers the rest.
	hitsAtExit := rcv.Stats().Requests
	e.process("p2", kubeconfig)
	testenv.Eventually(t, 60*time.Second, func() bool { return len(rcv.RequestsByID()) == n }, "events lost after SIGTERM: %d of %d", lazyN(func() int { return len(rcv.RequestsByID()) }), n)
	if dup := rcv.Stats().Requests - n; dup > 0 {
		t.Logf("%d duplicates after SIGTERM (at-least-once); %d requests before exit", dup, hitsAtExit)
	}
	ci, err := e.js.Consumer(context.Background(), e.set.DeliveriesStream(), "ep_"+e.ns+"_orders")
	if err == nil {
		if info, err := ci.Info(context.Background()); err == nil && info.NumRedelivered > 0 && rcv.Stats().Requests > n {
			t.Logf("%d redelivered", info.NumRedelivered)
		}
	}
}

// closeOnce closes c unless it is closed.
func closeOnce(c chan struct{}) {
	select {
	case <-c:
	default:
		close(c)
	}
}

// verifyWith verifies a request's Standard Webhooks signature with secret alone.
func verifyWith(secret string, r testenv.Request) error {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return err
	}
	return wh.Verify(r.Body, r.Header)
}
