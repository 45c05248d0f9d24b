package plugin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/replay"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
)

// replays lists the WebhookReplays of the test's namespace.
func (e *env) replays() []v1alpha1.WebhookReplay {
	e.t.Helper()
	list := &v1alpha1.WebhookReplayList{}
	if err := cp.Client.List(context.Background(), list, client.InNamespace(e.ns)); err != nil {
		e.t.Fatal(err)
	}
	return list.Items
}

// runReplayController runs the controller's WebhookReplay reconciler, for this namespace only,
// until the test ends.
func (e *env) runReplayController() {
	e.t.Helper()
	ctrllog.SetLogger(logr.Discard())
	cfg := opconfig.Default()
	cfg.NATS.URL = e.nats.URL()
	cfg.Streams = e.cfg
	opts := &controllers.Options{Config: cfg, MaxConcurrentReconciles: 2}
	mgr, err := ctrl.NewManager(cp.Config, ctrl.Options{
		Scheme:                 scheme.New(),
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{e.ns: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptrTo(true)},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	js, err := controllers.ConnectJetStream(&cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := controllers.SetupReplays(ctx, mgr, opts, js); err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("manager: %v", err)
		}
		js.Close()
	})
}

func ptrTo[T any](v T) *T { return &v }

// `kubectl webhooks replay` creates a WebhookReplay whose name is the idempotency key and whose
// spec says what the flags say; the same command again creates nothing new, and the same key
// for another selection is refused.
func TestReplayCreatesAWebhookReplay(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	id := records.DeliveryID("evt_1", e.ns, "orders")

	var rep plugin.ReplayReport
	e.run("replay", "orders", "--id", id, "--idempotency-key", "fix-1", "-o", "json").must(t, plugin.ExitOK).decode(t, &rep)
	if rep.Replay != "fix-1" || !rep.Created || rep.Endpoint != "orders" || len(rep.Deliveries) != 1 ||
		rep.Deliveries[0].Original != id || rep.Deliveries[0].DeliveryID != replay.ReplayedID(id, "fix-1") {
		t.Errorf("report %+v", rep)
	}
	wrs := e.replays()
	if len(wrs) != 1 || wrs[0].Name != "fix-1" || wrs[0].Spec.EndpointRef.Name != "orders" || wrs[0].Spec.Source != v1alpha1.ReplayDeadLetters ||
		len(wrs[0].Spec.DeliveryIDs) != 1 || wrs[0].Spec.DeliveryIDs[0] != id || wrs[0].Spec.Since != nil || wrs[0].Spec.RatePerSecond != nil {
		t.Fatalf("replays %+v", wrs)
	}

	r := e.run("replay", "orders", "--id", id, "--idempotency-key", "fix-1").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "exists already (the same idempotency key): nothing new") || len(e.replays()) != 1 {
		t.Errorf("the same key again: %s (%d replays)", r, len(e.replays()))
	}
	r = e.run("replay", "orders", "--all", "--idempotency-key", "fix-1").must(t, plugin.ExitRefused)
	if !strings.Contains(r.errOut, "exists with another selection") {
		t.Errorf("the same key for another selection: %s", r)
	}

}

// The flags of replay and recover map onto the spec; a relative --since is the time it
// stands for; without a key each run is a new WebhookReplay with a generated name.
func TestReplayAndRecoverFlagsMapOntoTheSpec(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	before := time.Now().Add(-2 * time.Hour).Add(-time.Second)
	var rep plugin.ReplayReport
	e.run("replay", "orders", "--since", "2h", "--reason", "exhausted", "--reason", "endpoint_disabled", "--rate", "20", "-o", "json").
		must(t, plugin.ExitOK).decode(t, &rep)
	e.run("replay", "orders", "--all", "-o", "json").must(t, plugin.ExitOK)
	e.run("recover", "orders", "--since", "2026-07-19T09:00:00Z", "--until", "2026-07-19T12:00:00Z", "--idempotency-key", "outage-0719").
		must(t, plugin.ExitOK)

	byName := map[string]v1alpha1.WebhookReplay{}
	generated := 0
	for _, wr := range e.replays() {
		byName[wr.Name] = wr
		if strings.HasPrefix(wr.Name, "orders-replay-") {
			generated++
		}
	}
	if generated != 2 || len(byName) != 3 {
		t.Fatalf("replays %v: want two with generated names and the recover", byName)
	}
	since := byName[rep.Replay].Spec
	if since.Since == nil || since.Since.Time.Before(before) || since.Since.Time.After(time.Now().Add(-2*time.Hour)) ||
		since.Until != nil || len(since.Reasons) != 2 || since.RatePerSecond == nil || *since.RatePerSecond != 20 {
		t.Errorf("--since 2h --reason --rate: %+v", since)
	}
	rec := byName["outage-0719"].Spec
	if rec.Source != v1alpha1.ReplayDeliveryLog || rec.Since == nil || !rec.Since.Equal(&metav1.Time{Time: time.Date(2026, 7, 19, 9, 0, 0, 0, time.UTC)}) ||
		rec.Until == nil || !rec.Until.Equal(&metav1.Time{Time: time.Date(2026, 7, 19, 12, 0, 0, 0, time.UTC)}) {
		t.Errorf("recover: %+v", rec)
	}
	// The same relative --since with the same key is the same replay.
	e.run("replay", "orders", "--since", "1h", "--idempotency-key", "k").must(t, plugin.ExitOK)
	r := e.run("replay", "orders", "--since", "1h", "--idempotency-key", "k").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "exists already") {
		t.Errorf("the same relative --since and key again: %s", r)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "orders"}, "exactly one of --id, --all or --since"},
		{[]string{"replay", "orders", "--id", "whdl_x.y"}, "--id"},
		{[]string{"replay", "orders", "--all", "--since", "1h"}, "exactly one of"},
		{[]string{"replay", "orders", "--all", "--until", "1h"}, "--until goes with --since"},
		{[]string{"replay", "orders", "--id", records.DeliveryID("e", e.ns, "orders"), "--reason", "exhausted"}, "use it with --all or --since"},
		{[]string{"replay", "orders", "--since", "yesterday"}, "RFC 3339"},
		{[]string{"replay", "orders", "--since", "1h", "--until", "2h"}, "--until must be later than --since"},
		{[]string{"replay", "orders", "--all", "--rate", "-1"}, "--rate must be 1 to 10000"},
		{[]string{"replay", "orders", "--all", "--idempotency-key", "Fix 1"}, "must be a Kubernetes name"},
		{[]string{"replay", "orders", "--all", "--reason", "bored"}, "spec.reasons[0]"},
		{[]string{"recover", "orders"}, "--since is required"},
	} {
		r := e.run(c.args...).must(t, plugin.ExitUsage)
		if !strings.Contains(r.errOut, c.want) {
			t.Errorf("%v: %s, want %q", c.args, r.errOut, c.want)
		}
	}
	e.run("replay", "ghost", "--all").must(t, plugin.ExitNotFound)
}

// A disabled endpoint refuses a replay up front, and nothing is created; once re-enabled (the
// dispatcher confirmed it) it is accepted.
func TestReplayIsRefusedForADisabledEndpoint(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	since := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	e.disable("orders", since)
	for _, args := range [][]string{{"replay", "orders", "--all"}, {"recover", "orders", "--since", "1h"}} {
		r := e.run(args...).must(t, plugin.ExitRefused)
		for _, want := range []string{"endpoint " + e.ns + "/orders is disabled since " + since.Format(time.RFC3339), "FailureRate",
			"kubectl webhooks enable orders", "no replay was created"} {
			if !strings.Contains(r.errOut, want) {
				t.Errorf("%v: %q lacks %q", args, r.errOut, want)
			}
		}
	}
	if n := len(e.replays()); n != 0 {
		t.Errorf("%d WebhookReplays created for a disabled endpoint", n)
	}
	e.run("enable", "orders").must(t, plugin.ExitOK)
	r := e.run("replay", "orders", "--all").must(t, plugin.ExitRefused)
	if !strings.Contains(r.errOut, "re-enabling was requested") {
		t.Errorf("before the dispatcher confirms: %s", r)
	}
	e.setStatus("orders", func(ep *v1alpha1.WebhookEndpoint) { ep.Status.Conditions = nil; ep.Status.Health = nil })
	e.run("replay", "orders", "--all").must(t, plugin.ExitOK)
}

// --wait follows the replay the controller runs until it is complete and reports its counts;
// a delivery it could not replay makes it exit 1 with why.
func TestReplayWaitReportsTheCompletedReplay(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	e.runReplayController()
	at := time.Now().Add(-time.Hour).UTC()
	var ids []string
	for i := range 3 {
		m := e.delivery("orders", i, at)
		e.writeDeadLetter(m, 3, records.ReasonExhausted, `{}`, at)
		ids = append(ids, m.DeliveryID)
	}
	var rep plugin.ReplayReport
	r := e.run("replay", "orders", "--all", "--idempotency-key", "after-fix", "--wait", "-o", "json").must(t, plugin.ExitOK)
	r.decode(t, &rep)
	if !rep.Complete || rep.Reason != v1alpha1.ReasonReplayed || rep.Selected != 3 || rep.Replayed != 3 || rep.Skipped != 0 {
		t.Errorf("report %+v", rep)
	}
	if !strings.Contains(r.errOut, "after-fix: complete: 3 selected: 3 replayed") {
		t.Errorf("progress on stderr: %q", r.errOut)
	}
	if n := len(e.subjectMsgs(e.cfg.For(e.ns).DeliveriesStream(), e.cfg.For(e.ns).WaitingFilter("orders"))); n != 3 {
		t.Errorf("%d deliveries, want 3", n)
	}
	// The same key again: the existing replay, complete, nothing new.
	e.run("replay", "orders", "--all", "--idempotency-key", "after-fix", "--wait", "-o", "json").must(t, plugin.ExitOK).decode(t, &rep)
	if rep.Created || rep.Replayed != 3 {
		t.Errorf("again: %+v", rep)
	}
	// A dead letter that is not there: complete with a failure, exit 1.
	ghost := records.DeliveryID("ghost", e.ns, "orders")
	r = e.run("replay", "orders", "--id", ghost, "--id", ids[0], "--wait")
	if r.code != plugin.ExitError || !strings.Contains(r.out, "1 failed") || !strings.Contains(r.out, "failed "+ghost) ||
		!strings.Contains(r.errOut, "1 of the 2 selected deliveries could not be replayed") {
		t.Errorf("a replay with a failure: %s", r)
	}
}
