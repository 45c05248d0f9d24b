package console_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/console"
	"github.com/webhook-operator/webhook-operator/internal/dataapi"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// chromium is Debian's chromium, or "" when it is not installed.
func chromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

const hostile = `<script>document.title="pwned"</script><img src=x onerror="document.title='pwned'">`

// A viewer signs in with a ServiceAccount token in a real browser and sees what RBAC lets
// the token see: the endpoints of their namespace and not another's, a refused action with
// why, a hostile payload as text, and a dead letter replayed as a WebhookReplay. The console
// calls a real kube-apiserver (with the data API aggregated, over a real NATS) as the user.
func TestConsoleInABrowser(t *testing.T) {
	chrome := chromium()
	if chrome == "" {
		t.Skip("chromium is not installed: the console's browser test needs it (Debian: apt-get install -y chromium); see docs/console.md")
	}
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	dir := t.TempDir()
	cp, err := testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{Aggregation: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	n, err := testenv.StartNATS("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Cleanup)
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := streams.DefaultConfig()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	startDataAPI(t, ctx, cp, &dataapi.Bus{NC: nc, JS: js, Streams: cfg}, dir)
	startReplays(t, ctx, cp, n.URL())

	// Two tenants; the viewer is shop's.
	c := cp.Client
	for _, ns := range []string{"shop", "other"} {
		must(t, c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
		must(t, cfg.For(ns).Ensure(ctx, js))
		must(t, c.Create(ctx, &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ns + "-orders"},
			Spec: v1alpha1.WebhookEndpointSpec{URL: "https://" + ns + ".example.com/hooks", EventTypes: []v1alpha1.EventTypePattern{"order.*"}}}))
	}
	token := viewer(t, ctx, cp, "shop")

	// What the dispatcher would have stored: a delivery of a hostile event, answered with a
	// hostile body, and a dead letter.
	st := testenv.Stored{T: t, JS: js, Set: cfg.For("shop")}
	now := time.Now().UTC()
	seq := st.Event("order.created", "evt_hostile", `{"note":`+quote(hostile)+`}`, nil)
	m := st.Delivery("shop-orders", "evt_hostile", seq, now.Add(-time.Minute))
	st.Log(records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, EventSeq: seq, Namespace: "shop", Endpoint: "shop-orders",
		State: records.StateSucceeded, Attempt: 1, Time: m.Created, LatencyMS: 12, LatencyUS: 12000,
		RequestHeaders: map[string]string{"X-Note": hostile}, Response: records.Response{StatusCode: 200, Body: hostile}})
	dlSeq := st.Event("order.created", "evt_dead", `{"id":2}`, nil)
	dm := st.Delivery("shop-orders", "evt_dead", dlSeq, now.Add(-2*time.Minute))
	st.DeadLetter(dm, 3, records.ReasonExhausted, `{"id":2}`, now.Add(-time.Minute), nil)

	srv := httptest.NewUnstartedServer(nil)
	s, err := console.New(ctx, console.Options{Kube: cp.Config, Namespaces: []string{"shop", "other"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	must(t, err)
	srv.Config.Handler = s
	srv.StartTLS()
	t.Cleanup(srv.Close)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox,
		chromedp.IgnoreCertErrors, chromedp.WindowSize(1280, 900))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	// The first run starts the browser, on a context without a deadline; each step after it
	// is bounded.
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting %s: %v", chrome, err)
	}
	b := &browser{t: t, ctx: bctx, shots: os.Getenv("CONSOLE_SCREENSHOTS")}

	// Sign in with the token.
	b.do("signing in",
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		b.shot("signin"),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("namespaces")),
	)
	namespaces, who := b.text("namespaces"), b.text("who")
	if !strings.Contains(who, "system:serviceaccount:shop:viewer") {
		t.Errorf("the page says %q, not who signed in", who)
	}
	if !strings.Contains(namespaces, "shop") || strings.Contains(namespaces, "other") {
		t.Errorf("the viewer sees namespaces %q, want shop and not other", namespaces)
	}

	// shop's endpoints; other's are refused, with why.
	b.do("the namespace page", chromedp.Navigate(srv.URL+"/ns/shop"), chromedp.WaitVisible(chromedp.ID("endpoints")), b.shot("namespace"))
	endpoints := b.text("endpoints")
	b.do("another namespace", chromedp.Navigate(srv.URL+"/ns/other"), chromedp.WaitVisible(chromedp.ID("error")))
	refusal := b.text("error")
	if !strings.Contains(endpoints, "shop-orders") || strings.Contains(endpoints, "other-orders") {
		t.Errorf("shop's endpoints read %q", endpoints)
	}
	if !strings.Contains(refusal, "forbidden") || strings.Contains(refusal, "other-orders") {
		t.Errorf("another namespace's endpoints: %q, want a refusal", refusal)
	}

	// The endpoint: Enable is refused, and the page says why.
	b.do("the endpoint page", chromedp.Navigate(srv.URL+"/ns/shop/endpoints/shop-orders"), chromedp.WaitVisible(chromedp.ID("deliveries")), b.shot("endpoint"))
	why := b.text("enable-why")
	disabled := run(b, "the Enable button", chromedp.Evaluate[bool](`document.getElementById("enable").disabled`))
	if !disabled || !strings.Contains(why, "RBAC does not allow you to patch webhookendpoints.webhook-operator.io in namespace shop") {
		t.Errorf("Enable is disabled=%v and says %q", disabled, why)
	}

	// The hostile payload, headers and response are text.
	b.do("the delivery page", chromedp.Navigate(srv.URL+"/ns/shop/deliveries/"+m.DeliveryID), chromedp.WaitVisible(chromedp.ID("event")), b.shot("delivery"))
	event, response := b.text("event"), b.text("response")
	markup := run(b, "counting markup", chromedp.Evaluate[int](`document.querySelectorAll("main script, main img").length`))
	title := run(b, "the title", chromedp.Title())
	if !strings.Contains(event, `<script>document.title=\"pwned\"</script>`) || !strings.Contains(response, hostile) || markup != 0 || title == "pwned" {
		t.Errorf("the hostile payload is not shown as text: event %q, response %q, %d elements of markup, title %q", event, response, markup, title)
	}

	// Replay the dead letter: a WebhookReplay of that delivery is created and shown.
	b.do("replaying a dead letter",
		chromedp.Navigate(srv.URL+"/ns/shop/deadletters"),
		chromedp.WaitVisible(chromedp.CSS("#deadletters button.replay")),
		b.shot("deadletters"),
		chromedp.Click(chromedp.CSS("#deadletters button.replay")),
		chromedp.WaitVisible(chromedp.ID("replay-state")),
	)
	// The controller replays it: the page, reloaded, says so.
	var state string
	testenv.Eventually(t, 30*time.Second, func() bool {
		b.do("reloading the replay", chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("replay-state")))
		state = b.text("replay-state")
		return strings.HasPrefix(state, "Complete")
	}, "the replay page did not say Complete")
	b.do("the replay page", b.shot("replay"))
	var replays v1alpha1.WebhookReplayList
	must(t, c.List(ctx, &replays, client.InNamespace("shop")))
	if len(replays.Items) != 1 || len(replays.Items[0].Spec.DeliveryIDs) != 1 || replays.Items[0].Spec.DeliveryIDs[0] != dm.DeliveryID ||
		replays.Items[0].Spec.EndpointRef.Name != "shop-orders" {
		t.Errorf("the replay created: %+v", replays.Items)
	}
	if !strings.Contains(state, "1 selected, 1 replayed, 0 skipped, 0 failed") {
		t.Errorf("the replay page says %q", state)
	}

	// A form without the session's anti-forgery token is refused.
	b.do("a forged form",
		chromedp.Navigate(srv.URL+"/ns/shop/deadletters"),
		chromedp.WaitVisible(chromedp.CSS("#deadletters button.replay")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[any](`document.querySelectorAll("input[name=csrf]").forEach(e => e.value = "forged"); null`)(ctx, tg)
			return err
		}),
		chromedp.Click(chromedp.CSS("#deadletters button.replay")),
		chromedp.WaitVisible(chromedp.ID("error")),
	)
	if forged := b.text("error"); !strings.Contains(forged, "anti-forgery token") {
		t.Errorf("a forged form got %q", forged)
	}
}

// browser drives one tab, each step bounded.
type browser struct {
	t     *testing.T
	ctx   context.Context
	shots string
}

const stepTimeout = 20 * time.Second

func run[T any](b *browser, what string, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		loc, _ := chromedp.Run(b.ctx, chromedp.Location())
		body, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		b.t.Fatalf("%s: %v (at %s: %q)", what, err, loc, body)
	}
	return v
}

func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	run(b, what, chromedp.Steps(steps...))
}

func (b *browser) text(id string) string {
	b.t.Helper()
	return run(b, "reading #"+id, chromedp.Text(chromedp.ID(id)))
}

// shot saves a screenshot of the page as docs/images/console-<name>.png when
// CONSOLE_SCREENSHOTS names a directory.
func (b *browser) shot(name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if b.shots == "" {
			return nil
		}
		png, err := chromedp.FullScreenshot(100)(ctx, tg)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(b.shots, "console-"+name+".png"), png, 0o644)
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func quote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// viewer is a ServiceAccount of ns that may read endpoints, deliveries (with payloads) and
// dead letters, and create replays, but not change endpoints, publish or purge: its token.
func viewer(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, ns string) string {
	t.Helper()
	c := cp.Client
	must(t, c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "viewer"}}))
	must(t, c.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "viewer"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookendpoints", "webhookreplays", "webhookquotas"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookreplays"}, Verbs: []string{"create"}},
		{APIGroups: []string{datav1alpha1.GroupName}, Resources: []string{datav1alpha1.ResourceDeliveries, datav1alpha1.ResourceDeadLetters, datav1alpha1.ResourceDeliveries + "/payload"}, Verbs: []string{"get", "list"}},
	}}))
	must(t, c.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "viewer"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "viewer"}}}))
	cs, err := kubernetes.NewForConfig(cp.Config)
	must(t, err)
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "viewer", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	must(t, err)
	return tr.Status.Token
}

// startReplays runs the controller's WebhookReplay reconciler in this process.
func startReplays(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, natsURL string) {
	t.Helper()
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{Scheme: scheme.New(), Cache: controllers.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	must(t, err)
	cfg := opconfig.Default()
	cfg.NATS.URL = natsURL
	cjs, err := controllers.ConnectJetStream(&cfg)
	must(t, err)
	t.Cleanup(cjs.Close)
	must(t, controllers.SetupReplays(ctx, mgr, &controllers.Options{Config: cfg}, cjs))
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// startDataAPI runs the data API in this process, registered with the aggregator, as the
// data API's own tests do.
func startDataAPI(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, bus *dataapi.Bus, dir string) {
	t.Helper()
	admin, err := cp.WriteKubeconfig(dir)
	must(t, err)
	const service = "webhook-operator-apiserver"
	serving, err := testenv.WriteTLSFor(filepath.Join(dir, "serving"), testenv.APIServiceHost(service))
	must(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	o := dataapi.NewOptions()
	o.SecureServing.Listener, o.SecureServing.BindPort = ln, port
	o.SecureServing.ServerCert.CertKey.CertFile, o.SecureServing.ServerCert.CertKey.KeyFile = serving.ServerCert, serving.ServerKey
	o.Kubeconfig = admin
	s, err := dataapi.New(o, bus)
	must(t, err)
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(sctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	ca, err := os.ReadFile(serving.CA)
	must(t, err)
	must(t, cp.RegisterAPIService(ctx, service, datav1alpha1.GroupName, datav1alpha1.SchemeGroupVersion.Version, port, ca))
}
