package dispatcher_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/dispatcher/shared"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A shared dispatcher serves two namespaces, each as itself: both namespaces' events are
// delivered, signed with their own secrets; what it holds for one namespace (its Kubernetes
// token, its bus token) reads nothing of the other (its Secrets are forbidden, its events
// subjects refused, a connection asking for it refused); its own identity reads no Secret at
// all; a third namespace that did not let it create tokens is not served (its event waits in
// its stream, and the log says why); a namespace no longer named is let go.
func TestASharedDispatcherServesEachNamespaceAsItself(t *testing.T) {
	a := newEnv(t)
	b, c := a.sibling(), a.sibling()
	ctx := context.Background()
	op := a.sibling() // the operator's namespace: the shared dispatcher's own ServiceAccount
	sharedSA := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: op.ns, Name: "webhook-shared-dispatcher"}}
	if err := cp.Client.Create(ctx, sharedSA); err != nil {
		t.Fatal(err)
	}
	rcv := map[string]*testenv.Receiver{}
	for _, e := range []*env{a, b, c} {
		r := newReceiver(t, nil)
		r.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: r.URL()}))
		rcv[e.ns] = r
		dispatcherRole(t, e.ns, names.SigningSecret("orders"))
	}
	// a and b let the shared dispatcher create their dispatcher's tokens; c does not.
	for _, e := range []*env{a, b} {
		tokenGrant(t, e.ns, op.ns, sharedSA.Name)
	}

	var logMu sync.Mutex
	var logs []string
	log := funcr.New(func(prefix, args string) {
		logMu.Lock()
		logs = append(logs, prefix+" "+args)
		logMu.Unlock()
	}, funcr.Options{})
	own := saRestConfig(t, op.ns, sharedSA.Name)
	reg := prometheus.NewRegistry()
	dir := t.TempDir()
	s := runShared(t, a, shared.Options{RestConfig: own, Dir: dir, Logger: log}, reg)
	testenv.Eventually(t, 10*time.Second, func() bool { s.Serve(pool(a.ns, b.ns, c.ns)); return len(s.Serving()) == 3 },
		"serving %v", lazy(func() string { return strings.Join(s.Serving(), ",") }))

	for _, e := range []*env{a, b, c} {
		e.publish("order.created", "order-"+e.ns, []byte(`{"tenant":"`+e.ns+`"}`))
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return rcv[a.ns].RequestsByID()["order-"+a.ns] > 0 && rcv[b.ns].RequestsByID()["order-"+b.ns] > 0
	}, "delivered in %s: %v, in %s: %v", a.ns, lazyN(func() int { return len(rcv[a.ns].Requests()) }), b.ns, lazyN(func() int { return len(rcv[b.ns].Requests()) }))
	for _, e := range []*env{a, b} {
		for _, h := range rcv[e.ns].Requests() {
			if string(h.Body) != `{"tenant":"`+e.ns+`"}` {
				t.Errorf("namespace %s's receiver got %s", e.ns, h.Body)
			}
		}
		if n := rcv[e.ns].Stats().BadSignatures; n > 0 {
			t.Errorf("namespace %s's receiver saw %d bad signatures", e.ns, n)
		}
	}
	// c is named but not served: it gave no grant. Its event waits for a dispatcher.
	testenv.Eventually(t, 10*time.Second, func() bool {
		logMu.Lock()
		defer logMu.Unlock()
		return slices.ContainsFunc(logs, func(l string) bool {
			return strings.Contains(l, c.ns) && strings.Contains(l, "cannot create resource \\\"serviceaccounts/token\\\"")
		})
	}, "no log line says why namespace %s is not served", c.ns)
	if n := len(rcv[c.ns].Requests()); n > 0 {
		t.Errorf("namespace %s, which gave the shared dispatcher no grant, had %d deliveries", c.ns, n)
	}

	// What the process holds for namespace a reaches nothing of b.
	aAPI := kubernetes.NewForConfigOrDie(shared.AsServiceAccount(cp.Config, filepath.Join(dir, a.ns, "token")))
	if _, err := aAPI.CoreV1().Secrets(a.ns).Get(ctx, names.SigningSecret("orders"), metav1.GetOptions{}); err != nil {
		t.Errorf("namespace %s's identity cannot read its own signing Secret: %v", a.ns, err)
	}
	if _, err := aAPI.CoreV1().Secrets(b.ns).Get(ctx, names.SigningSecret("orders"), metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("namespace %s's identity reading namespace %s's signing Secret: %v, want forbidden", a.ns, b.ns, err)
	}
	if _, err := aAPI.CoreV1().Secrets(b.ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("namespace %s's identity listing namespace %s's Secrets: %v, want forbidden", a.ns, b.ns, err)
	}
	ownAPI := kubernetes.NewForConfigOrDie(own)
	for _, ns := range []string{a.ns, b.ns} {
		if _, err := ownAPI.CoreV1().Secrets(ns).Get(ctx, names.SigningSecret("orders"), metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the shared dispatcher's own identity reading namespace %s's signing Secret: %v, want forbidden", ns, err)
		}
	}
	aBus, err := os.ReadFile(filepath.Join(dir, a.ns, "nats-token"))
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(a.cfg.NATS.URL, append(natsauth.ClientOptions(func() string { return string(aBus) }, b.ns), nats.MaxReconnects(0))...); err == nil {
		nc.Close()
		t.Errorf("namespace %s's bus token connected as namespace %s", a.ns, b.ns)
	}
	denied := make(chan error, 4)
	nc, err := nats.Connect(a.cfg.NATS.URL, append(natsauth.ClientOptions(func() string { return string(aBus) }, a.ns),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { denied <- err }))...)
	if err != nil {
		t.Fatalf("namespace %s's bus token: %v", a.ns, err)
	}
	defer nc.Close()
	if _, err := nc.SubscribeSync(b.set.EventSubject(">")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-denied:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("subscribing to namespace %s's events with namespace %s's bus token: %v, want a permission violation", b.ns, a.ns, err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("namespace %s's bus token subscribed to namespace %s's events", a.ns, b.ns)
	}

	// Every served namespace's connection is in the one registry.
	connected := gaugesByNamespace(t, reg, "webhook_nats_connected")
	for _, ns := range []string{a.ns, b.ns} {
		if connected[ns] != 1 {
			t.Errorf("webhook_nats_connected{namespace=%q} = %v, want 1 (%v)", ns, connected[ns], connected)
		}
	}

	// b let go and named again at once: served again once its last dispatcher drained.
	s.Serve(pool(a.ns))
	s.Serve(pool(a.ns, b.ns))
	b.publish("order.created", "order-again", []byte(`{"tenant":"`+b.ns+`"}`))
	testenv.Eventually(t, 60*time.Second, func() bool { return rcv[b.ns].RequestsByID()["order-again"] > 0 },
		"namespace %s, named again, did not deliver", b.ns)

	// b is let go: its dispatcher stops and its tokens are removed.
	s.Serve(pool(a.ns))
	if got := s.Serving(); !slices.Equal(got, []string{a.ns}) {
		t.Errorf("serving %v after Serve(%s)", got, a.ns)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(dir, b.ns))
		return os.IsNotExist(err)
	}, "namespace %s's tokens are still kept", b.ns)
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, ok := gaugesByNamespace(t, reg, "webhook_nats_connected")[b.ns]
		return !ok
	}, "namespace %s's connection is still in the metrics", b.ns)
}

// runShared runs a shared dispatcher with o (and the test's dispatcher options, the bus of
// e) until the test ends, its metrics in reg.
func runShared(t *testing.T, e *env, o shared.Options, reg *prometheus.Registry) *shared.Shared {
	t.Helper()
	o.Dispatcher = dispatcher.Options{Config: e.cfg, Identity: "shared-0", StatusInterval: 200 * time.Millisecond,
		HealthFlushInterval: 100 * time.Millisecond, LeaseTTL: 3 * time.Second, ShutdownGrace: 5 * time.Second, Registry: reg,
		PullExpiry: 2 * time.Second}
	o.Audience, o.MetricsAddr, o.ProbeAddr, o.Retry = natsauth.DefaultAudience, "0", "0", 200*time.Millisecond
	s, err := shared.New(o)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-ran:
			if err != nil {
				t.Errorf("the shared dispatcher: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("the shared dispatcher did not stop")
		}
	})
	return s
}

// pool is the pool entries of namespaces, each awake.
func pool(namespaces ...string) []shared.Entry {
	out := make([]shared.Entry, 0, len(namespaces))
	for _, ns := range namespaces {
		out = append(out, shared.Entry{Namespace: ns, Awake: true})
	}
	return out
}

// dispatcherRole gives namespace ns's dispatcher ServiceAccount the Role the controller gives
// it: read the endpoints and policies, patch their status, get exactly secrets, record Events.
func dispatcherRole(t testing.TB, ns string, secrets ...string) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: names.SharedDispatcher}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookendpoints", "retrypolicies"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookendpoints/status"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: secrets},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: names.SharedDispatcher},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: names.SharedDispatcher}}}
	for _, obj := range []client.Object{role, binding} {
		if err := cp.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
}

// tokenGrant lets ServiceAccount saNamespace/sa create tokens of namespace ns's dispatcher
// ServiceAccount, and nothing else.
func tokenGrant(t testing.TB, ns, saNamespace, sa string) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhook-shared-dispatcher"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, Verbs: []string{"create"}, ResourceNames: []string{names.SharedDispatcher}},
	}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: saNamespace, Name: sa}}}
	if err := cp.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
}

// saRestConfig reaches the test's API server as ServiceAccount ns/sa (a token of the API
// server's audience in a file).
func saRestConfig(t testing.TB, ns, sa string) *rest.Config {
	t.Helper()
	seconds := int64(3600)
	tr, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	return shared.AsServiceAccount(cp.Config, file)
}

// gaugesByNamespace reads gauge name's values by their namespace label from reg.
func gaugesByNamespace(t testing.TB, reg prometheus.Gatherer, name string) map[string]float64 {
	t.Helper()
	return countersBy(t, reg, name, "namespace")
}
