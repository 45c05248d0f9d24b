package plugin_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// execTokenEnv makes the test binary an exec credential plugin printing its value.
const execTokenEnv = "PLUGIN_TEST_EXEC_TOKEN"

func TestKubeBearerTokenIsWhatClientGoWouldSend(t *testing.T) {
	ctx := context.Background()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("from-a-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  *rest.Config
		want string
	}{
		{"a static token", &rest.Config{Host: "https://127.0.0.1:1", BearerToken: "static-token"}, "static-token"},
		{"a token file", &rest.Config{Host: "https://127.0.0.1:1", BearerTokenFile: tokenFile}, "from-a-file"},
		{"an exec plugin", &rest.Config{Host: "https://127.0.0.1:1", ExecProvider: &clientcmdapi.ExecConfig{
			Command: exe, APIVersion: "client.authentication.k8s.io/v1", InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
			Env: []clientcmdapi.ExecEnvVar{{Name: execTokenEnv, Value: "from-exec"}}}}, "from-exec"},
		{"a client certificate", cp.Config, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := plugin.KubeBearerToken(ctx, tc.cfg)
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// The plugin connects as the kubeconfig's user: the auth callout gives it what RBAC allows in
// the namespace, and a refusal says what is missing.
func TestPluginConnectsAsTheKubeconfigUser(t *testing.T) {
	ctx := context.Background()
	n, js := testenv.NewCalloutNATS(t, nil)
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	svc, err := n.Auth.CalloutService(&natsauth.Kube{Client: cs, Audience: natsauth.DefaultAudience}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	n.ServeCallout(t, svc)

	e := &env{t: t, ns: "bus-users", cfg: streams.DefaultConfig(), js: js, nats: n, getenv: map[string]string{}}
	e.createNamespace(e.ns)
	for _, o := range []any{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "publisher", Namespace: e.ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody", Namespace: e.ns}},
		// It may publish, and request tokens for itself (so the plugin gets one of the NATS
		// audience).
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "publisher", Namespace: e.ns}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"webhook-operator.io"}, Resources: []string{"webhookevents"}, Verbs: []string{"create"}},
			{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, ResourceNames: []string{"publisher"}, Verbs: []string{"create"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "publisher", Namespace: e.ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "publisher"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "publisher", Namespace: e.ns}}},
	} {
		var err error
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(e.ns).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = cs.RbacV1().Roles(e.ns).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = cs.RbacV1().RoleBindings(e.ns).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	run := func(sa string, args ...string) result {
		t.Helper()
		path, _ := e.serviceAccountKubeconfig(sa)
		return runWithKubeconfig(path, append([]string{"--nats-url", n.URL()}, args...)...)
	}

	// The test's server is on loopback without TLS: the plugin sends a token only when told.
	r := run("publisher", "publish", "order.created", "--data", `{}`, "--id", "evt_1")
	if r.code == plugin.ExitOK || !strings.Contains(r.errOut, "without TLS") || !strings.Contains(r.errOut, "--nats-allow-plaintext-tokens") {
		t.Fatalf("a token without TLS: %s", r)
	}
	run("publisher", "--nats-allow-plaintext-tokens", "publish", "order.created", "--data", `{}`, "--id", "evt_1").must(t, plugin.ExitOK)
	if len(e.subjectMsgs("WEBHOOKS_"+e.ns, "webhooks."+e.ns+".order.created")) != 1 {
		t.Fatal("the event was not stored")
	}
	// A user who cannot get a token of the NATS audience: the plugin does not send its API
	// token unless told, and the callout does not accept one unless told.
	r = run("nobody", "--nats-allow-plaintext-tokens", "publish", "order.created", "--data", `{}`)
	if r.code != plugin.ExitRefused || !strings.Contains(r.errOut, "never the token your kubeconfig uses for the API server") || !strings.Contains(r.errOut, "--nats-allow-api-audience-tokens") {
		t.Fatalf("a user without a token of the NATS audience: %s", r)
	}
	r = run("nobody", "--nats-allow-plaintext-tokens", "--nats-allow-api-audience-tokens", "publish", "order.created", "--data", `{}`)
	if r.code == plugin.ExitOK || !strings.Contains(r.errOut, "which the controller accepts only with --nats-allow-api-audience-tokens") {
		t.Fatalf("an API token the callout does not accept: %s", r)
	}
	svc.Kube.AllowAPIAudience = true
	r = run("nobody", "--nats-allow-plaintext-tokens", "--nats-allow-api-audience-tokens", "publish", "order.created", "--data", `{}`)
	if r.code == plugin.ExitOK || !strings.Contains(r.errOut, "Kubernetes RBAC must allow") || !strings.Contains(r.errOut, "namespace "+e.ns) {
		t.Fatalf("a user without RBAC: %s", r)
	}
}

// serviceAccountKubeconfig writes a kubeconfig whose user is ServiceAccount sa of the test's
// namespace, with a token of the API server's audience, and returns its path and the token.
func (e *env) serviceAccountKubeconfig(sa string) (path, token string) {
	e.t.Helper()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	tr, err := cs.CoreV1().ServiceAccounts(e.ns).CreateToken(context.Background(), sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthorityData: cp.Config.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u", Namespace: e.ns}
	kc.CurrentContext = "c"
	path = filepath.Join(e.t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		e.t.Fatal(err)
	}
	return path, tr.Status.Token
}

// runWithKubeconfig runs `kubectl webhooks args...` in-process as the user of the kubeconfig
// at path, with an empty environment.
func runWithKubeconfig(path string, args ...string) result {
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := plugin.Run(ctx, append([]string{"--kubeconfig", path}, args...),
		genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}, func(string) string { return "" })
	return result{code: code, out: out.String(), errOut: errOut.String()}
}
