package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/client-go/kubernetes"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Tenants purge their own dead letters with the shipped roles, in callout mode: a viewer
// cannot (a dry run, which only reads, it may), an editor can, by endpoint, reason and age;
// a dry run deletes nothing; each purge is an operational event that a subscribed endpoint
// receives, with the right counts; another namespace's dead letters stay as they were.
func TestTenantsPurgeTheirOwnDeadLetters(t *testing.T) {
	ctx := context.Background()
	const nsA, nsB = "e2e-purge-a", "e2e-purge-b"
	a, b := newUser(t, nsA), newUser(t, nsB)
	alerts := a.receiver("alerts")
	failing := map[string]*testenv.Receiver{}
	for _, u := range []*user{a, b} {
		rcv := u.receiver("billing")
		rcv.SetResponder(testenv.Failing)
		failing[u.ns] = rcv
		manifest := fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: once}
spec:
  schedule: [0s]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: billing}
spec:
  url: %s
  eventTypes: [invoice.>, entry.>]
  retryPolicyRef: {name: once}
`, rcv.URL())
		if u == a {
			manifest += fmt.Sprintf(`---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: ledger}
spec:
  url: %s
  eventTypes: [entry.>]
  retryPolicyRef: {name: once}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: alerts}
spec:
  url: %s
  eventTypes: [webhook_operator.dlq.*]
`, rcv.URL(), alerts.URL())
		}
		u.apply(manifest)
	}
	a.waitReady("billing", "ledger", "alerts")
	b.waitReady("billing")

	// Dead letters: in a, billing's 3 invoices and 1 test delivery and ledger's 2 entries,
	// then, after the cutoff, 2 more of billing's; in b, billing's 2.
	deadLetters := func(u *user) map[string]int {
		var p page[struct {
			Endpoint string `json:"endpoint"`
			Reason   string `json:"reason"`
		}]
		u.json(&p, "kubectl", "webhooks", "dlq", "list", "--limit", "100")
		n := map[string]int{}
		for _, d := range p.Data {
			n[d.Endpoint+"/"+d.Reason]++
		}
		return n
	}
	waitFor := func(u *user, want map[string]int) {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, func() error {
			if got := deadLetters(u); fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("dead letters of %s: %v, want %v", u.ns, got, want)
			}
			return nil
		}, "")
	}
	for i := range 3 {
		a.publish("invoice.issued", fmt.Sprintf("inv_a_%d", i), `{}`)
	}
	a.publish("entry.posted", "led_a_1", `{}`) // billing and ledger each dead-letter it
	if r := a.run(nil, "kubectl", "webhooks", "test", "billing", "--wait"); r.code != 1 {
		t.Fatalf("a test delivery to a failing receiver: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for i := range 2 {
		b.publish("invoice.issued", fmt.Sprintf("inv_b_%d", i), `{}`)
	}
	waitFor(a, map[string]int{"billing/exhausted": 4, "billing/test_failed": 1, "ledger/exhausted": 1})
	waitFor(b, map[string]int{"billing/exhausted": 2})
	cutoff := time.Now().Truncate(time.Second).Add(time.Second)
	testenv.Eventually(t, 5*time.Second, func() bool { return time.Now().After(cutoff) }, "the clock passes %s", cutoff)
	for i := range 2 {
		a.publish("invoice.issued", fmt.Sprintf("inv_a_late_%d", i), `{}`)
	}
	waitFor(a, map[string]int{"billing/exhausted": 6, "billing/test_failed": 1, "ledger/exhausted": 1})

	admin, adminJS, err := stack.ConnectAdmin(nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	busA, busB := natsauth.BusOf(streams.DefaultConfig())(nsA), natsauth.BusOf(streams.DefaultConfig())(nsB)
	stateOfB := func() string {
		s, err := adminJS.Stream(ctx, busB.DeadLetters.Name)
		if err != nil {
			t.Fatal(err)
		}
		st := s.CachedInfo().State
		return fmt.Sprintf("%d messages, %d..%d, %d deleted", st.Msgs, st.FirstSeq, st.LastSeq, st.NumDeleted)
	}
	bBefore := stateOfB()

	cs := kubernetes.NewForConfigOrDie(stack.ControlPlane.Config)
	grant(t, cs, nsA, "viewer", "webhook-operator-viewer")
	grant(t, cs, nsA, "editor", "webhook-operator-editor")
	viewer, editor := tokenKubeconfig(t, cs, nsA, "viewer"), tokenKubeconfig(t, cs, nsA, "editor")
	purge := func(kubeconfig, ns string, args ...string) (result, purgeResult) {
		t.Helper()
		r := pluginAs(t, kubeconfig, ns, append([]string{"dlq", "purge"}, append(args, "-o", "json")...)...)
		var res purgeResult
		if r.code == 0 {
			if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
				t.Fatalf("dlq purge %v: %v\n%s", args, err, r.stdout)
			}
		}
		return r, res
	}

	// A viewer may not purge, and is told what it lacks; its dry run reads.
	if r, _ := purge(viewer, nsA, "billing", "--all"); r.code == 0 || !strings.Contains(r.stderr, "deletecollection on webhookdeadletters (data.webhook-operator.io) in namespace "+nsA) {
		t.Errorf("a viewer's purge: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r, res := purge(viewer, nsA, "billing", "--all", "--dry-run"); r.code != 0 || res.Selected != 7 || res.Purged != 0 {
		t.Errorf("a viewer's dry run: exit %d %+v\n%s", r.code, res, r.stderr)
	}
	// The editor's dry run lists what would go and deletes nothing.
	r, res := purge(editor, nsA, "billing", "--older-than", cutoff.Format(time.RFC3339), "--dry-run")
	if r.code != 0 || res.Selected != 5 || len(res.DeadLetters) != 5 || res.ByReason["exhausted"] != 4 || res.ByReason["test_failed"] != 1 || res.Event != "" {
		t.Errorf("the editor's dry run: exit %d %+v\n%s", r.code, res, r.stderr)
	}
	waitFor(a, map[string]int{"billing/exhausted": 6, "billing/test_failed": 1, "ledger/exhausted": 1})

	// By endpoint and reason, then by age across the namespace.
	if r, res := purge(editor, nsA, "billing", "--reason", "test_failed"); r.code != 0 || res.Purged != 1 || res.Event == "" {
		t.Fatalf("purge billing --reason test_failed: exit %d %+v\n%s", r.code, res, r.stderr)
	}
	if r, res := purge(editor, nsA, "--older-than", cutoff.Format(time.RFC3339)); r.code != 0 || res.Purged != 5 ||
		res.ByEndpoint["billing"] != 4 || res.ByEndpoint["ledger"] != 1 {
		t.Fatalf("purge --older-than: exit %d %+v\n%s", r.code, res, r.stderr)
	}
	waitFor(a, map[string]int{"billing/exhausted": 2})

	// Nothing in b: refused there. On the bus a tenant purges nothing: a's editor asking for
	// the purger's grant is refused (only the data API's server holds it), and its ordinary
	// connection deletes nothing, of a or of b.
	if r, _ := purge(editor, nsB, "billing", "--all"); r.code == 0 {
		t.Errorf("a's editor purged in %s:\n%s", nsB, r.stdout)
	}
	if p, err := connectAs(tokenOptions(t, cs, nsA, "editor", natsauth.DefaultAudience), natsauth.PurgeUser(nsA)); err == nil {
		p.close()
		t.Fatal("a's editor connected to the bus as a's purger")
	}
	c, err := connectAs(tokenOptions(t, cs, nsA, "editor", natsauth.DefaultAudience), nsA)
	if err != nil {
		t.Fatalf("a's editor connecting: %v", err)
	}
	defer c.close()
	refused := []string{"$JS.API.STREAM.MSG.DELETE." + busA.DeadLetters.Name, "$JS.API.STREAM.MSG.DELETE." + busB.DeadLetters.Name,
		"$JS.API.STREAM.PURGE." + busA.DeadLetters.Name, "$JS.API.STREAM.PURGE." + busB.DeadLetters.Name, "$JS.API.DIRECT.GET." + busA.DeadLetters.Name,
		"webhooks." + nsA + ".webhook_operator.dlq.purged", "webhooks." + nsB + ".webhook_operator.dlq.purged", "webhooks." + nsA + ".webhook_operator.endpoint.disabled"}
	for _, s := range refused {
		if err := c.nc.PublishRequest(s, c.inbox+".x", []byte(`{"seq":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, s := range refused {
			if !c.refused("Publish", s) {
				return fmt.Errorf("%s not refused", s)
			}
		}
		return nil
	}, "")
	if after := stateOfB(); after != bBefore {
		t.Errorf("b's dead-letter stream was %s, is %s", bBefore, after)
	}
	waitFor(b, map[string]int{"billing/exhausted": 2})

	// Each purge is one operational event, which the subscribed endpoint receives.
	testenv.Eventually(t, 60*time.Second, func() error {
		var counts []string
		for _, req := range alerts.Requests() {
			var ev records.OpsEvent
			if req.Status/100 != 2 || json.Unmarshal(req.Body, &ev) != nil {
				continue
			}
			if ev.Type != records.OpsDeadLettersPurged || ev.Namespace != nsA {
				return fmt.Errorf("alerts received %s of %s", ev.Type, ev.Namespace)
			}
			counts = append(counts, fmt.Sprintf("%s:%v", ev.Endpoint, ev.Data["count"]))
		}
		if strings.Join(counts, " ") != "billing:1 :5" {
			return fmt.Errorf("alerts received purges %v, want billing:1 then the namespace's 5", counts)
		}
		return nil
	}, "")
	if n := len(failing[nsB].Requests()); n != 2 {
		t.Errorf("b's receiver got %d requests, want its 2 events once", n)
	}
}

// purgeResult is the JSON of dlq purge.
type purgeResult struct {
	Selected    int64            `json:"selected"`
	Purged      int64            `json:"purged"`
	ByReason    map[string]int64 `json:"byReason"`
	ByEndpoint  map[string]int64 `json:"byEndpoint"`
	DeadLetters []deadLetter     `json:"deadLetters"`
	Event       string           `json:"event"`
}
