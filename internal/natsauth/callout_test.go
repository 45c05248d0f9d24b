package natsauth_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

var (
	cp *testenv.ControlPlane
	cs kubernetes.Interface
)

func TestMain(m *testing.M) {
	var err error
	if cp, err = testenv.StartControlPlane(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cs = kubernetes.NewForConfigOrDie(cp.Config)
	code := m.Run()
	_ = cp.Stop()
	os.Exit(code)
}

// busFor is what ns owns in the default layout.
var busFor = natsauth.BusOf(streams.DefaultConfig())

// createBus creates ns's streams and bucket as the controller does, in layout cfg.
func createBus(t *testing.T, js jetstream.JetStream, cfg streams.Config, ns string) {
	t.Helper()
	if err := cfg.For(ns).Ensure(context.Background(), js); err != nil {
		t.Fatal(err)
	}
}

// world is a nats-server in callout mode with the callout service running, namespaces a and b
// with their streams and bucket, and an admin connection.
type world struct {
	t     *testing.T
	nats  *testenv.NATS
	admin jetstream.JetStream
	svc   *natsauth.Service
	log   *logLines
	stop  context.CancelFunc
}

// logLines keeps what the service logged.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, args)
		l.mu.Unlock()
	}, funcr.Options{})
}

func (l *logLines) has(sub ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, s := range sub {
			all = all && strings.Contains(line, s)
		}
		if all {
			return true
		}
	}
	return false
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func newWorld(t *testing.T, withXKey bool) *world {
	t.Helper()
	return newWorldWith(t, func(a *testenv.NATSAuth) {
		if !withXKey {
			a.Config.XKey = ""
		}
	})
}

// newWorldWith is newWorld with the server's auth configuration changed by configure.
func newWorldWith(t *testing.T, configure func(*testenv.NATSAuth)) *world {
	t.Helper()
	return newWorldOf(t, configure, streams.DefaultConfig())
}

// newWorldOf is newWorldWith with a and b's streams made with the size bounds of cfg (its
// names are the default ones).
func newWorldOf(t *testing.T, configure func(*testenv.NATSAuth), cfg streams.Config) *world {
	t.Helper()
	n, js := testenv.NewCalloutNATS(t, configure)
	for _, ns := range []string{"a", "b"} {
		ensureNamespace(t, ns)
		createBus(t, js, cfg, ns)
	}
	w := &world{t: t, nats: n, admin: js, log: &logLines{}}
	var err error
	w.svc, err = n.Auth.CalloutService(&natsauth.Kube{Client: cs, Audience: natsauth.DefaultAudience, Dispatchers: labelledDispatchers}, w.log.logger())
	if err != nil {
		t.Fatal(err)
	}
	w.startService()
	return w
}

// startService runs the callout service until the test ends (or stopService).
func (w *world) startService() { w.stop = w.nats.ServeCallout(w.t, w.svc) }

func (w *world) stopService() {
	if w.stop != nil {
		w.stop()
		w.stop = nil
	}
}

// labelledDispatchers is the controller's rule: a ServiceAccount it made for a dispatcher.
func labelledDispatchers(ctx context.Context, ns, name string) (natsauth.DispatcherAccount, bool, error) {
	sa, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return natsauth.DispatcherAccount{}, false, nil
	}
	if err != nil {
		return natsauth.DispatcherAccount{}, false, err
	}
	ok := sa.Labels["app.kubernetes.io/managed-by"] == "webhook-operator" && sa.Labels["app.kubernetes.io/name"] == "webhook-dispatcher"
	return natsauth.DispatcherAccount{Endpoint: sa.Annotations["webhook-operator.io/endpoint"], UID: string(sa.UID)}, ok, nil
}

func ensureNamespace(t *testing.T, ns string) {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// serviceAccount creates ns/name (labelled as a dispatcher's when dispatcher) and, when verbs
// are given, a Role on the virtual resources bound to it.
func serviceAccount(t *testing.T, ns, name string, dispatcher bool, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if dispatcher {
		sa.Labels = map[string]string{"app.kubernetes.io/managed-by": "webhook-operator", "app.kubernetes.io/name": "webhook-dispatcher"}
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if len(rules) == 0 {
		return
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: rules}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

func rule(resource string, verbs ...string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: []string{"webhook-operator.io"}, Resources: []string{resource}, Verbs: verbs}
}

// token requests a token of ns/name for audiences (nil: the API server's own).
func token(t *testing.T, ns, name string, audiences ...string) string {
	t.Helper()
	seconds := int64(600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &seconds}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// client is a tenant's connection and the permission errors the server sent it.
type client struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	mu   sync.Mutex
	errs []string
}

func (c *client) violations() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.errs, "\n")
}

// connect connects through the callout as a tenant does.
func (w *world) connect(tok, ns string) (*client, error) {
	c := &client{}
	opts := append(natsauth.ClientOptions(func() string { return tok }, ns),
		nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			c.errs = append(c.errs, err.Error())
			c.mu.Unlock()
		}))
	nc, err := nats.Connect(w.nats.URL(), append(opts, w.nats.Auth.ClientOptions()...)...)
	if err != nil {
		return nil, err
	}
	w.t.Cleanup(nc.Close)
	c.nc = nc
	c.js, err = jetstream.New(nc)
	return c, err
}

func (w *world) mustConnect(tok, ns string) *client {
	w.t.Helper()
	c, err := w.connect(tok, ns)
	if err != nil {
		w.t.Fatalf("connecting to namespace %s: %v\ncallout log:\n%s", ns, err, w.log)
	}
	return c
}

// messages counts what stream holds.
func (w *world) messages(stream string) uint64 {
	w.t.Helper()
	s, err := w.admin.Stream(context.Background(), stream)
	if err != nil {
		w.t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// proving adds to opts a new user nkey that signs the server's nonce, as natsauth.ClientOptions
// does.
func proving(opts ...nats.Option) []nats.Option {
	kp, err := nkeys.CreateUser()
	if err != nil {
		panic(err)
	}
	pub, _ := kp.PublicKey()
	return append(opts, nats.Nkey(pub, kp.Sign))
}

func shortCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 500*time.Millisecond)
}

func TestDispatcherTokenGetsItsNamespaceOnly(t *testing.T) {
	w := newWorld(t, true)
	serviceAccount(t, "a", "webhook-dispatcher", true)
	c := w.mustConnect(token(t, "a", "webhook-dispatcher", natsauth.DefaultAudience), "a")
	ctx := context.Background()
	bus, other := busFor("a"), busFor("b")

	if _, err := c.js.Publish(ctx, "whk.d.a.orders", []byte("{}")); err != nil {
		t.Fatalf("a dispatcher writes its deliveries: %v", err)
	}
	kv, err := c.js.KeyValue(ctx, bus.Bucket)
	if err != nil {
		t.Fatalf("a dispatcher opens its bucket: %v", err)
	}
	if _, err := kv.Put(ctx, "health.orders", []byte("{}")); err != nil {
		t.Fatalf("a dispatcher writes its bucket: %v", err)
	}
	if e, err := kv.Get(ctx, "health.orders"); err != nil || string(e.Value()) != "{}" {
		t.Fatalf("a dispatcher reads its bucket: %v", err)
	}

	for _, subj := range []string{"whk.d.b.orders", "webhooks.b.order.created", "$KV." + other.Bucket + ".health.orders", "whk.dlq.b.x.y"} {
		sctx, cancel := shortCtx()
		_, err := c.js.Publish(sctx, subj, []byte("{}"))
		cancel()
		if err == nil {
			t.Errorf("publishing to %s: allowed", subj)
		}
	}
	sctx, cancel := shortCtx()
	if err := c.js.DeleteStream(sctx, bus.Events.Name); err == nil {
		t.Error("deleting its own events stream: allowed")
	}
	cancel()
	if _, err := c.nc.SubscribeSync("whk.d.b.>"); err == nil {
		_ = c.nc.Flush()
	}
	if _, err := c.nc.SubscribeSync("_INBOX.>"); err == nil {
		_ = c.nc.Flush()
	}
	for _, s := range []string{other.Events.Name, other.Deliveries.Name, other.DeadLetters.Name, "KV_" + other.Bucket} {
		if n := w.messages(s); n != 0 {
			t.Errorf("%s holds %d messages written from namespace a", s, n)
		}
	}
	if n := w.messages(bus.Events.Name); n != 0 {
		t.Errorf("the events stream of a holds %d messages", n)
	}
	// The server's refusals reach the connection's error handler asynchronously.
	testenv.Eventually(t, 10*time.Second, func() error {
		v := c.violations()
		for _, want := range []string{`Publish to "whk.d.b.orders"`, `Publish to "$JS.API.STREAM.DELETE.` + bus.Events.Name, `Subscription to "whk.d.b.>"`, `Subscription to "_INBOX.>"`} {
			if !strings.Contains(v, want) {
				return fmt.Errorf("no permissions violation for %s; got:\n%s", want, v)
			}
		}
		return nil
	}, "")
	if !w.log.has("bus connection authorized", "system:serviceaccount:a:webhook-dispatcher", `"dispatcher"`) {
		t.Errorf("the grant is not logged:\n%s", w.log)
	}
}

func TestNoDispatcherRoleWithoutTheLabelsOrTheAudience(t *testing.T) {
	w := newWorld(t, false)
	w.svc.Kube.AllowAPIAudience = true // the dispatcher's API token is then someone's, not the dispatcher's
	serviceAccount(t, "a", "webhook-dispatcher", true)
	serviceAccount(t, "a", "impostor", false)
	for _, tc := range []struct {
		name, sa, audience, why string
	}{
		{"an unlabelled ServiceAccount", "impostor", natsauth.DefaultAudience, "system:serviceaccount:a:impostor may do nothing with webhooks on the bus in namespace a"},
		{"the dispatcher's API-server token", "webhook-dispatcher", "", "system:serviceaccount:a:webhook-dispatcher may do nothing with webhooks on the bus in namespace a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var aud []string
			if tc.audience != "" {
				aud = []string{tc.audience}
			}
			if _, err := w.connect(token(t, "a", tc.sa, aud...), "a"); err == nil || !strings.Contains(err.Error(), "Authorization Violation") {
				t.Fatalf("connected (or failed otherwise): %v", err)
			}
			if !w.log.has("bus connection refused", tc.why) {
				t.Fatalf("no refusal %q logged:\n%s", tc.why, w.log)
			}
		})
	}
}

func TestRBACDecidesWhatUsersMayDo(t *testing.T) {
	w := newWorld(t, true)
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	serviceAccount(t, "a", "viewer", false, rule(natsauth.ResourceDeliveries, "get", "list"))
	ctx := context.Background()
	a := busFor("a")

	p := w.mustConnect(token(t, "a", "producer", natsauth.DefaultAudience), "a")
	if _, err := p.js.Publish(ctx, "webhooks.a.order.created", []byte("{}")); err != nil {
		t.Fatalf("a producer publishes an event: %v", err)
	}
	sctx, cancel := shortCtx()
	if _, err := p.js.Stream(sctx, a.DeadLetters.Name); err == nil {
		t.Error("a producer reads the dead-letter stream's info")
	}
	cancel()

	// Reading is the data API's: a viewer has nothing to do on the bus.
	if _, err := w.connect(token(t, "a", "viewer", natsauth.DefaultAudience), "a"); err == nil {
		t.Error("a viewer connected to the bus")
	}
	if !w.log.has("bus connection refused", "system:serviceaccount:a:viewer may do nothing with webhooks on the bus in namespace a", "read through the Kubernetes API (data.webhook-operator.io)") {
		t.Errorf("the viewer's refusal not logged:\n%s", w.log)
	}
	if n := w.messages(a.Events.Name); n != 1 {
		t.Errorf("the events stream holds %d events, want the producer's 1", n)
	}

	// Roles in a are nothing in b.
	if _, err := w.connect(token(t, "a", "producer", natsauth.DefaultAudience), "b"); err == nil {
		t.Fatal("a's producer connected to namespace b")
	}
	if !w.log.has("bus connection refused", "system:serviceaccount:a:producer may do nothing with webhooks on the bus in namespace b") {
		t.Fatalf("refusal not logged:\n%s", w.log)
	}
}

func TestRefusals(t *testing.T) {
	w := newWorld(t, false)
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	good := token(t, "a", "producer", natsauth.DefaultAudience)
	victimKey, _ := nkeys.CreateUser()
	victim, _ := victimKey.PublicKey()
	impostor, _ := nkeys.CreateUser()
	for _, tc := range []struct {
		name string
		opts []nats.Option
		why  string
	}{
		{"no token", proving(nats.UserInfo("a", "")), "no token"},
		{"a token the API server does not know", proving(nats.Token("not-a-token"), nats.UserInfo("a", "")), "does not accept the token"},
		{"a bad namespace", proving(nats.Token(good), nats.UserInfo("A_B", "")), `A_B\" is not a namespace name`},
		{"an inbox named as the password", []nats.Option{nats.Token(good), nats.UserInfo("a", "_INBOX_0123456789abcdefABCDEF")}, "a NATS password is refused"},
		{"no nkey", []nats.Option{nats.Token(good), nats.UserInfo("a", "")}, "no nkey"},
		{"another's nkey", []nats.Option{nats.Token(good), nats.UserInfo("a", ""), nats.Nkey(victim, impostor.Sign)}, "signature of the server's nonce does not verify"},
		{"a too long token", []nats.Option{nats.Token(strings.Repeat("x", natsauth.MaxTokenBytes+1)), nats.UserInfo("a", "")}, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := nats.Connect(w.nats.URL(), append(tc.opts, nats.Timeout(natsauth.ConnectTimeout))...)
			if err == nil || !strings.Contains(err.Error(), "Authorization Violation") {
				t.Fatalf("want an authorization violation, got %v", err)
			}
			if !w.log.has("bus connection refused", tc.why) {
				t.Fatalf("no refusal %q logged:\n%s", tc.why, w.log)
			}
		})
	}
	// The admin bypasses the callout.
	if _, _, err := w.nats.Connect(nats.MaxReconnects(0)); err != nil {
		t.Fatalf("the admin: %v", err)
	}
}

// A reply subject is not checked against the publisher's permissions: in the JetStream
// account, a request whose reply names another namespace's subject would make the server write
// its answer there. Tenants are in their own account, so the answer stays there.
func TestRepliesStayInTheTenantsAccount(t *testing.T) {
	w := newWorld(t, true)
	serviceAccount(t, "a", "webhook-dispatcher", true)
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	ctx := context.Background()
	a, b := busFor("a"), busFor("b")
	if _, err := w.admin.CreateConsumer(ctx, a.Deliveries.Name, jetstream.ConsumerConfig{Durable: "ep_a_orders",
		FilterSubject: "whk.d.a.orders", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.admin.Publish(ctx, "whk.d.a.orders", []byte(`{"forged":true}`)); err != nil {
		t.Fatal(err)
	}
	d := w.mustConnect(token(t, "a", "webhook-dispatcher", natsauth.DefaultAudience), "a")
	p := w.mustConnect(token(t, "a", "producer", natsauth.DefaultAudience), "a")
	base, err := w.admin.AccountInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		c              *client
		subject, reply string
		body           string
	}{
		{d, "$JS.API.CONSUMER.MSG.NEXT." + a.Deliveries.Name + ".ep_a_orders", "webhooks.b.order.created", `{"batch":1}`},
		{d, "$JS.API.STREAM.INFO." + a.Events.Name, "whk.d.b.orders", ""},
		{d, "whk.log.a.orders", "$KV." + b.Bucket + ".health.orders", "{}"},
		{p, "webhooks.a.order.created", "whk.dlq.b.orders.x", "{}"},
	} {
		if err := r.c.nc.PublishRequest(r.subject, r.reply, []byte(r.body)); err != nil {
			t.Fatal(err)
		}
		if err := r.c.nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// Every request was handled (and so answered): the JetStream API counted the stream-info
	// request (each poll counts itself; a pull goes to its consumer, not the API), the pull
	// delivered its message, the writes are stored.
	polls := uint64(0)
	testenv.Eventually(t, 30*time.Second, func() error {
		info, err := w.admin.AccountInfo(ctx)
		polls++
		if err != nil {
			return err
		}
		if info.API.Total-base.API.Total-polls < 1 {
			return errors.New("the JetStream API has not handled a's stream-info request")
		}
		return nil
	}, "")
	testenv.Eventually(t, 30*time.Second, func() error {
		cons, err := w.admin.Consumer(ctx, a.Deliveries.Name, "ep_a_orders")
		if err != nil {
			return err
		}
		if n := cons.CachedInfo().NumAckPending; n != 1 {
			return fmt.Errorf("the pull has %d messages out, want 1", n)
		}
		if n := w.messages(a.Attempts.Name) + w.messages(a.Events.Name); n != 2 {
			return fmt.Errorf("a's log and events hold %d messages, want 2", n)
		}
		return nil
	}, "")
	// A write to each of b's streams is stored after anything routed there before it.
	for _, subj := range []string{"webhooks.b.order.created", "whk.d.b.orders", "whk.dlq.b.orders.x", "$KV." + b.Bucket + ".marker"} {
		if _, err := w.admin.Publish(ctx, subj, []byte("marker")); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{b.Events.Name, b.Deliveries.Name, b.DeadLetters.Name, "KV_" + b.Bucket} {
		if n := w.messages(s); n != 1 {
			t.Errorf("%s holds %d messages besides the marker: an answer to a's request landed in b", s, n-1)
		}
	}
}

// With no callout service, new tenant connections wait (and fail after the authorization
// timeout); the admin still connects. Once the service answers, a retrying client gets in.
func TestConnectionsWaitForTheCallout(t *testing.T) {
	w := newWorld(t, false)
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	w.stopService()
	tok := token(t, "a", "producer", natsauth.DefaultAudience)
	if _, err := w.connect(tok, "a"); err == nil {
		t.Fatal("connected without a callout service")
	}
	if _, _, err := w.nats.Connect(nats.MaxReconnects(0)); err != nil {
		t.Fatalf("the admin without a callout service: %v", err)
	}
	connected := make(chan *nats.Conn, 1)
	opts := append(natsauth.ClientOptions(func() string { return tok }, "a"),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.IgnoreAuthErrorAbort(), nats.ConnectHandler(func(nc *nats.Conn) { connected <- nc }))
	nc, err := nats.Connect(w.nats.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	w.startService()
	select {
	case <-connected:
	case <-time.After(30 * time.Second):
		t.Fatalf("not connected 30s after the callout came back (status %v, last error %v)", nc.Status(), nc.LastError())
	}
}

func TestUnusableTokenIsNotLogged(t *testing.T) {
	w := newWorld(t, false)
	secret := "s3cr3t-" + strings.Repeat("z", 20)
	_, err := nats.Connect(w.nats.URL(), proving(nats.Token(secret), nats.UserInfo("a", ""), nats.Timeout(natsauth.ConnectTimeout))...)
	if err == nil {
		t.Fatal("connected")
	}
	if !w.log.has("bus connection refused") {
		t.Fatalf("nothing logged:\n%s", w.log)
	}
	if strings.Contains(w.log.String(), secret) {
		t.Fatalf("the token is in the log:\n%s", w.log)
	}
}

// The authorization ends when the token does, so a revoked identity does not outlive it.
func TestAuthorizationExpiresWithTheToken(t *testing.T) {
	w := newWorld(t, false)
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	tok := token(t, "a", "producer", natsauth.DefaultAudience) // valid for 600s
	w.svc.MaxSession = 24 * time.Hour

	uc := userClaims(t, w.svc, tok)
	issuerPub, _ := w.svc.Issuer.PublicKey()
	exp := time.Unix(uc.Expires, 0)
	if until := time.Until(exp); until <= 0 || until > 601*time.Second {
		t.Errorf("the user expires in %s, want with the token (600s)", until)
	}
	if uc.Audience != natsauth.AccountTenants || uc.Issuer != issuerPub || uc.Name != "system:serviceaccount:a:producer@a" {
		t.Errorf("user claims %+v", uc.ClaimsData)
	}
}

// Over TLS with client certificates: a dispatcher connects as the operator makes it connect
// (opconfig: CA, client certificate and token files, its namespace), and nothing connects
// without a certificate of the CA.
func TestTLSWithClientCertificates(t *testing.T) {
	dir := t.TempDir()
	w := newWorldWith(t, func(a *testenv.NATSAuth) {
		if err := a.WithTLS(dir); err != nil {
			t.Fatal(err)
		}
	})
	serviceAccount(t, "a", "webhook-dispatcher", true)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token(t, "a", "webhook-dispatcher", natsauth.DefaultAudience)), 0o600); err != nil {
		t.Fatal(err)
	}
	tlsFiles := w.nats.Auth.TLS
	cfg := opconfig.Default()
	cfg.NATS = opconfig.NATS{URL: w.nats.URL(), CAFile: tlsFiles.CA, CertFile: tlsFiles.ClientCert, KeyFile: tlsFiles.ClientKey,
		TokenFile: tokenFile, Namespace: "a"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	nc, js, err := cfg.Connect("dispatcher", nats.RetryOnFailedConnect(false))
	if err != nil {
		t.Fatalf("the dispatcher's connection: %v\n%s", err, w.log)
	}
	defer nc.Close()
	if !nc.TLSRequired() {
		t.Error("not over TLS")
	}
	if _, err := js.Publish(context.Background(), "whk.d.a.orders", []byte("{}")); err != nil {
		t.Fatalf("publishing over TLS: %v", err)
	}

	noCert := cfg
	noCert.NATS.CertFile, noCert.NATS.KeyFile = "", ""
	if nc, _, err := noCert.Connect("no certificate", nats.RetryOnFailedConnect(false), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("connected without a client certificate")
	}
	if err := (&opconfig.Config{NATS: opconfig.NATS{URL: "nats://user:secret@127.0.0.1:4222"}}).Validate(); err == nil ||
		strings.Contains(err.Error(), "secret") || !strings.Contains(err.Error(), "credentials in the URL are refused") {
		t.Errorf("a URL with credentials: %v", err)
	}
}

// The configuration nats-config writes holds bcrypt hashes; the server takes them.
func TestRenderedConfigurationTakesBcryptPasswords(t *testing.T) {
	auth, err := testenv.NewNATSAuth(streams.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(auth.Keys.AdminPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	auth.Config.AdminPassword = string(hash)
	n, err := testenv.StartNATSWith(t.TempDir(), auth)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	nc, err := nats.Connect(n.URL(), nats.UserInfo(auth.Config.AdminUser, auth.Keys.AdminPassword), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("the admin with the password whose hash the server has: %v", err)
	}
	nc.Close()
	if _, err := nats.Connect(n.URL(), nats.UserInfo(auth.Config.AdminUser, string(hash)), nats.MaxReconnects(0)); err == nil {
		t.Fatal("the hash itself is accepted as the password")
	}
}

// authRequest is the authorization request the server sends for a connection with tok that
// asks for namespace ns and proves a new nkey.
func authRequest(t *testing.T, svc *natsauth.Service, tok, ns string) *jwt.AuthorizationRequestClaims {
	t.Helper()
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	issuerPub, _ := svc.Issuer.PublicKey()
	req := jwt.NewAuthorizationRequestClaims(issuerPub)
	req.UserNkey = userPub // the server's key for the connection; the same one will do
	req.Server = jwt.ServerID{Name: "test"}
	const nonce = "a-nonce-of-the-server"
	sig, _ := user.Sign([]byte(nonce))
	req.ConnectOptions = jwt.ConnectOptions{Token: tok, Username: ns, Nkey: userPub, SignedNonce: base64.RawURLEncoding.EncodeToString(sig)}
	req.ClientInformation = jwt.ClientInformation{Host: "127.0.0.1", Nonce: nonce}
	return req
}

// respond hands req to svc as a server would and returns its answer.
func respond(t *testing.T, svc *natsauth.Service, req *jwt.AuthorizationRequestClaims) *jwt.AuthorizationResponseClaims {
	t.Helper()
	srv, _ := nkeys.CreateServer()
	srvPub, _ := srv.PublicKey()
	req.Server.ID = srvPub
	enc, err := req.Encode(srv)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := jwt.DecodeAuthorizationResponseClaims(string(svc.Handle(context.Background(), []byte(enc), "")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Audience != srvPub || resp.Subject != req.UserNkey {
		t.Fatalf("response %+v", resp)
	}
	return resp
}

// userClaims is the user svc grants a connection with tok to namespace a.
func userClaims(t *testing.T, svc *natsauth.Service, tok string) *jwt.UserClaims {
	t.Helper()
	resp := respond(t, svc, authRequest(t, svc, tok, "a"))
	if resp.Error != "" {
		t.Fatalf("refused: %s", resp.Error)
	}
	uc, err := jwt.DecodeUserClaims(resp.Jwt)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

// The ingress's ServiceAccount, named by the installer, publishes the events of every
// namespace (with a token of the NATS audience) and nothing else: no operational event, no
// stream API. The same name in another namespace, or its API-server token, is no ingress.
func TestTheIngressPublishesEveryNamespacesEventsOnly(t *testing.T) {
	w := newWorld(t, true)
	ensureNamespace(t, "ops")
	serviceAccount(t, "ops", "ingress", false)
	serviceAccount(t, "a", "ingress", false)
	w.svc.Kube.Ingress = "ops/ingress"
	ctx := context.Background()

	in := w.mustConnect(token(t, "ops", "ingress", natsauth.DefaultAudience), "ops")
	for _, ns := range []string{"a", "b"} {
		if _, err := in.js.Publish(ctx, "webhooks."+ns+".order.created", []byte("{}")); err != nil {
			t.Fatalf("the ingress publishes an event of %s: %v", ns, err)
		}
	}
	sctx, cancel := shortCtx()
	if _, err := in.js.Publish(sctx, "webhooks.a.webhook_operator.endpoint.disabled", []byte("{}")); err == nil {
		t.Error("the ingress publishes an operational event")
	}
	cancel()
	sctx, cancel = shortCtx()
	if _, err := in.js.Stream(sctx, busFor("a").Events.Name); err == nil {
		t.Error("the ingress reads a stream's info")
	}
	cancel()
	sctx, cancel = shortCtx()
	if _, err := in.js.Publish(sctx, "whk.d.a.orders", []byte("{}")); err == nil {
		t.Error("the ingress writes a delivery")
	}
	cancel()
	for _, ns := range []string{"a", "b"} {
		if n := w.messages(busFor(ns).Events.Name); n != 1 {
			t.Errorf("%s's events stream holds %d events, want the ingress's 1", ns, n)
		}
	}
	if !w.log.has("bus connection authorized", "system:serviceaccount:ops:ingress", "ingress") {
		t.Errorf("the ingress's role is not logged:\n%s", w.log)
	}

	// An impostor: the same name in a tenant namespace, with no RBAC.
	if _, err := w.connect(token(t, "a", "ingress", natsauth.DefaultAudience), "a"); err == nil {
		t.Error("a ServiceAccount named like the ingress in namespace a connected")
	}
	// The ingress's API-server token is no bus identity of the ingress.
	if _, err := w.connect(token(t, "ops", "ingress"), "ops"); err == nil {
		t.Error("the ingress connected with a token of the API server's audience")
	}
}

// A namespace's publish rate covers the deliveries its tenants write: while its WebhookQuota
// sets one, an identity that may only replay (create on webhookdeliveries, no producer) writes
// no delivery to the bus (a test delivery, a replay); in a namespace without a rate it does.
func TestAReplayerWritesNoDeliveryUnderAPublishRate(t *testing.T) {
	w := newWorld(t, true)
	w.svc.Kube.EventPublishing = func(_ context.Context, ns string) (bool, error) { return ns != "a", nil }
	for _, ns := range []string{"a", "b"} {
		serviceAccount(t, ns, "replayer", false, rule(natsauth.ResourceDeliveries, "get", "list", "create"))
	}
	ctx := context.Background()
	r := w.mustConnect(token(t, "a", "replayer", natsauth.DefaultAudience), "a")
	sctx, cancel := shortCtx()
	if _, err := r.js.Publish(sctx, "whk.d.a.orders", []byte("{}")); err == nil {
		t.Error("a replayer wrote a delivery while a's quota sets a publish rate")
	}
	cancel()
	other := w.mustConnect(token(t, "b", "replayer", natsauth.DefaultAudience), "b")
	if _, err := other.js.Publish(ctx, "whk.d.b.orders", []byte("{}")); err != nil {
		t.Errorf("a replayer of b, without a rate, cannot write a delivery: %v", err)
	}
}
