package natsauth_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
)

// A Kubernetes token never crosses the network in clear: the callout refuses one on a
// connection that is not over TLS, and a client (a dispatcher's, kubectl webhooks') refuses
// to send one to a server it does not require TLS of, each naming the flag that allows it
// for a loopback demo.
func TestTokensAreRefusedInClear(t *testing.T) {
	w := newWorld(t, true)
	w.svc.AllowPlaintextTokens = false
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	tok := token(t, "a", "producer", natsauth.DefaultAudience)
	if _, err := w.connect(tok, "a"); err == nil {
		t.Fatal("connected with a token over a connection without TLS")
	}
	if !w.log.has("bus connection refused", "not over TLS", "--nats-allow-plaintext-tokens") {
		t.Fatalf("no refusal naming the flag:\n%s", w.log)
	}
	w.svc.AllowPlaintextTokens = true
	w.mustConnect(tok, "a")

	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := opconfig.Default()
	cfg.NATS.URL, cfg.NATS.TokenFile, cfg.NATS.Namespace = w.nats.URL(), file, "a"
	_, _, err := cfg.Connect("dispatcher", nats.RetryOnFailedConnect(false), nats.MaxReconnects(0))
	if err == nil || !strings.Contains(err.Error(), "without TLS") || !strings.Contains(err.Error(), "--nats-allow-plaintext-tokens") {
		t.Fatalf("a dispatcher's connection without TLS: %v, want a refusal naming --nats-allow-plaintext-tokens", err)
	}
	// Static NATS credentials are not Kubernetes tokens: not refused here.
	cfg.NATS.TokenFile = ""
	t.Setenv(opconfig.EnvNATSToken, "a-nats-token")
	if _, _, err := cfg.Connect("static", nats.RetryOnFailedConnect(false), nats.MaxReconnects(0)); err != nil && strings.Contains(err.Error(), "without TLS") {
		t.Errorf("a static NATS token: %v", err)
	}
	t.Setenv(opconfig.EnvNATSToken, "")
	cfg.NATS.TokenFile, cfg.NATS.AllowPlaintextTokens = file, true
	nc, _, err := cfg.Connect("dispatcher", nats.RetryOnFailedConnect(false), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("opted in: %v\n%s", err, w.log)
	}
	nc.Close()
}

// Only tokens of the NATS audience are accepted by default: a kubeconfig user's token is good
// against the API server too. The controller's --nats-allow-api-audience-tokens accepts them.
func TestAPIAudienceTokensAreRefusedByDefault(t *testing.T) {
	w := newWorld(t, false)
	serviceAccount(t, "a", "producer", false, rule(natsauth.ResourceEvents, "create"))
	apiToken := token(t, "a", "producer")
	if _, err := w.connect(apiToken, "a"); err == nil {
		t.Fatal("connected with a token of the API server's audience")
	}
	if !w.log.has("bus connection refused", "for audience "+natsauth.DefaultAudience, "--nats-allow-api-audience-tokens") {
		t.Fatalf("no refusal naming the flag:\n%s", w.log)
	}
	w.svc.Kube.AllowAPIAudience = true
	// A new token: the callout remembers the one it just refused for a while.
	p := w.mustConnect(token(t, "a", "producer"), "a")
	if _, err := p.js.Publish(context.Background(), "webhooks.a.order.created", []byte("{}")); err != nil {
		t.Fatalf("a producer with its API token, opted in: %v", err)
	}
}

// The dispatcher role goes to the token of the ServiceAccount the controller made, by UID, not
// to any ServiceAccount of that name: one deleted and made again by a tenant (unlabelled) is
// not the dispatcher while the controller's cache still holds the old one.
func TestDispatcherRoleNeedsTheServiceAccountsUID(t *testing.T) {
	w := newWorld(t, false)
	ctx := context.Background()
	// A namespace of its own: the ServiceAccount stays unlabelled.
	ensureNamespace(t, "uid")
	serviceAccount(t, "uid", "webhook-dispatcher", true)
	old, _, err := labelledDispatchers(ctx, "uid", "webhook-dispatcher")
	if err != nil {
		t.Fatal(err)
	}
	// What a cache that has not seen the change yet answers.
	w.svc.Kube.Dispatchers = func(context.Context, string, string) (natsauth.DispatcherAccount, bool, error) { return old, true, nil }
	if err := cs.CoreV1().ServiceAccounts("uid").Delete(ctx, "webhook-dispatcher", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts("uid").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "webhook-dispatcher"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.connect(token(t, "uid", "webhook-dispatcher", natsauth.DefaultAudience), "uid"); err == nil {
		t.Fatal("the new ServiceAccount's token got in as the dispatcher")
	}
	if !w.log.has("bus connection refused", "not of the dispatcher ServiceAccount of that name the controller made (UID "+old.UID+")") {
		t.Fatalf("no refusal for the UID:\n%s", w.log)
	}
}
