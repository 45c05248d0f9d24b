package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Namespaces are tenants. With every credential namespace a's dispatcher and a's users can
// obtain, nothing of namespace b can be read, consumed, published, acknowledged or changed in
// its bucket, and no stream (of a or b) can be deleted or purged; an event id published in
// both namespaces is delivered in both.
func TestNamespacesCannotReachEachOther(t *testing.T) {
	ctx := context.Background()
	const nsA, nsB = "tenant-a", "tenant-b"
	a, b := newUser(t, nsA), newUser(t, nsB)
	rcvA, rcvB := tenantEndpoint(t, a), tenantEndpoint(t, b)

	// The same event id in both namespaces: de-duplication is per namespace.
	a.publish("order.created", "order-1001", `{"tenant":"a"}`)
	b.publish("order.created", "order-1001", `{"tenant":"b"}`)
	b.publish("order.created", "order-b-only", `{"tenant":"b"}`)
	receive(t, rcvA, "order-1001")
	receive(t, rcvB, "order-1001", "order-b-only")
	if body := string(rcvA.Body("order-1001")); !strings.Contains(body, `"a"`) {
		t.Errorf("a received %s for order-1001, want a's event", body)
	}
	if body := string(rcvB.Body("order-1001")); !strings.Contains(body, `"b"`) {
		t.Errorf("b received %s for order-1001, want b's event", body)
	}

	busA, busB := natsauth.BusOf(streams.DefaultConfig())(nsA), natsauth.BusOf(streams.DefaultConfig())(nsB)
	admin, adminJS, err := stack.ConnectAdmin(nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	// b is quiet once its deliveries are acknowledged, their log records stored and folded
	// into its health counts (the fold's checkpoint has reached the log's last record).
	var before busState
	testenv.Eventually(t, 60*time.Second, func() error {
		before = stateOf(t, adminJS, busB, "orders")
		if before.pending != 0 {
			return fmt.Errorf("b still has %d deliveries pending", before.pending)
		}
		if folded, last := foldedThrough(t, adminJS, busB), before.streams[busB.Attempts.Name][1]; folded < last {
			return fmt.Errorf("b's fold is at %d of %d log records", folded, last)
		}
		if again := stateOf(t, adminJS, busB, "orders"); !reflect.DeepEqual(again, before) {
			return fmt.Errorf("b is still changing")
		}
		return nil
	}, "")

	// What a can obtain: its dispatcher's tokens (whoever may create pods or tokens in a),
	// its users' tokens, a producer's, and the Secrets the controller puts in a.
	cs := kubernetes.NewForConfigOrDie(stack.ControlPlane.Config)
	grant(t, cs, nsA, "editor", "webhook-operator-editor")
	grant(t, cs, nsA, "viewer", "webhook-operator-viewer")
	producer, err := stack.Producer(ctx, nsA)
	if err != nil {
		t.Fatal(err)
	}
	creds := map[string][]nats.Option{
		"the dispatcher's projected token": tokenOptions(t, cs, nsA, names.SharedDispatcher, natsauth.DefaultAudience),
		"the dispatcher's API token":       tokenOptions(t, cs, nsA, names.SharedDispatcher, ""),
		"an editor's token":                tokenOptions(t, cs, nsA, "editor", natsauth.DefaultAudience),
		"an editor's API token":            tokenOptions(t, cs, nsA, "editor", ""),
		"a viewer's token":                 tokenOptions(t, cs, nsA, "viewer", natsauth.DefaultAudience),
		"a producer's token":               producer,
	}
	mirror := &corev1.Secret{}
	if err := stack.Client.Get(ctx, types.NamespacedName{Namespace: nsA, Name: names.NATSSecret}, mirror); err != nil {
		t.Fatal(err)
	}
	for k := range mirror.Data {
		if !slices.Contains([]string{"ca.crt", "tls.crt", "tls.key"}, k) {
			t.Errorf("the NATS Secret in namespace a holds %q: only TLS material may reach a tenant", k)
		}
	}

	for name, opts := range creds {
		t.Run(name, func(t *testing.T) {
			// Asking for namespace b is refused at once.
			if nc, err := connectAs(opts, nsB); err == nil {
				nc.close()
				t.Fatalf("connected to namespace %s", nsB)
			}
			nc, err := connectAs(opts, nsA)
			if strings.HasSuffix(name, "API token") {
				// A token of the API server's audience is refused: it would be good there too.
				if err == nil {
					nc.close()
					t.Fatalf("connected to namespace %s with a token of the API server's audience", nsA)
				}
				return
			}
			if name == "a viewer's token" {
				// A viewer reads through the data API and has nothing to do on the bus.
				if err == nil {
					nc.close()
					t.Fatalf("a viewer connected to namespace %s: tenants hold no read grant on the bus", nsA)
				}
				return
			}
			if err != nil {
				t.Fatalf("connecting to namespace %s: %v", nsA, err)
			}
			defer nc.close()
			nc.attack(t, busA, busB, strings.HasPrefix(name, "the dispatcher's"))
		})
	}
	t.Run("the mirrored client certificate without a token", func(t *testing.T) {
		dir := t.TempDir()
		for k, v := range mirror.Data {
			if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		nc, err := nats.Connect(stack.NATSURL, nats.RootCAs(filepath.Join(dir, "ca.crt")),
			nats.ClientCert(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")), nats.MaxReconnects(0), nats.Timeout(natsauth.ConnectTimeout))
		if err == nil {
			nc.Close()
			t.Fatal("the client certificate alone got a connection")
		}
	})
	t.Run("a's editor with kubectl webhooks in namespace b", func(t *testing.T) {
		kc := tokenKubeconfig(t, cs, nsA, "editor")
		if r := pluginAs(t, kc, nsA, "dlq", "list"); r.code != 0 {
			t.Fatalf("kubectl webhooks -n %s dlq list as a's editor: exit %d\n%s%s", nsA, r.code, r.stdout, r.stderr)
		}
		// Refused by the API server (endpoints of b) or by the callout (the bus in b).
		for _, args := range [][]string{{"dlq", "list"}, {"log", "orders"}, {"replay", "orders", "--all"}} {
			r := pluginAs(t, kc, nsB, args...)
			if r.code == 0 || !strings.Contains(r.stderr, "forbidden") && !strings.Contains(r.stderr, "Kubernetes RBAC must allow") {
				t.Errorf("kubectl webhooks -n %s %s as a's editor: exit %d\n%s%s", nsB, strings.Join(args, " "), r.code, r.stdout, r.stderr)
			}
		}
		if r := pluginAs(t, kc, nsB, "publish", "order.created", "--data", "{}"); r.code == 0 || !strings.Contains(r.stderr, "Kubernetes RBAC must allow") {
			t.Errorf("kubectl webhooks -n %s publish as a's editor: exit %d\n%s%s", nsB, r.code, r.stdout, r.stderr)
		}
	})

	// Nothing of b changed, no stream of a or b is gone, and b still delivers its own events.
	if after := stateOf(t, adminJS, busB, "orders"); !reflect.DeepEqual(after, before) {
		t.Errorf("namespace b changed:\nbefore %+v\nafter  %+v", before, after)
	}
	for _, bus := range []natsauth.Bus{busA, busB} {
		for _, s := range []string{bus.Events.Name, bus.Deliveries.Name, bus.Attempts.Name, bus.DeadLetters.Name, "KV_" + bus.Bucket} {
			if _, err := adminJS.Stream(ctx, s); err != nil {
				t.Errorf("stream %s: %v", s, err)
			}
		}
		for stream, consumer := range sharedConsumers(bus) {
			if _, err := adminJS.Consumer(ctx, stream, consumer); err != nil {
				t.Errorf("consumer %s of %s: %v", consumer, stream, err)
			}
		}
	}
	// b's dispatcher's inboxes, as NATS monitoring (/connz?subs=1) lists them, are no use to
	// a: claimed as a password, with b's public nkey, or subscribed to from a's own
	// connection, they bring nothing of what b's dispatcher pulls.
	spies := claimInboxes(t, producer, nsA, dispatcherInboxes(t, nsB))
	// Meanwhile a floods the auth callout with bad CONNECTs from a host of its own: b still
	// connects (the plugin's publish) and its dispatcher delivers.
	stopFlood := floodCallout(t, "127.0.0.2")
	b.publish("order.created", "order-b-after", `{"tenant":"b"}`)
	receive(t, rcvB, "order-b-after")
	if n := stopFlood(); n == 0 {
		t.Error("the flood made no attempt")
	}
	if n := spies.stolen(t); n != 0 {
		t.Errorf("a received %d messages sent to b's dispatcher's inboxes", n)
	}
	// A tenant's connection is bounded: a producer of a cannot publish beyond its payload
	// limit (the server's own is larger).
	pc, err := connectAs(producer, nsA)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.close()
	if err := pc.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := pc.nc.Publish("webhooks."+nsA+".order.created", make([]byte, 2<<20)); !errors.Is(err, nats.ErrMaxPayload) {
		t.Errorf("a producer's 2 MiB event: %v (limit %d), want %v", err, pc.nc.MaxPayload(), nats.ErrMaxPayload)
	}
	for _, id := range []string{"order-b-only", "order-b-after"} {
		if rcvA.Count(id) != 0 {
			t.Errorf("a's receiver got b's event %s", id)
		}
	}
}

// tenantEndpoint creates the endpoint "orders" in u's namespace, delivering to a new receiver.
func tenantEndpoint(t *testing.T, u *user) *testenv.Receiver {
	t.Helper()
	rcv, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: testenv.SecretKey(stack.Client, u.ns, "orders-signing", "secret")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rcv.Close() })
	u.apply(fmt.Sprintf(`
apiVersion: v1
kind: Secret
metadata:
  name: orders-signing
  annotations: {webhook-operator.io/allowed-endpoints: orders}
stringData: {secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: orders}
spec:
  url: %s
  eventTypes: [order.*]
  signing: {secretRef: {name: orders-signing, key: secret}}
`, rcv.URL()))
	u.waitReady("orders")
	return rcv
}

// busState is what can change in a namespace's streams, bucket and consumers.
type busState struct {
	streams   map[string][2]uint64 // messages, last sequence
	keys      map[string]uint64    // bucket key (not leases) -> its last sequence
	consumers map[string][2]uint64 // delivered, acknowledged stream sequence
	pending   uint64
}

func stateOf(t *testing.T, js jetstream.JetStream, bus natsauth.Bus, endpoint string) busState {
	t.Helper()
	ctx := context.Background()
	st := busState{streams: map[string][2]uint64{}, keys: map[string]uint64{}, consumers: map[string][2]uint64{}}
	for _, name := range []string{bus.Events.Name, bus.Deliveries.Name, bus.Attempts.Name, bus.DeadLetters.Name} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		st.streams[name] = [2]uint64{s.CachedInfo().State.Msgs, s.CachedInfo().State.LastSeq}
	}
	kv, err := js.KeyValue(ctx, bus.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys.Keys() {
		if strings.HasPrefix(k, streams.LeaseKeyPrefix) || strings.HasPrefix(k, streams.MemberKeyPrefix) {
			continue // the dispatcher renews its leases and its membership
		}
		e, err := kv.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		st.keys[k] = e.Revision()
	}
	for stream, consumer := range sharedConsumers(bus) {
		c, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			t.Fatal(err)
		}
		i := c.CachedInfo()
		st.consumers[stream+"/"+consumer] = [2]uint64{i.Delivered.Stream, i.AckFloor.Stream}
		st.pending += i.NumPending + uint64(i.NumAckPending)
	}
	return st
}

// foldedThrough is the last delivery-log sequence the shared dispatcher of bus's namespace
// folded into health counts (its checkpoint in the bucket), 0 before its first fold.
func foldedThrough(t *testing.T, js jetstream.JetStream, bus natsauth.Bus) uint64 {
	t.Helper()
	kv, err := js.KeyValue(context.Background(), bus.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), streams.FoldKey(""))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(string(e.Value()), 10, 64)
	return n
}

// grant makes ServiceAccount ns/name and binds it to clusterRole in ns. It may also request
// tokens for itself, as a platform team lets its users' ServiceAccounts do, so that kubectl
// webhooks gets one of the NATS audience.
func grant(t *testing.T, cs kubernetes.Interface, ns, name, clusterRole string) {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	self := name + "-token"
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: self}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{name}, Verbs: []string{"create"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: self},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: self},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func requestToken(t *testing.T, cs kubernetes.Interface, ns, sa, audience string) string {
	t.Helper()
	var aud []string
	if audience != "" {
		aud = []string{audience}
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: aud}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// tokenOptions are a connection's options with a token of ns/sa for audience ("" for the API
// server's). The namespace is chosen when connecting.
func tokenOptions(t *testing.T, cs kubernetes.Interface, ns, sa, audience string) []nats.Option {
	tok := requestToken(t, cs, ns, sa, audience)
	return []nats.Option{nats.TokenHandler(func() string { return tok })}
}

// tenantConn is a connection made with one of a's credentials, and the permissions the server
// refused it.
type tenantConn struct {
	nc    *nats.Conn
	inbox string
	mu    sync.Mutex
	errs  []string
}

// connectAs connects with opts' token asking for namespace ns, as a tenant's client does.
func connectAs(opts []nats.Option, ns string) (*tenantConn, error) {
	c := &tenantConn{}
	all := append([]nats.Option{}, opts...)
	// The namespace and a fresh nkey, whose inbox the connection gets (a producer's options
	// carry their own; these replace them).
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, _ := kp.PublicKey()
	c.inbox = natsauth.InboxOf(pub)
	all = append(all, nats.UserInfo(ns, ""), nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(c.inbox), nats.Timeout(natsauth.ConnectTimeout), nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			c.errs = append(c.errs, err.Error())
			c.mu.Unlock()
		}))
	all = append(all, stack.Auth.ClientOptions()...)
	nc, err := nats.Connect(stack.NATSURL, all...)
	if err != nil {
		return nil, err
	}
	c.nc = nc
	return c, nil
}

func (c *tenantConn) close() { c.nc.Close() }

// refused reports whether the server refused subject (a publish or a subscription).
func (c *tenantConn) refused(kind, subject string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	want := fmt.Sprintf("Permissions Violation for %s to %q", kind, subject)
	for _, e := range c.errs {
		if strings.Contains(e, want) {
			return true
		}
	}
	return false
}

// attack tries everything against b, and what no tenant may do in a, and checks the server
// refused each attempt. A dispatcher deletes the messages of its parks (the shared lane's
// acknowledgement of a message no consumer reads) on its own deliveries stream, which grants
// nothing its acknowledgements of that stream's work-queue consumers did not.
func (c *tenantConn) attack(t *testing.T, own, other natsauth.Bus, dispatcher bool) {
	t.Helper()
	api := func(s string) string { return "$JS.API." + s }
	var pubs []string
	for _, s := range []string{other.Events.Name, other.Deliveries.Name, other.Attempts.Name, other.DeadLetters.Name, "KV_" + other.Bucket} {
		pubs = append(pubs, api("STREAM.INFO."+s), api("DIRECT.GET."+s), api("DIRECT.GET."+s+".$KV."+other.Bucket+".health.orders"),
			api("STREAM.MSG.GET."+s), api("STREAM.DELETE."+s), api("STREAM.PURGE."+s), api("STREAM.UPDATE."+s))
	}
	for _, s := range []string{own.Events.Name, own.Deliveries.Name, own.Attempts.Name, own.DeadLetters.Name, "KV_" + own.Bucket} {
		if !dispatcher || s != own.Deliveries.Name {
			pubs = append(pubs, api("STREAM.MSG.DELETE."+s))
		}
		pubs = append(pubs, api("STREAM.DELETE."+s), api("STREAM.PURGE."+s), api("STREAM.UPDATE."+s),
			// A push consumer's deliver subject could name b's subjects.
			api("CONSUMER.CREATE."+s), api("CONSUMER.CREATE."+s+".x.>"), api("CONSUMER.DURABLE.CREATE."+s+".x"))
	}
	// An endpoint's own consumers have the same name on its deliveries and events streams; the
	// shared lane's are the namespace's intake and queue consumers.
	ep, ownEp := streams.EndpointConsumerOf(other.Namespace, "orders"), streams.EndpointConsumerOf(own.Namespace, "orders")
	in, q := streams.IntakeConsumer(other.Namespace), streams.DefaultConfig().For(other.Namespace).QueueConsumer()
	pubs = append(pubs,
		api("CONSUMER.INFO."+other.Events.Name+"."+in), api("CONSUMER.MSG.NEXT."+other.Events.Name+"."+in),
		api("CONSUMER.INFO."+other.Deliveries.Name+"."+q), api("CONSUMER.MSG.NEXT."+other.Deliveries.Name+"."+q),
		api("CONSUMER.DELETE."+other.Events.Name+"."+in), api("CONSUMER.DELETE."+other.Deliveries.Name+"."+q),
		"$JS.ACK."+other.Events.Name+"."+in+".1.1.1.1.0", "$JS.ACK."+other.Deliveries.Name+"."+q+".1.1.1.1.0",
		"whk.q."+other.Namespace+".orders", "whk.h."+other.Namespace+".orders", "whk.s."+other.Namespace+".orders.x",
		api("CONSUMER.INFO."+other.Deliveries.Name+"."+ep), api("CONSUMER.MSG.NEXT."+other.Deliveries.Name+"."+ep),
		api("CONSUMER.INFO."+other.Events.Name+"."+ep), api("CONSUMER.MSG.NEXT."+other.Events.Name+"."+ep),
		api("CONSUMER.DELETE."+other.Deliveries.Name+"."+ep), api("CONSUMER.DELETE."+own.Deliveries.Name+"."+ownEp),
		api("CONSUMER.DELETE."+own.Events.Name+"."+ownEp), api("STREAM.NAMES"), api("STREAM.LIST"), api("INFO"),
		"$JS.ACK."+other.Deliveries.Name+"."+ep+".1.1.1.1.0", "$JS.ACK."+other.Events.Name+"."+ep+".1.1.1.1.0",
		"webhooks."+other.Namespace+".order.created", "whk.d."+other.Namespace+".orders", "whk.r."+other.Namespace+".orders.x",
		"whk.log."+other.Namespace+".orders", "whk.dlq."+other.Namespace+".orders.x",
		"$KV."+other.Bucket+".health.orders", "$KV."+other.Bucket+".lease._shared", "$KV."+other.Bucket+".replay.orders.x",
		"_INBOX.x", "$SYS.REQ.USER.AUTH")
	reply := c.inbox + ".answers"
	for _, s := range pubs {
		if err := c.nc.PublishRequest(s, reply, []byte(`{"config":{"deliver_subject":"webhooks.`+other.Namespace+`.forged"}}`)); err != nil {
			t.Fatal(err)
		}
	}
	subs := []string{">", "webhooks." + other.Namespace + ".>", "whk.>", "_INBOX.>", "$JS.ACK.>", "$KV." + other.Bucket + ".>"}
	for _, s := range subs {
		_, _ = c.nc.SubscribeSync(s)
	}
	// Allowed requests whose reply names b's subjects: the answer stays in the tenants' account.
	for _, r := range [][2]string{
		{api("STREAM.INFO." + own.Events.Name), "webhooks." + other.Namespace + ".order.created"},
		{api("CONSUMER.INFO." + own.Deliveries.Name + "." + ownEp), "whk.d." + other.Namespace + ".orders"},
		{"webhooks." + own.Namespace + ".order.created", "$KV." + other.Bucket + ".health.orders"},
	} {
		_ = c.nc.PublishRequest(r[0], r[1], []byte("{}"))
	}
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		var missing []string
		for _, s := range pubs {
			if !c.refused("Publish", s) {
				missing = append(missing, s)
			}
		}
		for _, s := range subs {
			if !c.refused("Subscription", s) {
				missing = append(missing, s)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("not refused: %v", missing)
		}
		return nil
	}, "")
}

// tokenKubeconfig writes a kubeconfig whose user is ServiceAccount ns/sa.
func tokenKubeconfig(t *testing.T, cs kubernetes.Interface, ns, sa string) string {
	t.Helper()
	cfg := stack.ControlPlane.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: requestToken(t, cs, ns, sa, "")}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: sa, Namespace: ns}
	kc.CurrentContext = "local"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// pluginAs runs kubectl-webhooks with kubeconfig in namespace ns.
func pluginAs(t *testing.T, kubeconfig, ns string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// NATS given directly: a tenant may not read the operator's Secret.
	tls := stack.Auth.TLS
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubectl-webhooks"), append([]string{"--kubeconfig", kubeconfig, "-n", ns,
		"--nats-url", stack.NATSURL, "--nats-ca-file", tls.CA, "--nats-cert-file", tls.ClientCert, "--nats-key-file", tls.ClientKey}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	return runCommand(cmd)
}

// dispatcherInboxes are the inbox prefixes of the subscriptions of ns's dispatchers'
// connections, read as anyone who reaches NATS monitoring could (/connz?subs=1&auth=1).
func dispatcherInboxes(t *testing.T, ns string) []string {
	t.Helper()
	if stack.NATS == nil {
		t.Fatal("the stack's NATS is not embedded: no monitoring to read")
	}
	var out []string
	testenv.Eventually(t, 30*time.Second, func() error {
		cz, err := stack.NATS.Server.Connz(&server.ConnzOptions{Subscriptions: true, Username: true})
		if err != nil {
			return err
		}
		out = nil
		for _, c := range cz.Conns {
			if !strings.HasPrefix(c.AuthorizedUser, "system:serviceaccount:"+ns+":") {
				continue
			}
			for _, sub := range c.Subs {
				if p, _, _ := strings.Cut(sub, "."); strings.HasPrefix(p, "_INBOX") && !slices.Contains(out, p) {
					out = append(out, p)
				}
			}
		}
		if len(out) == 0 {
			return fmt.Errorf("monitoring lists no inbox of %s's dispatchers", ns)
		}
		return nil
	}, "")
	return out
}

// inboxSpies are connections of another namespace subscribed to a victim's inboxes.
type inboxSpies struct {
	conns []*nats.Conn
	n     atomic.Int64
}

// claimInboxes tries, with opts' token asking for namespace ns, every way of claiming each
// inbox, and keeps every connection the server let subscribe there.
func claimInboxes(t *testing.T, opts []nats.Option, ns string, inboxes []string) *inboxSpies {
	t.Helper()
	s := &inboxSpies{}
	for _, inbox := range inboxes {
		impostor, _ := nkeys.CreateUser()
		own, _ := nkeys.CreateUser()
		ownPub, _ := own.PublicKey()
		for _, claim := range [][]nats.Option{
			{nats.UserInfo(ns, inbox)},
			{nats.UserInfo(ns, ""), nats.Nkey(strings.TrimPrefix(inbox, "_INBOX_"), impostor.Sign)},
			{nats.UserInfo(ns, ""), nats.Nkey(ownPub, own.Sign)},
		} {
			all := append(append([]nats.Option{}, opts...), claim...)
			all = append(all, nats.CustomInboxPrefix(inbox), nats.MaxReconnects(0), nats.Timeout(natsauth.ConnectTimeout),
				nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
			all = append(all, stack.Auth.ClientOptions()...)
			nc, err := nats.Connect(stack.NATSURL, all...)
			if err != nil {
				continue // refused
			}
			t.Cleanup(nc.Close)
			if _, err := nc.Subscribe(inbox+".>", func(*nats.Msg) { s.n.Add(1) }); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			s.conns = append(s.conns, nc)
		}
	}
	return s
}

// stolen is what the spies received, once every copy the server queued to them arrived.
func (s *inboxSpies) stolen(t *testing.T) int64 {
	t.Helper()
	for _, nc := range s.conns {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	return s.n.Load()
}

// floodCallout connects to NATS from the loopback address ip, over and over, with bad tokens,
// until the returned function is called; that returns how many attempts were made.
func floodCallout(t *testing.T, ip string) (stop func() int64) {
	t.Helper()
	var attempts atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				kp, _ := nkeys.CreateUser()
				pub, _ := kp.PublicKey()
				opts := append([]nats.Option{nats.Token(fmt.Sprintf("not-a-token-%d-%d", time.Now().UnixNano(), attempts.Load())),
					nats.UserInfo("tenant-b", ""), nats.Nkey(pub, kp.Sign), nats.MaxReconnects(0), nats.Timeout(natsauth.ConnectTimeout),
					nats.SetCustomDialer(&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: natsauth.ConnectTimeout})},
					stack.Auth.ClientOptions()...)
				if nc, err := nats.Connect(stack.NATSURL, opts...); err == nil {
					nc.Close()
				}
				attempts.Add(1)
			}
		}()
	}
	var once sync.Once
	stop = func() int64 {
		once.Do(func() { close(done); wg.Wait() })
		return attempts.Load()
	}
	t.Cleanup(func() { stop() })
	testenv.Eventually(t, 60*time.Second, func() bool { return attempts.Load() >= 50 }, "the flood made %d attempts", attempts.Load())
	return stop
}

// sharedConsumers are the shared lane's consumers of bus's namespace, by stream: its intake
// on the events stream and its queue on the deliveries stream.
func sharedConsumers(bus natsauth.Bus) map[string]string {
	return map[string]string{
		bus.Events.Name:     streams.IntakeConsumer(bus.Namespace),
		bus.Deliveries.Name: streams.DefaultConfig().For(bus.Namespace).QueueConsumer(),
	}
}
