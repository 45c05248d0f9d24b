package console_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
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
	"github.com/webhook-operator/webhook-operator/internal/console/consoletest"
	"github.com/webhook-operator/webhook-operator/internal/dataapi"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A viewer signs in with a ServiceAccount token in a real browser and sees what RBAC lets
// the token see: the endpoints of their namespace and not another's, a refused action with
// why, a hostile payload as text, and a dead letter replayed as a WebhookReplay. The console
// calls a real kube-apiserver (with the data API aggregated, over a real NATS) as the user.
func TestConsoleInABrowser(t *testing.T) {
	consoletest.Need(t)
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
	seq := st.Event("order.created", "evt_hostile", consoletest.HostileEvent(), nil)
	m := st.Delivery("shop-orders", "evt_hostile", seq, now.Add(-time.Minute))
	st.Log(records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, EventSeq: seq, Namespace: "shop", Endpoint: "shop-orders",
		State: records.StateSucceeded, Attempt: 1, Time: m.Created, LatencyMS: 12, LatencyUS: 12000,
		RequestHeaders: map[string]string{"X-Note": consoletest.Hostile}, Response: records.Response{StatusCode: 200, Body: consoletest.Hostile}})
	// Two dead letters, the newest first in the list.
	dl2Seq := st.Event("order.created", "evt_dead2", `{"id":3}`, nil)
	dm2 := st.Delivery("shop-orders", "evt_dead2", dl2Seq, now.Add(-3*time.Minute))
	st.DeadLetter(dm2, 3, records.ReasonExhausted, `{"id":3}`, now.Add(-2*time.Minute), nil)
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

	b := consoletest.Start(t, srv.URL)

	// Sign in with the token.
	b.Do("signing in",
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		b.Shot("signin"),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("namespaces")),
	)
	namespaces, who := b.Text("namespaces"), b.Text("who")
	if !strings.Contains(who, "system:serviceaccount:shop:viewer") {
		t.Errorf("the page says %q, not who signed in", who)
	}
	if !strings.Contains(namespaces, "shop") || strings.Contains(namespaces, "other") {
		t.Errorf("the viewer sees namespaces %q, want shop and not other", namespaces)
	}

	// shop's endpoints; other's are refused, with why.
	b.Do("the namespace page", chromedp.Navigate(srv.URL+"/ns/shop"), chromedp.WaitVisible(chromedp.ID("endpoints")), b.Shot("namespace"))
	endpoints := b.Text("endpoints")
	b.Do("another namespace", chromedp.Navigate(srv.URL+"/ns/other"), chromedp.WaitVisible(chromedp.ID("error")))
	refusal := b.Text("error")
	if !strings.Contains(endpoints, "shop-orders") || strings.Contains(endpoints, "other-orders") {
		t.Errorf("shop's endpoints read %q", endpoints)
	}
	if !strings.Contains(refusal, "forbidden") || strings.Contains(refusal, "other-orders") {
		t.Errorf("another namespace's endpoints: %q, want a refusal", refusal)
	}

	// The endpoint: Enable is refused, and the page says why.
	b.Do("the endpoint page", chromedp.Navigate(srv.URL+"/ns/shop/endpoints/shop-orders"), chromedp.WaitVisible(chromedp.ID("deliveries")), b.Shot("endpoint"))
	why := b.Text("enable-why")
	disabled := consoletest.Run(b, "the Enable button", chromedp.Evaluate[bool](`document.getElementById("enable").disabled`))
	if !disabled || !strings.Contains(why, "RBAC does not allow you to patch webhookendpoints.webhook-operator.io in namespace shop") {
		t.Errorf("Enable is disabled=%v and says %q", disabled, why)
	}
	// So is rotating the signing secret.
	if why := b.Text("rotate-why"); !strings.Contains(why, "RBAC does not allow you to") {
		t.Errorf("Rotate says %q", why)
	}
	// The endpoint's chart counts its delivery.
	if summary := b.Text("chart-summary"); !strings.HasPrefix(summary, "1 delivered, 0 failed") {
		t.Errorf("the endpoint's chart says %q", summary)
	}

	// The hostile payload, headers and response are text.
	b.Do("the delivery page", chromedp.Navigate(srv.URL+"/ns/shop/deliveries/"+m.DeliveryID), chromedp.WaitVisible(chromedp.ID("event")), b.Shot("delivery"))
	event, response := b.Text("event"), b.Text("response")
	markup := consoletest.Run(b, "counting markup", chromedp.Evaluate[int](`document.querySelectorAll("main script, main img").length`))
	title := consoletest.Run(b, "the title", chromedp.Title())
	if !strings.Contains(event, `<script>document.title=\"pwned\"</script>`) || !strings.Contains(response, consoletest.Hostile) || markup != 0 || title == "pwned" {
		t.Errorf("the hostile payload is not shown as text: event %q, response %q, %d elements of markup, title %q", event, response, markup, title)
	}

	// Replay the dead letter: a WebhookReplay of that delivery is created and shown.
	b.Do("replaying a dead letter",
		chromedp.Navigate(srv.URL+"/ns/shop/deadletters"),
		chromedp.WaitVisible(chromedp.CSS("#deadletters button.replay")),
		b.Shot("deadletters"),
		chromedp.Click(chromedp.CSS("#deadletters button.replay")),
		chromedp.WaitVisible(chromedp.ID("replay-state")),
	)
	// The controller replays it: the page, reloaded, says so.
	var state string
	testenv.Eventually(t, 30*time.Second, func() bool {
		b.Do("reloading the replay", chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("replay-state")))
		state = b.Text("replay-state")
		return strings.HasPrefix(state, "Complete")
	}, "the replay page did not say Complete")
	b.Do("the replay page", b.Shot("replay"))
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
	b.Do("a forged form",
		chromedp.Navigate(srv.URL+"/ns/shop/deadletters"),
		chromedp.WaitVisible(chromedp.CSS("#deadletters button.replay")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[any](`document.querySelectorAll("input[name=csrf]").forEach(e => e.value = "forged"); null`)(ctx, tg)
			return err
		}),
		chromedp.Click(chromedp.CSS("#deadletters button.replay")),
		chromedp.WaitVisible(chromedp.ID("error")),
	)
	if forged := b.Text("error"); !strings.Contains(forged, "anti-forgery token") {
		t.Errorf("a forged form got %q", forged)
	}

	// The endpoint's owner: the namespace's chart, filter and transform edited with an
	// evaluation before saving, the signing secret rotated, dead letters replayed at once.
	owner := owner(t, ctx, cp, "shop")
	b.Do("signing out and in as the owner",
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("namespaces")),
		chromedp.Click(chromedp.CSS("header button")),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), owner),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(chromedp.ID("namespaces")),
	)
	if who := b.Text("who"); !strings.Contains(who, "system:serviceaccount:shop:owner") {
		t.Errorf("signed in as %q", who)
	}
	b.Do("the namespace's chart", chromedp.Navigate(srv.URL+"/ns/shop"), chromedp.WaitVisible(chromedp.ID("chart-svg")))
	slots := consoletest.Run(b, "counting the chart's slots", chromedp.Evaluate[int](`document.querySelectorAll("#chart-svg g.slot").length`))
	if summary := b.Text("chart-summary"); slots != 24 || !strings.HasPrefix(summary, "1 delivered, 0 failed (100.0% delivered); latency p50") {
		t.Errorf("the namespace's chart has %d slots and says %q", slots, summary)
	}

	b.Do("evaluating a filter and a transformation",
		chromedp.Navigate(srv.URL+"/ns/shop/endpoints/shop-orders"),
		chromedp.WaitVisible(chromedp.ID("edit-expressions")),
		chromedp.Click(chromedp.ID("edit-expressions")),
		chromedp.WaitVisible(chromedp.ID("expressions")),
		chromedp.SetValue(chromedp.ID("sample"), m.DeliveryID),
		chromedp.SetValue(chromedp.ID("filter"), `has(payload.note) && payload.note.contains("pwned")`),
		chromedp.SetValue(chromedp.ID("body"), `{"text": "Note: " + payload.note}`),
		chromedp.SetValue(chromedp.ID("headers"), "X-Note-Length: size(payload.note)"),
		chromedp.Click(chromedp.ID("evaluate")),
		chromedp.WaitVisible(chromedp.ID("result")),
		b.Shot("expressions"),
	)
	verdict, out := b.Text("filter-result"), b.Text("transform-body")
	markup = consoletest.Run(b, "counting markup", chromedp.Evaluate[int](`document.querySelectorAll("main script, main img").length`))
	if !strings.Contains(verdict, "true: the endpoint gets the event") || !strings.Contains(out, `"text":"Note: \u003cscript\u003edocument.title`) || markup != 0 {
		t.Errorf("the evaluation says %q and %q (%d elements of markup)", verdict, out, markup)
	}
	b.Do("saving them", chromedp.Click(chromedp.ID("save")), chromedp.WaitVisible(chromedp.ID("flash")))
	var saved v1alpha1.WebhookEndpoint
	must(t, c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "shop-orders"}, &saved))
	if flash := b.Text("flash"); !strings.HasPrefix(flash, "Saved") || saved.Spec.Filter != `has(payload.note) && payload.note.contains("pwned")` ||
		saved.Spec.Transform == nil || len(saved.Spec.Transform.Headers) != 1 {
		t.Errorf("saving says %q; the endpoint has %+v", flash, saved.Spec)
	}

	b.Do("rotating the signing secret",
		chromedp.Navigate(srv.URL+"/ns/shop/endpoints/shop-orders"),
		chromedp.WaitVisible(chromedp.ID("rotate")),
		chromedp.SetValue(chromedp.ID("overlap"), "72h"),
		chromedp.Click(chromedp.ID("rotate")),
		chromedp.WaitVisible(chromedp.ID("new-secret")),
		chromedp.ScrollIntoView(chromedp.ID("signing")),
		b.Shot("signing"),
	)
	must(t, c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "shop-orders"}, &saved))
	if flash, secret := b.Text("flash"), b.Text("new-secret"); !strings.HasPrefix(flash, "Rotated") || !strings.HasPrefix(secret, "whsec_") ||
		saved.Spec.Signing == nil || saved.Spec.Signing.PreviousSecretRef == nil || saved.Spec.Signing.PreviousSecretRef.Name != "shop-orders-signing" {
		t.Errorf("rotating says %q; the endpoint signs with %+v", flash, saved.Spec.Signing)
	}

	b.Do("replaying the dead letters ticked",
		chromedp.Navigate(srv.URL+"/ns/shop/deadletters"),
		chromedp.WaitVisible(chromedp.CSS(`#deadletters input[name="select"]`)),
		chromedp.Click(chromedp.CSS(`#deadletters tbody tr:nth-child(1) input[name="select"]`)),
		chromedp.Click(chromedp.CSS(`#deadletters tbody tr:nth-child(2) input[name="select"]`)),
		b.Shot("deadletters-selected"),
		chromedp.Click(chromedp.ID("replay-selected")),
		chromedp.WaitVisible(chromedp.ID("replay-state")),
	)
	testenv.Eventually(t, 30*time.Second, func() bool {
		b.Do("reloading the replay", chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("replay-state")))
		state = b.Text("replay-state")
		return strings.HasPrefix(state, "Complete")
	}, "the replay of the ticked dead letters did not complete")
	if refresh := consoletest.Run(b, "the refresh", chromedp.Evaluate[bool](`document.querySelector('meta[http-equiv="refresh"]') !== null`)); refresh {
		t.Error("a complete replay's page still reloads itself")
	}
	if !strings.Contains(state, "2 selected, 2 replayed, 0 skipped, 0 failed") {
		t.Errorf("the replay of the ticked dead letters says %q", state)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
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

// owner is a ServiceAccount of ns that owns its endpoints: the viewer's rights, plus patching
// endpoints, creating Secrets and reading payloads: its token.
func owner(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, ns string) string {
	t.Helper()
	return tokenFor(t, ctx, cp, ns, "owner", []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookendpoints", "webhookreplays"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookendpoints"}, Verbs: []string{"patch"}},
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookreplays"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
		{APIGroups: []string{datav1alpha1.GroupName}, Resources: []string{datav1alpha1.ResourceDeliveries, datav1alpha1.ResourceDeadLetters,
			datav1alpha1.ResourceDeliveries + "/payload"}, Verbs: []string{"get", "list"}},
	})
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
	stop, err := runDataAPI(ctx, cp, bus, dir)
	must(t, err)
	t.Cleanup(stop)
}

// runDataAPI runs the data API in this process and registers it with the aggregator; stop
// ends it.
func runDataAPI(ctx context.Context, cp *testenv.ControlPlane, bus *dataapi.Bus, dir string) (stop func(), err error) {
	admin, err := cp.WriteKubeconfig(dir)
	if err != nil {
		return nil, err
	}
	const service = "webhook-operator-apiserver"
	serving, err := testenv.WriteTLSFor(filepath.Join(dir, "serving"), testenv.APIServiceHost(service))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	o := dataapi.NewOptions()
	o.SecureServing.Listener, o.SecureServing.BindPort = ln, port
	o.SecureServing.ServerCert.CertKey.CertFile, o.SecureServing.ServerCert.CertKey.KeyFile = serving.ServerCert, serving.ServerKey
	o.Kubeconfig = admin
	s, err := dataapi.New(o, bus)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(sctx) }()
	stop = func() {
		cancel()
		<-done
	}
	ca, err := os.ReadFile(serving.CA)
	if err == nil {
		err = cp.RegisterAPIService(ctx, service, datav1alpha1.GroupName, datav1alpha1.SchemeGroupVersion.Version, port, ca)
	}
	if err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}
