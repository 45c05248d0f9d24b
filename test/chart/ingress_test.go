package chart

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

const ingressName = "webhook-operator-ingress"

// The ingress is off by default; with ingress.enabled the chart renders its Deployment,
// Service, ServiceAccount and a ClusterRole of TokenReviews and SubjectAccessReviews only, names
// its ServiceAccount to the controller's callout, tells the plugin its URL, and passes only
// flags `webhook-operator ingress` defines.
func TestIngress(t *testing.T) {
	if r := render(t, ""); r.find("Deployment", ingressName) != nil || r.find("Service", ingressName) != nil {
		t.Error("the ingress is rendered by default")
	}
	bin := filepath.Join(t.TempDir(), "webhook-operator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/webhook-operator")
	build.Dir = testenv.Root()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for name, values := range map[string]string{
		"callout":       "ingress: {enabled: true}\n",
		"callout-tls":   "ingress: {enabled: true, tls: {existingSecret: ingress-cert}, rateLimit: 100.5, rateBurst: 200}\nnats: {tls: {enabled: true, existingSecret: nats-client}}\n",
		"static":        "ingress: {enabled: true}\nnats: {auth: {mode: static}, credentials: {user: u, password: p}}\n",
		"two-audiences": "ingress: {enabled: true, tokenAudiences: [ingress.webhook-operator.io, https://kubernetes.default.svc.cluster.local]}\n",
	} {
		t.Run(name, func(t *testing.T) {
			r := render(t, values)
			var d appsv1.Deployment
			typed(t, r.must(t, "Deployment", ingressName), &d)
			spec := d.Spec.Template.Spec
			if spec.ServiceAccountName != ingressName || len(spec.Containers) != 1 {
				t.Fatalf("pod spec %+v", spec)
			}
			c := spec.Containers[0]
			if c.Args[0] != "ingress" {
				t.Errorf("args %v", c.Args)
			}
			// Every flag is one `webhook-operator ingress` defines (it refuses unknown ones).
			if out, err := exec.Command(bin, append(c.Args, "--help")...).CombinedOutput(); err != nil {
				t.Errorf("webhook-operator %s --help: %v\n%s", strings.Join(c.Args, " "), err, out)
			}
			var role rbacv1.ClusterRole
			typed(t, r.must(t, "ClusterRole", ingressName), &role)
			want := []rbacv1.PolicyRule{
				{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
				{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
				// The namespaces' WebhookQuota rates (quota.RateTable), read only.
				{APIGroups: []string{"webhook-operator.io"}, Resources: []string{"webhookquotas"}, Verbs: []string{"get", "list", "watch"}},
			}
			if len(role.Rules) != len(want) || !slices.EqualFunc(role.Rules, want, func(a, b rbacv1.PolicyRule) bool {
				return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) && slices.Equal(a.Verbs, b.Verbs)
			}) {
				t.Errorf("the ingress's ClusterRole: %+v", role.Rules)
			}
			var svc corev1.Service
			typed(t, r.must(t, "Service", ingressName), &svc)
			if svc.Spec.Selector["app.kubernetes.io/component"] != "ingress" || svc.Spec.Ports[0].TargetPort.StrVal != "api" {
				t.Errorf("the ingress's Service %+v", svc.Spec)
			}
			r.must(t, "ServiceAccount", ingressName)
			callout := !strings.Contains(name, "static")
			if callout {
				_, cc := calloutDeployment(t, r)
				if !slices.Contains(cc.Args, "--nats-ingress-service-account="+releaseNamespace+"/"+ingressName) {
					t.Errorf("the callout does not know the ingress (%v)", cc.Args)
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
			url := stringData(t, r, "webhook-operator-nats")["ingress-url"]
			scheme := "http"
			if strings.Contains(name, "tls") {
				scheme = "https"
				if !slices.Contains(c.Args, "--tls-cert-file=/etc/webhook-operator/ingress-tls/tls.crt") {
					t.Errorf("no TLS: %v", c.Args)
				}
			}
			if url != scheme+"://"+ingressName+"."+releaseNamespace+".svc:80" {
				t.Errorf("the plugin's ingress-url %q", url)
			}
			// The plugin requests a token of the ingress's first audience.
			if a := stringData(t, r, "webhook-operator-nats")["ingress-token-audience"]; a != "ingress.webhook-operator.io" {
				t.Errorf("the plugin's ingress-token-audience %q", a)
			}
			if name == "two-audiences" && !slices.Contains(c.Args, "--token-audience=ingress.webhook-operator.io,https://kubernetes.default.svc.cluster.local") {
				t.Errorf("audiences: %v", c.Args)
			}
			for _, want := range []string{"--max-reviews-in-flight=64", "--max-body-bytes-in-flight=48Mi", "--max-connections=4096", "--max-connections-per-client=256"} {
				if !slices.Contains(c.Args, want) {
					t.Errorf("no %s: %v", want, c.Args)
				}
			}
			checkAPIPriority(t, r)
		})
	}
	// Without its own level, the ingress's reviews fall in the built-in service-accounts one.
	if r := render(t, "ingress: {enabled: true, apiPriority: {enabled: false}}\n"); r.find("FlowSchema", ingressName) != nil || r.find("PriorityLevelConfiguration", ingressName) != nil {
		t.Error("ingress.apiPriority.enabled=false renders the ingress's API priority level")
	}
}

// checkAPIPriority checks the ingress's own API Priority and Fairness level: a FlowSchema that
// sends its ServiceAccount's TokenReviews and SubjectAccessReviews (and nothing else) to a
// limited PriorityLevelConfiguration, ahead of the built-in service-accounts FlowSchema.
func checkAPIPriority(t *testing.T, r rendered) {
	t.Helper()
	var fs flowcontrolv1.FlowSchema
	typed(t, r.must(t, "FlowSchema", ingressName), &fs)
	var plc flowcontrolv1.PriorityLevelConfiguration
	typed(t, r.must(t, "PriorityLevelConfiguration", ingressName), &plc)
	if fs.Spec.PriorityLevelConfiguration.Name != plc.Name || fs.Spec.MatchingPrecedence >= 9000 || len(fs.Spec.Rules) != 1 {
		t.Fatalf("FlowSchema %+v", fs.Spec)
	}
	rule := fs.Spec.Rules[0]
	if len(rule.Subjects) != 1 || rule.Subjects[0].ServiceAccount == nil ||
		*rule.Subjects[0].ServiceAccount != (flowcontrolv1.ServiceAccountSubject{Namespace: releaseNamespace, Name: ingressName}) {
		t.Errorf("FlowSchema subjects %+v", rule.Subjects)
	}
	var resources []string
	for _, rr := range rule.ResourceRules {
		if !rr.ClusterScope || !slices.Equal(rr.Verbs, []string{"create"}) {
			t.Errorf("resource rule %+v", rr)
		}
		resources = append(resources, rr.APIGroups[0]+"/"+rr.Resources[0])
	}
	if !slices.Equal(resources, []string{"authentication.k8s.io/tokenreviews", "authorization.k8s.io/subjectaccessreviews"}) || len(rule.NonResourceRules) != 0 {
		t.Errorf("FlowSchema matches %v and %d non-resource rules", resources, len(rule.NonResourceRules))
	}
	if plc.Spec.Type != flowcontrolv1.PriorityLevelEnablementLimited || plc.Spec.Limited == nil || plc.Spec.Limited.LimitResponse.Type != flowcontrolv1.LimitResponseTypeQueue {
		t.Errorf("PriorityLevelConfiguration %+v", plc.Spec)
	}
}
