package plugin_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// userWith writes a kubeconfig of a user of the control plane whom a Role of the test's
// namespace allows rules (none: a user with no grant there), and returns its path.
func (e *env) userWith(name string, rules ...rbacv1.PolicyRule) string {
	e.t.Helper()
	ctx := context.Background()
	if len(rules) > 0 {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name}, Rules: rules}
		binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}}}
		for _, o := range []client.Object{role, binding} {
			if err := cp.Client.Create(ctx, o); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	path, err := cp.Kubeconfig(e.t.TempDir(), name)
	if err != nil {
		e.t.Fatal(err)
	}
	return path
}

// runAs runs the plugin as the user of kubeconfig path in the test's namespace, with no NATS
// flag and an empty environment: what it does, it does through the Kubernetes API.
func (e *env) runAs(path string, args ...string) result {
	e.t.Helper()
	return runWithKubeconfig(path, append([]string{"-n", e.ns}, args...)...)
}

// The reading commands read through the data API with the user's own RBAC, and open no NATS
// connection: log, dlq list and show, dlq purge and status work for a user with no NATS
// configuration at all; a user RBAC does not allow is refused with what to grant; payloads
// need a grant of their own.
func TestReadingGoesThroughTheDataAPIWithTheUsersRBAC(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	at := time.Now().Add(-time.Minute).UTC()
	m := e.delivery("orders", 1, at)
	e.writeAttempt(e.ns, records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, Namespace: e.ns, Endpoint: "orders",
		State: records.StateSucceeded, Attempt: 1, Time: at, LatencyUS: 1500, Response: records.Response{StatusCode: 204}})
	dead := e.delivery("orders", 2, at)
	e.writeDeadLetter(dead, 2, records.ReasonExhausted, `{"order":2}`, at)

	endpoints := rbacv1.PolicyRule{APIGroups: []string{v1alpha1Group}, Resources: []string{"webhookendpoints"}, Verbs: []string{"get", "list"}}
	read := rbacv1.PolicyRule{APIGroups: []string{datav1alpha1.GroupName}, Resources: []string{datav1alpha1.ResourceDeliveries, datav1alpha1.ResourceDeadLetters},
		Verbs: []string{"get", "list"}}
	viewer := e.userWith("viewer", endpoints, read)
	editor := e.userWith("editor", endpoints, read, rbacv1.PolicyRule{APIGroups: []string{datav1alpha1.GroupName},
		Resources: []string{datav1alpha1.ResourceDeadLetters + "/" + datav1alpha1.SubresourcePayload, datav1alpha1.ResourceDeadLetters},
		Verbs:     []string{"get", "delete", "deletecollection"}})
	nobody := e.userWith("nobody", endpoints)

	var log plugin.Page[plugin.LogEntry]
	e.runAs(viewer, "log", "orders", "-o", "json").must(t, plugin.ExitOK).decode(t, &log)
	if len(log.Data) != 1 || log.Data[0].ID != m.DeliveryID || log.Data[0].Status != records.StateSucceeded || log.Data[0].LastResponse.StatusCode != 204 ||
		*log.Data[0].LatencyUS != 1500 {
		t.Errorf("the viewer's log: %+v", log.Data)
	}
	var dls plugin.Page[plugin.DeadLetterItem]
	e.runAs(viewer, "dlq", "list", "orders", "-o", "json").must(t, plugin.ExitOK).decode(t, &dls)
	if len(dls.Data) != 1 || dls.Data[0].DeliveryID != dead.DeliveryID || len(dls.Data[0].Attempts) != 2 {
		t.Errorf("the viewer's dead letters: %+v", dls.Data)
	}
	// A viewer sees a dead letter without its payload, and is told what would show it.
	r := e.runAs(viewer, "dlq", "show", dead.DeliveryID).must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "Attempts (2):") || !strings.Contains(r.out, "not shown") || strings.Contains(r.out, `"order"`) ||
		!strings.Contains(r.errOut, "webhookdeadletters/payload") {
		t.Errorf("the viewer's dlq show:\n%s", r)
	}
	r = e.runAs(editor, "dlq", "show", dead.DeliveryID).must(t, plugin.ExitOK)
	if !strings.Contains(r.out, `"order": 2`) || !strings.Contains(r.out, "X-Tenant: acme") {
		t.Errorf("the editor's dlq show:\n%s", r)
	}
	// A viewer may not purge; the editor may.
	r = e.runAs(viewer, "dlq", "purge", "orders", "--all").must(t, plugin.ExitRefused)
	if !strings.Contains(r.errOut, "deletecollection on webhookdeadletters") || !strings.Contains(r.errOut, "webhook-operator-editor") {
		t.Errorf("the viewer's purge: %s", r)
	}
	var res plugin.PurgeResult
	e.runAs(editor, "dlq", "purge", "orders", "--all", "-o", "json").must(t, plugin.ExitOK).decode(t, &res)
	if res.Purged != 1 || res.Event == "" {
		t.Errorf("the editor's purge: %+v", res)
	}
	// Someone RBAC gives nothing of the data API is refused, with what to grant.
	for _, args := range [][]string{{"log", "orders"}, {"dlq", "list"}, {"dlq", "show", dead.DeliveryID}} {
		r := e.runAs(nobody, args...).must(t, plugin.ExitRefused)
		if !strings.Contains(r.errOut, "forbidden") || !strings.Contains(r.errOut, "Kubernetes RBAC must allow get/list on webhook") {
			t.Errorf("%v as nobody: %s", args, r)
		}
	}
}

// v1alpha1Group is the API group of WebhookEndpoints.
const v1alpha1Group = "webhook-operator.io"

// When the data API's server cannot be reached, the reading commands say which APIService to
// look at and how, and work again once it is back.
func TestReadingWhileTheAPIServiceIsUnavailableSaysWhatToCheck(t *testing.T) {
	e := newEnv(t)
	e.createEndpoint("orders")
	ctx := context.Background()
	key := client.ObjectKey{Namespace: testenv.APIServiceNamespace, Name: dataAPIService}
	var svc corev1.Service
	if err := cp.Client.Get(ctx, key, &svc); err != nil {
		t.Fatal(err)
	}
	// The aggregator reaches the server through this Service: without it, the APIService is
	// unavailable.
	if err := cp.Client.Delete(ctx, &svc); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		back := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name}, Spec: svc.Spec}
		back.Spec.ClusterIP, back.Spec.ClusterIPs = "", nil
		if err := cp.Client.Create(ctx, back); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, func() error { return apiServiceAvailable(ctx) }, "the APIService is not available again")
	}
	t.Cleanup(restore)

	for _, args := range [][]string{{"log", "orders"}, {"dlq", "list"}} {
		var r result
		testenv.Eventually(t, 60*time.Second, func() bool {
			r = e.run(args...)
			return r.code == plugin.ExitError
		}, "%v still answers while the Service is gone: %s", args, r)
		for _, s := range []string{"APIService " + plugin.APIServiceName, "kubectl get apiservice " + plugin.APIServiceName} {
			if !strings.Contains(r.errOut, s) {
				t.Errorf("%v: the error lacks %q: %s", args, s, r)
			}
		}
	}
	restore()
	e.run("log", "orders").must(t, plugin.ExitOK)
}

// apiServiceAvailable says whether the data API's APIService is Available.
func apiServiceAvailable(ctx context.Context) error {
	as := &unstructured.Unstructured{}
	as.SetAPIVersion("apiregistration.k8s.io/v1")
	as.SetKind("APIService")
	if err := cp.Client.Get(ctx, client.ObjectKey{Name: plugin.APIServiceName}, as); err != nil {
		return err
	}
	conds, _, _ := unstructured.NestedSlice(as.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Available" && m["status"] == "True" {
			return nil
		}
	}
	return fmt.Errorf("APIService %s is not available: %v", plugin.APIServiceName, conds)
}
