package chart

import (
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/webhook-operator/webhook-operator/controllers"
)

// Secure metrics by default: the controller (and through it every dispatcher) runs with
// --metrics-secure, the chart ships metrics-reader and the dispatchers' TokenReview and
// SubjectAccessReview binding (config/rbac/metrics.yaml's), the controller may update that one
// binding and create none, and the ServiceMonitor and PodMonitor scrape over HTTPS with the
// token of a ServiceAccount bound to metrics-reader. metrics.secure=false goes back to HTTP.
func TestSecureMetrics(t *testing.T) {
	const monitors = "metrics: {serviceMonitor: {enabled: true}, dispatcherPodMonitor: {enabled: true}}"
	r := render(t, monitors)
	_, c := deployment(t, r)
	if !slices.Contains(c.Args, "--metrics-secure=true") {
		t.Errorf("args %q", c.Args)
	}
	for _, want := range decodeFile(t, "config/rbac/metrics.yaml") {
		name := want.GetName() // for release webhook-operator, <fullname>-metrics-reader is config's name
		got := r.must(t, want.GetKind(), name)
		for _, field := range []string{"rules", "roleRef"} {
			if !reflect.DeepEqual(got.Object[field], want.Object[field]) {
				t.Errorf("%s %s: %s differ from config/rbac/metrics.yaml\n got %v\nwant %v", want.GetKind(), name, field, got.Object[field], want.Object[field])
			}
		}
	}
	r.must(t, "ClusterRoleBinding", controllers.DispatcherMetricsBinding)

	var role rbacv1.ClusterRole
	typed(t, r.must(t, "ClusterRole", controllerName), &role)
	for _, rule := range role.Rules {
		if !slices.Contains(rule.APIGroups, rbacv1.GroupName) {
			continue
		}
		for _, res := range rule.Resources {
			if res != "clusterrolebindings" && res != "clusterroles" {
				continue
			}
			if !reflect.DeepEqual(rule.ResourceNames, []string{controllers.DispatcherMetricsBinding}) ||
				slices.ContainsFunc(rule.Verbs, func(v string) bool { return v == "create" || v == "bind" || v == "escalate" || v == "*" }) {
				t.Errorf("the controller's ClusterRole grants %v on %s %v", rule.Verbs, res, rule.ResourceNames)
			}
		}
	}

	scraper := "webhook-operator-metrics-scraper"
	var sa corev1.ServiceAccount
	typed(t, r.must(t, "ServiceAccount", scraper), &sa)
	var tok corev1.Secret
	typed(t, r.must(t, "Secret", scraper), &tok)
	if tok.Type != corev1.SecretTypeServiceAccountToken || tok.Annotations[corev1.ServiceAccountNameKey] != scraper {
		t.Errorf("scraper token Secret %+v", tok)
	}
	var crb rbacv1.ClusterRoleBinding
	typed(t, r.must(t, "ClusterRoleBinding", scraper), &crb)
	if crb.RoleRef.Name != "webhook-operator-metrics-reader" || len(crb.Subjects) != 1 || crb.Subjects[0].Name != scraper {
		t.Errorf("scraper binding %+v", crb)
	}
	for _, m := range []struct{ kind, name, field string }{
		{"ServiceMonitor", controllerName, "endpoints"},
		{"PodMonitor", "webhook-operator-dispatchers", "podMetricsEndpoints"},
	} {
		eps, _, _ := unstructured.NestedSlice(r.must(t, m.kind, m.name).Object, "spec", m.field)
		ep := eps[0].(map[string]any)
		cred, _, _ := unstructured.NestedMap(ep, "authorization", "credentials")
		skip, _, _ := unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify")
		if ep["scheme"] != "https" || cred["name"] != scraper || cred["key"] != "token" || !skip {
			t.Errorf("%s endpoint %v: want https with the scraper's token", m.kind, ep)
		}
	}

	// An existing scraper identity.
	r = render(t, "metrics: {serviceMonitor: {enabled: true}, scraper: {create: false, existingSecret: prom-token}}")
	if r.find("ServiceAccount", scraper) != nil || r.find("Secret", scraper) != nil {
		t.Error("scraper created with scraper.create=false")
	}
	eps, _, _ := unstructured.NestedSlice(r.must(t, "ServiceMonitor", controllerName).Object, "spec", "endpoints")
	if cred, _, _ := unstructured.NestedString(eps[0].(map[string]any), "authorization", "credentials", "name"); cred != "prom-token" {
		t.Errorf("ServiceMonitor credentials %q, want prom-token", cred)
	}
	if _, err := template(t, "metrics: {serviceMonitor: {enabled: true}, scraper: {create: false}}"); err == nil {
		t.Error("no scraper identity at all was accepted")
	}

	// Plain HTTP.
	r = render(t, "metrics: {secure: false, serviceMonitor: {enabled: true}, dispatcherPodMonitor: {enabled: true}}")
	_, c = deployment(t, r)
	if !slices.Contains(c.Args, "--metrics-secure=false") {
		t.Errorf("args %q", c.Args)
	}
	if r.find("ClusterRoleBinding", controllers.DispatcherMetricsBinding) != nil || r.find("ServiceAccount", scraper) != nil {
		t.Error("secure-metrics RBAC rendered with metrics.secure=false")
	}
	eps, _, _ = unstructured.NestedSlice(r.must(t, "ServiceMonitor", controllerName).Object, "spec", "endpoints")
	if ep := eps[0].(map[string]any); ep["scheme"] != "http" || ep["authorization"] != nil {
		t.Errorf("insecure ServiceMonitor endpoint %v", ep)
	}
}
