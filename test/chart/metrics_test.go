package chart

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"reflect"
	"slices"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Secure metrics by default: the controller (and through it every dispatcher) runs with
// --metrics-secure. The controller's ServiceMonitor scrapes over HTTPS with the token of a
// ServiceAccount bound to metrics-reader (config/rbac/metrics.yaml's). The dispatchers' PodMonitor
// scrapes with a client certificate of the scraper CA the chart makes (the controller is told
// the Secret holding it, and the subject to require): no ClusterRole grants TokenReviews or
// SubjectAccessReviews to anything but the release's own ServiceAccounts, and the controller
// may change no ClusterRole or ClusterRoleBinding, so it can grant a dispatcher nothing
// cluster-wide. metrics.secure=false goes back to HTTP.
func TestSecureMetrics(t *testing.T) {
	const monitors = "metrics: {serviceMonitor: {enabled: true}, dispatcherPodMonitor: {enabled: true}}"
	r := render(t, monitors)
	_, c := deployment(t, r)
	const scraperTLS = "webhook-operator-metrics-scraper-tls"
	for _, want := range []string{"--metrics-secure=true", "--dispatcher-metrics-ca-secret=" + scraperTLS,
		"--dispatcher-metrics-client-name=webhook-operator-metrics-scraper"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %q lack %s", c.Args, want)
		}
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
	dispatchersReviewNothing(t, r)

	// The scraper CA and its client certificate, of the subject the controller requires.
	var tlsSecret corev1.Secret
	typed(t, r.must(t, "Secret", scraperTLS), &tlsSecret)
	if tlsSecret.Type != corev1.SecretTypeTLS || tlsSecret.Namespace != releaseNamespace {
		t.Errorf("scraper TLS Secret %s in %s", tlsSecret.Type, tlsSecret.Namespace)
	}
	ca, cert := parseCert(t, tlsSecret.Data["ca.crt"]), parseCert(t, tlsSecret.Data["tls.crt"])
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the scraper's certificate is not a client certificate of the scraper CA: %v", err)
	}
	if cert.Subject.CommonName != "webhook-operator-metrics-scraper" || len(tlsSecret.Data["tls.key"]) == 0 {
		t.Errorf("the scraper's certificate is of %q", cert.Subject.CommonName)
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
	eps, _, _ := unstructured.NestedSlice(r.must(t, "ServiceMonitor", controllerName).Object, "spec", "endpoints")
	ep := eps[0].(map[string]any)
	cred, _, _ := unstructured.NestedMap(ep, "authorization", "credentials")
	skip, _, _ := unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify")
	if ep["scheme"] != "https" || cred["name"] != scraper || cred["key"] != "token" || !skip {
		t.Errorf("ServiceMonitor endpoint %v: want https with the scraper's token", ep)
	}
	eps, _, _ = unstructured.NestedSlice(r.must(t, "PodMonitor", "webhook-operator-dispatchers").Object, "spec", "podMetricsEndpoints")
	ep = eps[0].(map[string]any)
	certName, _, _ := unstructured.NestedString(ep, "tlsConfig", "cert", "secret", "name")
	certKey, _, _ := unstructured.NestedString(ep, "tlsConfig", "cert", "secret", "key")
	keyName, _, _ := unstructured.NestedString(ep, "tlsConfig", "keySecret", "name")
	keyKey, _, _ := unstructured.NestedString(ep, "tlsConfig", "keySecret", "key")
	skip, _, _ = unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify")
	if ep["scheme"] != "https" || ep["authorization"] != nil || certName != scraperTLS || certKey != "tls.crt" ||
		keyName != scraperTLS || keyKey != "tls.key" || !skip {
		t.Errorf("PodMonitor endpoint %v: want https with the scraper's client certificate, no token", ep)
	}

	// An existing scraper identity, and the installer's own scraper CA and certificate (any
	// subject it signed).
	r = render(t, "metrics: {serviceMonitor: {enabled: true}, dispatcherPodMonitor: {enabled: true}, scraper: {create: false, existingSecret: prom-token, tls: {existingSecret: prom-tls, commonName: ''}}}")
	if r.find("ServiceAccount", scraper) != nil || r.find("Secret", scraper) != nil || r.find("Secret", scraperTLS) != nil {
		t.Error("scraper identity created with scraper.create=false and scraper.tls.existingSecret")
	}
	_, c = deployment(t, r)
	if !slices.Contains(c.Args, "--dispatcher-metrics-ca-secret=prom-tls") || slices.ContainsFunc(c.Args, func(a string) bool {
		return strings.HasPrefix(a, "--dispatcher-metrics-client-name")
	}) {
		t.Errorf("args %q: want the installer's scraper CA, no subject", c.Args)
	}
	eps, _, _ = unstructured.NestedSlice(r.must(t, "ServiceMonitor", controllerName).Object, "spec", "endpoints")
	if cred, _, _ := unstructured.NestedString(eps[0].(map[string]any), "authorization", "credentials", "name"); cred != "prom-token" {
		t.Errorf("ServiceMonitor credentials %q, want prom-token", cred)
	}
	eps, _, _ = unstructured.NestedSlice(r.must(t, "PodMonitor", "webhook-operator-dispatchers").Object, "spec", "podMetricsEndpoints")
	if name, _, _ := unstructured.NestedString(eps[0].(map[string]any), "tlsConfig", "cert", "secret", "name"); name != "prom-tls" {
		t.Errorf("PodMonitor client certificate %q, want prom-tls", name)
	}
	if _, err := template(t, "metrics: {serviceMonitor: {enabled: true}, scraper: {create: false}}"); err == nil {
		t.Error("no scraper identity at all was accepted")
	}

	// Plain HTTP.
	r = render(t, "metrics: {secure: false, serviceMonitor: {enabled: true}, dispatcherPodMonitor: {enabled: true}}")
	_, c = deployment(t, r)
	if !slices.Contains(c.Args, "--metrics-secure=false") || slices.ContainsFunc(c.Args, func(a string) bool {
		return strings.HasPrefix(a, "--dispatcher-metrics-")
	}) {
		t.Errorf("args %q", c.Args)
	}
	if r.find("ServiceAccount", scraper) != nil || r.find("Secret", scraperTLS) != nil {
		t.Error("secure-metrics identities rendered with metrics.secure=false")
	}
	for _, m := range []struct{ kind, name, field string }{
		{"ServiceMonitor", controllerName, "endpoints"},
		{"PodMonitor", "webhook-operator-dispatchers", "podMetricsEndpoints"},
	} {
		eps, _, _ := unstructured.NestedSlice(r.must(t, m.kind, m.name).Object, "spec", m.field)
		if ep := eps[0].(map[string]any); ep["scheme"] != "http" || ep["authorization"] != nil || ep["tlsConfig"] != nil {
			t.Errorf("insecure %s endpoint %v", m.kind, ep)
		}
	}
}

// dispatchersReviewNothing: no ClusterRole or Role of the chart that grants creating
// TokenReviews or SubjectAccessReviews is bound to anything but a ServiceAccount of the release
// namespace (a dispatcher runs in a tenant's namespace, as a ServiceAccount the tenant may run
// pods as), and the controller's ClusterRole grants nothing on ClusterRoles or
// ClusterRoleBindings (it cannot bind its dispatchers to one).
func dispatchersReviewNothing(t *testing.T, r rendered) {
	t.Helper()
	reviews := map[string]bool{} // kind/name of a role granting reviews
	for _, kind := range []string{"ClusterRole", "Role"} {
		for _, o := range r.ofKind(kind) {
			var role rbacv1.ClusterRole // a Role's rules are the same shape
			typed(t, o, &role)
			for _, rule := range role.Rules {
				if !slices.Contains(rule.Verbs, "create") && !slices.Contains(rule.Verbs, "*") {
					continue
				}
				for _, res := range rule.Resources {
					if res == "tokenreviews" || res == "subjectaccessreviews" || res == "*" {
						reviews[kind+"/"+o.GetName()] = true
					}
				}
			}
		}
	}
	if len(reviews) == 0 {
		t.Fatal("no role grants reviews: the controller's own metrics need them")
	}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, o := range r.ofKind(kind) {
			var b rbacv1.ClusterRoleBinding
			typed(t, o, &b)
			if !reviews[b.RoleRef.Kind+"/"+b.RoleRef.Name] {
				continue
			}
			if len(b.Subjects) == 0 {
				t.Errorf("%s %s binds reviews to subjects someone fills in later", kind, b.Name)
			}
			for _, s := range b.Subjects {
				if s.Kind != rbacv1.ServiceAccountKind || s.Namespace != releaseNamespace {
					t.Errorf("%s %s grants reviews (%s) to %s %s/%s, outside the release namespace", kind, b.Name, b.RoleRef.Name, s.Kind, s.Namespace, s.Name)
				}
			}
		}
	}
	var role rbacv1.ClusterRole
	typed(t, r.must(t, "ClusterRole", controllerName), &role)
	for _, rule := range role.Rules {
		if !slices.Contains(rule.APIGroups, rbacv1.GroupName) && !slices.Contains(rule.APIGroups, "*") {
			continue
		}
		for _, res := range rule.Resources {
			if res == "clusterrolebindings" || res == "clusterroles" || res == "*" {
				t.Errorf("the controller's ClusterRole grants %v on %s %v", rule.Verbs, res, rule.ResourceNames)
			}
		}
	}
}

func parseCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("no PEM certificate in %q", b)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dispatchersGetNoReviews checks, against the API server with release installed, that a
// dispatcher's ServiceAccount in namespace ns may create no TokenReview or SubjectAccessReview,
// and that the controller (its ServiceAccount, impersonated) cannot make it so: every
// ClusterRoleBinding of the cluster refuses it as a new subject (a server-side dry run, which
// the API server authorizes as the real change).
func (h *cluster) dispatchersGetNoReviews(release, ns string) {
	t := h.t
	t.Helper()
	ctx := context.Background()
	dispatcher := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "webhook-dispatcher"}
	user := "system:serviceaccount:" + ns + ":" + dispatcher.Name
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	reviewsAllowed := func() []string {
		var allowed []string
		for _, ra := range []authorizationv1.ResourceAttributes{
			{Group: "authentication.k8s.io", Resource: "tokenreviews", Verb: "create"},
			{Group: "authorization.k8s.io", Resource: "subjectaccessreviews", Verb: "create"},
		} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &ra}}
			if err := h.c.Create(ctx, sar); err != nil {
				t.Fatal(err)
			}
			if sar.Status.Allowed {
				allowed = append(allowed, ra.Resource)
			}
		}
		return allowed
	}
	if got := reviewsAllowed(); len(got) > 0 {
		t.Errorf("a dispatcher's ServiceAccount may create %v", got)
	}

	cfg := rest.CopyConfig(h.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + releaseNamespace + ":" + release + "-controller",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNamespace, "system:authenticated"}}
	asController, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	crbs := &rbacv1.ClusterRoleBindingList{}
	if err := h.c.List(ctx, crbs); err != nil {
		t.Fatal(err)
	}
	for i := range crbs.Items {
		b := crbs.Items[i].DeepCopy()
		b.Subjects = append(b.Subjects, dispatcher)
		err := asController.Update(ctx, b, client.DryRunAll)
		if !apierrors.IsForbidden(err) {
			t.Errorf("the controller adding a dispatcher to ClusterRoleBinding %s (role %s): %v, want forbidden", b.Name, b.RoleRef.Name, err)
		}
	}
}
