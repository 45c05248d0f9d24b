package chart

import (
	"encoding/base64"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

const apiserverName = "webhook-operator-apiserver"

// The data API server is on by default: the chart renders its Deployment (running `webhook-
// operator apiserver` with flags it defines), Service, serving certificate, APIService and
// ServiceAccount with delegated authentication and authorization (system:auth-delegator, the
// extension-apiserver-authentication reader in kube-system), names the ServiceAccount to the
// callout, and apiserver.enabled=false leaves all of it out.
func TestAPIServer(t *testing.T) {
	if r := render(t, "apiserver: {enabled: false}\n"); r.find("Deployment", apiserverName) != nil || r.find("APIService", "v1alpha1.data.webhook-operator.io") != nil {
		t.Error("apiserver.enabled=false renders the data API server")
	} else if _, cc := calloutDeployment(t, r); slices.ContainsFunc(cc.Args, func(a string) bool { return strings.HasPrefix(a, "--nats-apiserver-service-account") }) {
		t.Errorf("without the data API server the callout still names its ServiceAccount: %v", cc.Args)
	}
	bin := filepath.Join(t.TempDir(), "webhook-operator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/webhook-operator")
	build.Dir = testenv.Root()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for name, values := range map[string]string{
		"callout":      "",
		"callout-tls":  "nats: {tls: {enabled: true, existingSecret: nats-client}}\napiserver: {replicas: 2, port: 9443}\n",
		"static":       "nats: {auth: {mode: static}, credentials: {user: u, password: p}}\n",
		"cert-manager": "apiserver: {certManager: {enabled: true}}\n",
	} {
		t.Run(name, func(t *testing.T) {
			r := render(t, values)
			var d appsv1.Deployment
			typed(t, r.must(t, "Deployment", apiserverName), &d)
			spec := d.Spec.Template.Spec
			if spec.ServiceAccountName != apiserverName || len(spec.Containers) != 1 {
				t.Fatalf("pod spec %+v", spec)
			}
			c := spec.Containers[0]
			if c.Args[0] != "apiserver" {
				t.Errorf("args %v", c.Args)
			}
			// Every flag is one `webhook-operator apiserver` defines (it refuses unknown ones).
			if out, err := exec.Command(bin, append(c.Args, "--help")...).CombinedOutput(); err != nil {
				t.Errorf("webhook-operator %s --help: %v\n%s", strings.Join(c.Args, " "), err, out)
			}
			port := "8443"
			if name == "callout-tls" {
				port = "9443"
				if *d.Spec.Replicas != 2 {
					t.Errorf("replicas %d", *d.Spec.Replicas)
				}
			}
			if !slices.Contains(c.Args, "--secure-port="+port) || c.Ports[0].Name != "https" || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("serving: %v %+v", c.Args, c.Ports)
			}

			var role rbacv1.ClusterRole
			typed(t, r.must(t, "ClusterRole", apiserverName), &role)
			want := []rbacv1.PolicyRule{
				{APIGroups: []string{"webhook-operator.io"}, Resources: []string{"webhookendpoints"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{"webhook-operator.io"}, Resources: []string{"webhookdeliveries"}, Verbs: []string{"delete"}},
			}
			if !slices.EqualFunc(role.Rules, want, func(a, b rbacv1.PolicyRule) bool {
				return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) && slices.Equal(a.Verbs, b.Verbs)
			}) {
				t.Errorf("the data API server's ClusterRole: %+v", role.Rules)
			}
			var delegator rbacv1.ClusterRoleBinding
			typed(t, r.must(t, "ClusterRoleBinding", apiserverName+":system:auth-delegator"), &delegator)
			var reader rbacv1.RoleBinding
			typed(t, r.must(t, "RoleBinding", apiserverName+":extension-apiserver-authentication-reader"), &reader)
			if delegator.RoleRef.Name != "system:auth-delegator" || reader.Namespace != "kube-system" || reader.RoleRef.Name != "extension-apiserver-authentication-reader" ||
				delegator.Subjects[0].Name != apiserverName || reader.Subjects[0].Name != apiserverName || reader.Subjects[0].Namespace != releaseNamespace {
				t.Errorf("delegated authentication: %+v %+v", delegator, reader)
			}

			var svc corev1.Service
			typed(t, r.must(t, "Service", apiserverName), &svc)
			if svc.Spec.Selector["app.kubernetes.io/component"] != "apiserver" || svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.StrVal != "https" {
				t.Errorf("the data API server's Service %+v", svc.Spec)
			}
			api := r.must(t, "APIService", "v1alpha1.data.webhook-operator.io")
			svcRef, _, _ := unstructured.NestedMap(api.Object, "spec", "service")
			if svcRef["name"] != apiserverName || svcRef["namespace"] != releaseNamespace {
				t.Errorf("the APIService's service %v", svcRef)
			}
			caBundle, _, _ := unstructured.NestedString(api.Object, "spec", "caBundle")
			if name == "cert-manager" {
				if api.GetAnnotations()["cert-manager.io/inject-ca-from"] != releaseNamespace+"/"+apiserverName || caBundle != "" {
					t.Errorf("cert-manager's CA is not injected: %v, caBundle %q", api.GetAnnotations(), caBundle)
				}
				cert := r.must(t, "Certificate", apiserverName)
				if s, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName"); s != apiserverName+"-tls" {
					t.Errorf("the Certificate's Secret %q", s)
				}
			} else {
				// The chart's own CA signs a certificate for the Service's name.
				var secret corev1.Secret
				typed(t, r.must(t, "Secret", apiserverName+"-tls"), &secret)
				ca, err := base64.StdEncoding.DecodeString(caBundle)
				if err != nil || string(secret.Data["ca.crt"]) != string(ca) || !strings.Contains(string(secret.Data["tls.crt"]), "BEGIN CERTIFICATE") {
					t.Errorf("the APIService's caBundle is not the serving certificate's CA (%v)", err)
				}
			}

			callout := name != "static"
			if callout {
				_, cc := calloutDeployment(t, r)
				if !slices.Contains(cc.Args, "--nats-apiserver-service-account="+releaseNamespace+"/"+apiserverName) {
					t.Errorf("the callout does not know the data API server (%v)", cc.Args)
				}
			}
			hasToken := false
			for _, v := range spec.Volumes {
				if v.Projected != nil && v.Projected.Sources[0].ServiceAccountToken != nil &&
					v.Projected.Sources[0].ServiceAccountToken.Audience == natsauth.DefaultAudience {
					hasToken = true
				}
			}
			if hasToken != callout || slices.Contains(c.Args, "--nats-token-file=/var/run/secrets/nats.webhook-operator.io/token") != callout {
				t.Errorf("the projected NATS token (callout mode only): %v %v", spec.Volumes, c.Args)
			}
		})
	}
}
