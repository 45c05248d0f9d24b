package chart

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

const consoleName = "webhook-operator-console"

// The console is off by default; console.enabled renders its Deployment, Service and a
// ServiceAccount bound to nothing (the console calls the API with its users' tokens), with
// flags `webhook-operator console` accepts; more than one replica needs a shared session key.
func TestConsole(t *testing.T) {
	if r := render(t, ""); r.find("Deployment", consoleName) != nil {
		t.Error("the console is rendered by default")
	}
	bin := filepath.Join(t.TempDir(), "webhook-operator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/webhook-operator")
	build.Dir = testenv.Root()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for name, values := range map[string]string{
		"plain": "console: {enabled: true}\n",
		"tls-oidc": "console: {enabled: true, replicas: 2, sessionKeySecret: console-session, tls: {existingSecret: console-tls}, namespaces: [shop]," +
			" oidc: {issuerURL: 'https://dex.example.com', clientID: console, clientSecretSecret: console-oidc, redirectURL: 'https://console.example.com/oidc/callback'}}\n",
	} {
		t.Run(name, func(t *testing.T) {
			r := render(t, values)
			var d appsv1.Deployment
			typed(t, r.must(t, "Deployment", consoleName), &d)
			spec := d.Spec.Template.Spec
			if spec.ServiceAccountName != consoleName || len(spec.Containers) != 1 || spec.Containers[0].Args[0] != "console" {
				t.Fatalf("pod spec %+v", spec)
			}
			args := spec.Containers[0].Args
			if out, err := exec.Command(bin, append(args, "--help")...).CombinedOutput(); err != nil {
				t.Errorf("webhook-operator %s --help: %v\n%s", strings.Join(args, " "), err, out)
			}
			if name == "tls-oidc" && (!slices.Contains(args, "--oidc-issuer-url=https://dex.example.com") || !slices.Contains(args, "--session-key-file=/etc/webhook-operator/console-session/session-key")) {
				t.Errorf("args %v", args)
			}
			r.must(t, "Service", consoleName)
			r.must(t, "ServiceAccount", consoleName)
			for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
				for _, o := range r.ofKind(kind) {
					var b rbacv1.ClusterRoleBinding
					typed(t, o, &b)
					for _, s := range b.Subjects {
						if s.Name == consoleName {
							t.Errorf("%s %s binds the console's ServiceAccount", kind, b.Name)
						}
					}
				}
			}
		})
	}
	if _, err := template(t, "console: {enabled: true, replicas: 2}\n"); err == nil || !strings.Contains(err.Error(), "console.sessionKeySecret") {
		t.Errorf("two replicas without a session key: %v", err)
	}
}
