package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// plugin is how the host's user runs `kubectl webhooks` against this cluster: NATS is inside
// it, so through `kubectl port-forward` (as the plugin's own hint says), with a token of an
// identity Kubernetes RBAC allows in the namespace (the kubeconfig's user is a client
// certificate, which the auth callout cannot take).
type plugin struct {
	url, tokenFile string
	tls            *testenv.TLSFiles
	forward        *exec.Cmd
}

// newPlugin port-forwards to NATS and makes the namespace's editor identity (a ServiceAccount
// bound to the chart's webhook-operator-editor) and its token.
func newPlugin(t *testing.T, ns string, tls *testenv.TLSFiles) *plugin {
	t.Helper()
	if command("", "kubectl", "-n", ns, "get", "serviceaccount", "editor").err != nil {
		kubectl(t, "-n", ns, "create", "serviceaccount", "editor")
		kubectl(t, "-n", ns, "create", "rolebinding", "editor", "--clusterrole=webhook-operator-editor", "--serviceaccount="+ns+":editor")
	}
	token := kubectl(t, "-n", ns, "create", "token", "editor", "--audience", "nats.webhook-operator.io", "--duration", "2h")
	p := &plugin{tokenFile: filepath.Join(world.dir, "editor-"+ns+".token"), tls: tls}
	if err := os.WriteFile(p.tokenFile, []byte(strings.TrimSpace(token)), 0o600); err != nil {
		t.Fatal(err)
	}
	p.connect(t)
	t.Cleanup(p.close)
	return p
}

// connect (re)starts the port-forward: kubectl port-forward to a Service holds one of its
// pods, and ends when that pod does (as when a fault deletes it).
func (p *plugin) connect(t *testing.T) {
	t.Helper()
	p.close()
	var port int
	p.forward, port = portForward(t, natsNS, "svc/nats", 4222)
	p.url = fmt.Sprintf("tls://127.0.0.1:%d", port)
}

func (p *plugin) close() {
	if p.forward != nil {
		_ = p.forward.Process.Kill()
		_ = p.forward.Wait()
		p.forward = nil
	}
}

// run runs kubectl webhooks in namespace ns, port-forwarding again when the forward broke.
func (p *plugin) run(t *testing.T, ns string, args ...string) string {
	t.Helper()
	var r result
	for try := 0; try < 5; try++ {
		r = command("", "kubectl", append([]string{"webhooks", "-n", ns, "--nats-url", p.url, "--nats-token-file", p.tokenFile,
			"--nats-ca-file", p.tls.CA, "--nats-cert-file", p.tls.ClientCert, "--nats-key-file", p.tls.ClientKey}, args...)...)
		if r.err == nil || !strings.Contains(r.stderr, "connecting to NATS") {
			break
		}
		logf(t, "kubectl webhooks: %s; port-forwarding again", strings.TrimSpace(r.stderr))
		time.Sleep(2 * time.Second)
		p.connect(t)
	}
	if r.err != nil {
		t.Fatalf("kubectl webhooks %s: %v\n%s%s", strings.Join(args, " "), r.err, r.stdout, r.stderr)
	}
	return r.stdout
}

// portForward runs `kubectl port-forward` to a random local port; the caller stops it.
func portForward(t *testing.T, ns, target string, port int) (*exec.Cmd, int) {
	t.Helper()
	cmd := exec.Command(lookPath("kubectl"), "-n", ns, "port-forward", "--address=127.0.0.1", target, fmt.Sprintf(":%d", port))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+world.kubeconfig)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var local int
	eventually(t, time.Minute, "kubectl port-forward "+target, func() error {
		for _, l := range strings.Split(out.String(), "\n") {
			if _, err := fmt.Sscanf(l, "Forwarding from 127.0.0.1:%d ->", &local); err == nil {
				return nil
			}
		}
		return fmt.Errorf("no forwarding yet: %s", out.String())
	})
	return cmd, local
}

// deadLetter is what `kubectl webhooks dlq list -o json` says of one.
type deadLetter struct {
	DeliveryID string `json:"deliveryId"`
	EventID    string `json:"eventId"`
	Endpoint   string `json:"endpoint"`
	Reason     string `json:"reason"`
}

// deadLetters lists an endpoint's dead letters with the plugin.
func (p *plugin) deadLetters(t *testing.T, ns, endpoint string) []deadLetter {
	t.Helper()
	var all []deadLetter
	after := ""
	for range 1000 {
		args := []string{"dlq", "list", endpoint, "-o", "json", "--limit", "100"}
		if after != "" {
			args = append(args, "--after", after)
		}
		out := p.run(t, ns, args...)
		var page struct {
			Data       []deadLetter `json:"data"`
			HasMore    bool         `json:"hasMore"`
			NextCursor string       `json:"nextCursor"`
		}
		if err := json.Unmarshal([]byte(out), &page); err != nil {
			t.Fatalf("dlq list -o json: %v\n%s", err, out)
		}
		all = append(all, page.Data...)
		if !page.HasMore || len(page.Data) == 0 {
			break
		}
		after = page.NextCursor
	}
	return all
}

// endpointStatus is `kubectl webhooks status -o json` of one endpoint.
type endpointStatus struct {
	State        string `json:"state"`
	Delivered    int64  `json:"delivered"`
	DeadLettered int64  `json:"deadLettered"`
	Pending      int64  `json:"pending"`
}

func (p *plugin) status(t *testing.T, ns, endpoint string) endpointStatus {
	t.Helper()
	var s endpointStatus
	out := p.run(t, ns, "status", endpoint, "-o", "json")
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		var list []endpointStatus
		if json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 {
			t.Fatalf("status -o json: %v\n%s", err, out)
		}
		s = list[0]
	}
	return s
}

// endpoint applies a WebhookEndpoint delivering to url, signed, trusting the receivers' CA.
func endpoint(t *testing.T, ns, name, url, eventTypes, extra string) {
	t.Helper()
	apply(t, fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: %s, namespace: %s}
spec:
  url: %s
  eventTypes: [%s]
  signing: {secretRef: {name: signing, key: secret}}
  tls: {caBundleSecretRef: {name: receiver-ca, key: ca.crt}}
%s`, name, ns, url, eventTypes, extra))
	kubectl(t, "-n", ns, "wait", "--for=condition=Ready", "webhookendpoint/"+name, "--timeout=3m")
}

// walkthrough is the user's path: endpoints whose URLs are Service DNS names, a producer pod
// with its own token, kubectl describe, a dead letter replayed through a WebhookReplay,
// auto-disable and enable.
func (s *install) walkthrough(t *testing.T) {
	s.tenant(t, shop)
	url := receiver(t, shop, "orders")
	endpoint(t, shop, "orders", url, `"order.*"`, "")
	logf(t, "endpoint orders Ready; its dispatcher: %s", strings.TrimSpace(kubectl(t, "-n", shop, "get", "deployment", "-l", "app.kubernetes.io/managed-by=webhook-operator", "-o", "name")))
	kubectl(t, "-n", shop, "rollout", "status", "deployment/webhook-dispatcher", "--timeout=3m")

	p := produce(t, shop, "producer-walk", "order.created", runID+"walk", 50, 25)
	if p.Published != 50 {
		t.Fatalf("the producer published %+v", p)
	}
	st := waitReceived(t, shop, "orders", ids(runID+"walk", 50), 3*time.Minute)
	if st.Stats.BadSignatures != 0 || st.Stats.Accepted != st.Stats.Unique {
		t.Errorf("receiver: %+v (want every signature verified, no duplicate)", st.Stats)
	}
	eventually(t, 2*time.Minute, "kubectl describe to show what the receiver got as delivered", func() error {
		out := command("", "kubectl", "-n", shop, "describe", "webhookendpoint", "orders").stdout
		if !regexpDelivered(out, st.Stats.Unique) {
			return fmt.Errorf("kubectl describe:\n%s", out)
		}
		return nil
	})
	logf(t, "50 events from the producer pod delivered, signatures verified, kubectl describe shows Delivered: %d", st.Stats.Unique)

	// The same deliveries as Kubernetes resources, through the aggregation layer (the data API).
	var listed []string
	eventually(t, time.Minute, "kubectl get webhookdeliveries to list the 50 deliveries", func() error {
		r := command("", "kubectl", "-n", shop, "get", "webhookdeliveries", "--field-selector", "spec.endpoint=orders,status.state=Succeeded", "-o", "name")
		listed = strings.Fields(r.stdout)
		if r.err != nil || len(listed) < st.Stats.Unique {
			return fmt.Errorf("%d listed: %v %s", len(listed), r.err, r.stderr)
		}
		return nil
	})
	table := kubectl(t, "-n", shop, "get", "webhookdeliveries", "--field-selector", "spec.endpoint=orders", "--chunk-size=10")
	if !strings.Contains(table, "Succeeded") || !strings.Contains(table, "ENDPOINT") {
		t.Errorf("kubectl get webhookdeliveries:\n%s", table)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	logf(t, "kubectl get webhookdeliveries --field-selector spec.endpoint=orders,status.state=Succeeded lists %d deliveries; the table's first rows:\n%s",
		len(listed), strings.Join(lines[:min(4, len(lines))], "\n"))

	// A dead letter and its replay.
	pl := newPlugin(t, shop, s.tls)
	flaky := "flaky-" + runID // of this run only (a reused cluster keeps the last run's failure streak)
	url = receiver(t, shop, flaky)
	apply(t, `
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: two-quick, namespace: shop}
spec:
  maxAttempts: 2
  backoff: {strategy: Exponential, initialInterval: 1s, factor: 2, maxInterval: 2s, jitter: Full}
  autoDisable: {consecutiveFailures: 6}
`)
	endpoint(t, shop, flaky, url, `"invoice.*"`, "  retryPolicyRef: {name: two-quick}\n")
	respond(t, shop, flaky, 500)
	produce(t, shop, "producer-dl", "invoice.created", runID+"dl", 1, 5)
	var dls []deadLetter
	eventually(t, 2*time.Minute, "a dead letter of flaky", func() error {
		dls = pl.deadLetters(t, shop, flaky)
		for _, dl := range dls {
			if dl.EventID == runID+"dl-00000" && dl.Reason == "exhausted" {
				return nil
			}
		}
		return fmt.Errorf("dead letters %+v", dls)
	})
	dlTable := kubectl(t, "-n", shop, "get", "webhookdeadletters", "--field-selector", "spec.endpoint="+flaky+",status.reason=exhausted")
	if !strings.Contains(dlTable, "exhausted") {
		t.Errorf("kubectl get webhookdeadletters:\n%s", dlTable)
	}
	logf(t, "kubectl get webhookdeadletters --field-selector spec.endpoint=%s,status.reason=exhausted:\n%s", flaky, strings.TrimSpace(dlTable))
	respond(t, shop, flaky, 200)
	apply(t, `
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookReplay
metadata: {name: `+flaky+`, namespace: shop}
spec:
  endpointRef: {name: `+flaky+`}
  reasons: [exhausted]
`)
	waitReceived(t, shop, flaky, []string{runID + "dl-00000"}, 2*time.Minute)
	kubectl(t, "-n", shop, "wait", "--for=condition=Complete", "webhookreplay/"+flaky, "--timeout=2m")
	logf(t, "dead letter %sdl-00000 replayed through WebhookReplay %s", runID, flaky)

	// Auto-disable after 6 consecutive failed attempts, then `kubectl webhooks enable`.
	respond(t, shop, flaky, 503)
	produce(t, shop, "producer-ad", "invoice.created", runID+"ad", 4, 5)
	kubectl(t, "-n", shop, "wait", "--for=condition=Disabled", "webhookendpoint/"+flaky, "--timeout=3m")
	logf(t, "endpoint auto-disabled: %s", strings.TrimSpace(kubectl(t, "-n", shop, "get", "whe", flaky)))
	respond(t, shop, flaky, 200)
	pl.run(t, shop, "enable", flaky)
	eventually(t, 2*time.Minute, "the endpoint enabled again", func() error {
		if s := pl.status(t, shop, flaky); s.State == "Disabled" {
			return fmt.Errorf("status %+v", s)
		}
		return nil
	})
	produce(t, shop, "producer-ae", "invoice.created", runID+"ae", 3, 5)
	waitReceived(t, shop, flaky, ids(runID+"ae", 3), 2*time.Minute)
	logf(t, "endpoint re-enabled with kubectl webhooks enable; new events delivered")
	s.flaky = flaky
}

// regexpDelivered: kubectl describe shows the health's Delivered count.
func regexpDelivered(describe string, n int) bool {
	for _, l := range strings.Split(describe, "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == "Delivered:" && f[1] == fmt.Sprint(n) {
			return true
		}
	}
	return false
}

// lockedBuffer collects a process's output for reading while it runs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
