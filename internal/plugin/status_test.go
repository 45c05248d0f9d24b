package plugin_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

func ready(ep *v1alpha1.WebhookEndpoint, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&ep.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionReady, Status: status, Reason: reason, Message: msg})
}

func TestStatusReportsHealthOfOneOrAllEndpoints(t *testing.T) {
	e := newEnv(t)
	now := time.Now().UTC().Truncate(time.Second)
	e.createEndpoint("healthy")
	e.createEndpoint("broken")
	e.createEndpoint("fresh")
	held := e.createEndpoint("held")
	held.Spec.Suspend = true
	if err := cp.Client.Update(context.Background(), held); err != nil {
		t.Fatal(err)
	}
	e.setStatus("healthy", func(ep *v1alpha1.WebhookEndpoint) {
		ready(ep, metav1.ConditionTrue, v1alpha1.ReasonReady, "delivering")
		ep.Status.Health = &v1alpha1.DeliveryHealth{Attempts: 200, Failures: 1, SuccessRate: "99.5%", Pending: 3, Delivered: 199,
			CircuitState: v1alpha1.CircuitClosed, LastSuccessTime: &metav1.Time{Time: now.Add(-time.Minute)}, UpdatedAt: &metav1.Time{Time: now}}
	})
	e.setStatus("broken", func(ep *v1alpha1.WebhookEndpoint) {
		ready(ep, metav1.ConditionTrue, v1alpha1.ReasonReady, "delivering")
		ep.Status.Health = &v1alpha1.DeliveryHealth{Attempts: 25, Failures: 24, SuccessRate: "4.0%", DeadLettered: 12, ConsecutiveFailures: 10,
			CircuitState: v1alpha1.CircuitOpen,
			LastFailure:  &v1alpha1.AttemptFailure{Time: metav1.Time{Time: now.Add(-2 * time.Minute)}, StatusCode: 503, Reason: records.FailStatusCode, Message: "Service Unavailable"}}
	})
	e.disable("broken", now.Add(-5*time.Minute))
	e.setStatus("held", func(ep *v1alpha1.WebhookEndpoint) {
		ready(ep, metav1.ConditionFalse, v1alpha1.ReasonSuspended, "suspended by spec.suspend")
	})
	e.setStatus("fresh", func(ep *v1alpha1.WebhookEndpoint) {
		ready(ep, metav1.ConditionFalse, v1alpha1.ReasonSigningSecretNotFound, `Secret "fresh-signing" not found`)
	})

	var all []plugin.EndpointStatus
	e.run("status", "-o", "json").must(t, plugin.ExitOK).decode(t, &all)
	byName := map[string]plugin.EndpointStatus{}
	for _, s := range all {
		byName[s.Name] = s
	}
	if len(all) != 4 {
		t.Fatalf("%d endpoints", len(all))
	}
	h := byName["healthy"]
	if h.State != plugin.StateActive || h.SuccessRate != "99.5%" || h.Pending != 3 || h.Circuit != "Closed" || h.LastSuccessTime == nil {
		t.Errorf("healthy: %+v", h)
	}
	b := byName["broken"]
	if b.State != plugin.StateDisabled || b.Reason != v1alpha1.ReasonFailureRate || b.DeadLettered != 12 || b.Circuit != "Open" ||
		b.LastFailure == nil || b.LastFailure.StatusCode != 503 || b.DisabledSince == nil {
		t.Errorf("broken: %+v", b)
	}
	if s := byName["held"]; s.State != plugin.StateSuspended {
		t.Errorf("held: %+v", s)
	}
	if s := byName["fresh"]; s.State != plugin.StateNotReady || s.Reason != v1alpha1.ReasonSigningSecretNotFound {
		t.Errorf("fresh: %+v", s)
	}

	r := e.run("status").must(t, plugin.ExitOK)
	for _, s := range []string{"NAME", "STATE", "SUCCESS", "PENDING", "CIRCUIT", "DEAD-LETTERED", "LAST SUCCESS", "LAST ERROR",
		"Disabled (FailureRate)", "99.5%", "Suspended", "NotReady (SigningSecretNotFound)", "503 status_code: Service Unavailable"} {
		if !strings.Contains(r.out, s) {
			t.Errorf("table lacks %q:\n%s", s, r.out)
		}
	}
	r = e.run("status", "broken").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "Disabled since") || !strings.Contains(r.out, "kubectl webhooks enable broken") {
		t.Errorf("one endpoint's table:\n%s", r.out)
	}
	var one plugin.EndpointStatus
	e.run("status", "healthy", "-o", "json").must(t, plugin.ExitOK).decode(t, &one)
	if one.Name != "healthy" {
		t.Errorf("one endpoint as JSON: %+v", one)
	}
	if v := yamlValid(t, e.run("status", "broken", "-o", "yaml").must(t, plugin.ExitOK)); v["state"] != "Disabled" {
		t.Errorf("YAML: %v", v)
	}
	r = e.run("status", "-A").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "NAMESPACE") || !strings.Contains(r.out, e.ns) {
		t.Errorf("-A:\n%s", r.out)
	}
	e.run("status", "ghost").must(t, plugin.ExitNotFound)
	e.run("status", "healthy", "-A").must(t, plugin.ExitUsage)
}

func TestEnableSetsTheAnnotation(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	e.createEndpoint("fine")
	since := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	e.disable("orders", since)

	var res plugin.EnableResult
	e.run("enable", "orders", "-o", "json").must(t, plugin.ExitOK).decode(t, &res)
	ep := &v1alpha1.WebhookEndpoint{}
	if err := cp.Client.Get(context.Background(), keyOf(e.ns, "orders"), ep); err != nil {
		t.Fatal(err)
	}
	v := ep.Annotations[v1alpha1.AnnotationEnable]
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil || !at.After(since) || time.Since(at) > time.Minute || v != res.EnabledAt || !res.WasDisabled {
		t.Errorf("annotation %q (%v), result %+v", v, err, res)
	}
	// The spec is untouched.
	if ep.Spec.URL != "https://receiver.example.com/orders" || len(ep.Spec.EventTypes) != 1 {
		t.Errorf("spec changed: %+v", ep.Spec)
	}
	r := e.run("enable", "orders").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "re-enabled") || !strings.Contains(r.out, since.Format(time.RFC3339)) {
		t.Errorf("table: %s", r)
	}
	r = e.run("enable", "fine").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "is not disabled") {
		t.Errorf("enabling an enabled endpoint: %s", r)
	}
	yamlValid(t, e.run("enable", "fine", "-o", "yaml").must(t, plugin.ExitOK))
	e.run("enable", "ghost").must(t, plugin.ExitNotFound)
	e.run("enable").must(t, plugin.ExitUsage)
}

func TestNATSConnectionFromEnvironmentOrTheOperatorSecret(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	opNS := e.ns + "-operator"
	e.createNamespace(opNS)

	// Reading needs no NATS connection at all: it goes through the data API.
	e.runRaw("dlq", "list", "--operator-namespace", opNS).must(t, plugin.ExitOK)
	e.runRaw("log", "orders", "--operator-namespace", opNS).must(t, plugin.ExitOK)
	// Writing with nothing configured: a clear error naming the three ways.
	r := e.runRaw("publish", "order.created", "--data", "{}", "--operator-namespace", opNS).must(t, plugin.ExitError)
	for _, s := range []string{"--nats-url", "NATS_URL", opNS + "/webhook-operator-nats"} {
		if !strings.Contains(r.errOut, s) {
			t.Errorf("error lacks %q: %s", s, r)
		}
	}
	// NATS_URL.
	e.getenv["NATS_URL"] = e.nats.URL()
	e.runRaw("publish", "order.created", "--data", "{}", "--operator-namespace", opNS).must(t, plugin.ExitOK)
	delete(e.getenv, "NATS_URL")

	// The operator's Secret.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: "webhook-operator-nats"},
		Data: map[string][]byte{"url": []byte(e.nats.URL())}}
	if err := cp.Client.Create(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	var res plugin.PublishResult
	e.runRaw("publish", "order.created", "--data", "{}", "--operator-namespace", opNS, "-o", "json").must(t, plugin.ExitOK).decode(t, &res)
	if res.Subject != "webhooks."+e.ns+".order.created" {
		t.Errorf("published via the Secret: %+v", res)
	}
	// A server that is not there fails fast with where the URL came from.
	secret.Data["url"] = []byte("nats://127.0.0.1:1")
	if err := cp.Client.Update(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	r = e.runRaw("publish", "order.created", "--data", "{}", "--operator-namespace", opNS).must(t, plugin.ExitError)
	if !strings.Contains(r.errOut, "from Secret "+opNS+"/webhook-operator-nats") || !strings.Contains(r.errOut, "port-forward") {
		t.Errorf("unreachable NATS: %s", r)
	}
	// User and password from the Secret.
	auth := startAuthNATS(t, "op", "s3cret", e.ns)
	secret.Data = map[string][]byte{"url": []byte(auth), "user": []byte("op"), "password": []byte("s3cret")}
	if err := cp.Client.Update(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	e.runRaw("publish", "order.created", "--data", "{}", "--operator-namespace", opNS).must(t, plugin.ExitOK)
	// Or from the credentials Secret it names (the chart's nats.existingSecret).
	creds := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: opNS, Name: "my-nats"},
		Data: map[string][]byte{"user": []byte("op"), "password": []byte("s3cret")}}
	if err := cp.Client.Create(context.Background(), creds); err != nil {
		t.Fatal(err)
	}
	secret.Data = map[string][]byte{"url": []byte(auth), "credentialsSecret": []byte("my-nats")}
	if err := cp.Client.Update(context.Background(), secret); err != nil {
		t.Fatal(err)
	}
	e.runRaw("publish", "order.created", "--data", "{}", "--operator-namespace", opNS).must(t, plugin.ExitOK)
	creds.Data["password"] = []byte("wrong")
	if err := cp.Client.Update(context.Background(), creds); err != nil {
		t.Fatal(err)
	}
	r = e.runRaw("publish", "order.created", "--data", "{}", "--operator-namespace", opNS).must(t, plugin.ExitError)
	if !strings.Contains(strings.ToLower(r.errOut), "authorization") {
		t.Errorf("wrong password: %s", r)
	}
}

// startAuthNATS starts a JetStream server that requires a user and password, with the
// operator's streams of namespace ns, and returns its URL.
func startAuthNATS(t *testing.T, user, password, ns string) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true, Username: user, Password: password})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(user, password))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := streams.DefaultConfig().For(ns).Ensure(context.Background(), js); err != nil {
		t.Fatal(err)
	}
	return s.ClientURL()
}

// status shows every condition that is not in its good state, with its reason and message,
// whoever wrote it: Ready not True; Disabled, CircuitOpen, Reconciling, Stalled,
// StorageLimitReached and a condition type the plugin does not know True or Unknown. Those in
// their good state are not shown.
func TestStatusShowsEveryConditionNotInItsGoodState(t *testing.T) {
	e := newEnv(t)
	set := func(name string, cs ...metav1.Condition) {
		e.createEndpoint(name)
		e.setStatus(name, func(ep *v1alpha1.WebhookEndpoint) {
			for _, c := range cs {
				c.ObservedGeneration = ep.Generation
				meta.SetStatusCondition(&ep.Status.Conditions, c)
			}
		})
	}
	cond := func(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg}
	}
	readyTrue := cond(v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonReady, "delivering")
	set("fine", readyTrue,
		cond(v1alpha1.ConditionDisabled, metav1.ConditionFalse, v1alpha1.ReasonEnabled, "enabled"),
		cond(v1alpha1.ConditionCircuitOpen, metav1.ConditionFalse, v1alpha1.ReasonCircuitClosed, "the circuit is closed"),
		cond(v1alpha1.ConditionStorageLimitReached, metav1.ConditionFalse, v1alpha1.ReasonWithinLimits, "within limits"),
		cond("Throttled", metav1.ConditionFalse, "WithinQuota", "a condition the plugin does not know, in its good state"))
	set("full", readyTrue,
		cond(v1alpha1.ConditionCircuitOpen, metav1.ConditionTrue, v1alpha1.ReasonCircuitHalfOpen, "one probe is let through"),
		cond(v1alpha1.ConditionStorageLimitReached, metav1.ConditionTrue, v1alpha1.ReasonDeadLetterStreamFull, "the dead-letter stream WEBHOOKS_DLQ_x is 97% full: new dead letters are refused"),
		cond("Throttled", metav1.ConditionTrue, "QuotaExceeded", "a condition the plugin does not know yet"))
	set("waiting",
		cond(v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonDispatcherUnavailable, "0 of 1 dispatcher replicas available"),
		cond(v1alpha1.ConditionReconciling, metav1.ConditionTrue, v1alpha1.ReasonDispatcherUnavailable, "waiting for the dispatcher"))
	set("stuck",
		cond(v1alpha1.ConditionReady, metav1.ConditionUnknown, v1alpha1.ReasonNATSUnavailable, "NATS does not answer"),
		cond(v1alpha1.ConditionStalled, metav1.ConditionTrue, v1alpha1.ReasonInvalidURL, "spec.url: the host resolves to a private address"),
		cond(v1alpha1.ConditionDisabled, metav1.ConditionTrue, v1alpha1.ReasonConsecutiveFailures, "10 consecutive failed attempts"))

	type shown struct{ typ, status, reason, msg string }
	want := map[string][]shown{
		"fine": nil,
		"full": {{"CircuitOpen", "True", "HalfOpen", "one probe is let through"},
			{"StorageLimitReached", "True", "DeadLetterStreamFull", "the dead-letter stream WEBHOOKS_DLQ_x is 97% full: new dead letters are refused"},
			{"Throttled", "True", "QuotaExceeded", "a condition the plugin does not know yet"}},
		"waiting": {{"Ready", "False", "DispatcherUnavailable", "0 of 1 dispatcher replicas available"},
			{"Reconciling", "True", "DispatcherUnavailable", "waiting for the dispatcher"}},
		"stuck": {{"Ready", "Unknown", "NATSUnavailable", "NATS does not answer"},
			{"Stalled", "True", "InvalidURL", "spec.url: the host resolves to a private address"},
			{"Disabled", "True", "ConsecutiveFailures", "10 consecutive failed attempts"}},
	}
	var all []plugin.EndpointStatus
	e.run("status", "-o", "json").must(t, plugin.ExitOK).decode(t, &all)
	if len(all) != len(want) {
		t.Fatalf("%d endpoints", len(all))
	}
	for _, s := range all {
		var got []shown
		for _, p := range s.Problems {
			got = append(got, shown{p.Type, string(p.Status), p.Reason, p.Message})
			if p.Since == nil {
				t.Errorf("%s: %s has no time", s.Name, p.Type)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want[s.Name]) {
			t.Errorf("%s: problems\n %v\nwant\n %v", s.Name, got, want[s.Name])
		}
	}

	// The list: a table of every problem below the endpoints', none of fine's.
	r := e.run("status").must(t, plugin.ExitOK)
	_, below, ok := strings.Cut(r.out, "Conditions not in their good state:")
	if !ok {
		t.Fatalf("no problems listed:\n%s", r.out)
	}
	for name, ws := range want {
		for _, w := range ws {
			if !regexp.MustCompile(`(?m)^` + name + ` +` + w.typ + ` +` + w.status + ` +` + w.reason + ` +.* ago +` + regexp.QuoteMeta(w.msg) + `$`).MatchString(below) {
				t.Errorf("the list lacks %s %v:\n%s", name, w, below)
			}
		}
	}
	if strings.Contains(below, "fine") || strings.Contains(below, "WithinLimits") || strings.Contains(below, "WithinQuota") {
		t.Errorf("conditions in their good state listed:\n%s", below)
	}
	if r := e.run("status", "-A").must(t, plugin.ExitOK); !strings.Contains(r.out, e.ns+"/full ") {
		t.Errorf("-A names endpoints with their namespace:\n%s", r.out)
	}
	// One endpoint: its problems with their messages.
	r = e.run("status", "full").must(t, plugin.ExitOK)
	for _, w := range want["full"] {
		if !regexp.MustCompile(`(?m)^  ` + w.typ + `=` + w.status + ` ` + w.reason + ` \(since .* ago\): ` + regexp.QuoteMeta(w.msg) + `$`).MatchString(r.out) {
			t.Errorf("status full lacks %v:\n%s", w, r.out)
		}
	}
	if r := e.run("status", "fine").must(t, plugin.ExitOK); strings.Contains(r.out, "Conditions not in their good state") {
		t.Errorf("an endpoint in good state:\n%s", r.out)
	}
}
