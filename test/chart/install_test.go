package chart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// releaseKinds are every kind the chart can create, listed after an uninstall to show that
// nothing of the release is left, whatever the values were.
var releaseKinds = []schema.GroupVersionKind{
	{Version: "v1", Kind: "Secret"},
	{Version: "v1", Kind: "ConfigMap"},
	{Version: "v1", Kind: "ServiceAccount"},
	{Version: "v1", Kind: "Service"},
	{Group: "apps", Version: "v1", Kind: "Deployment"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"},
	{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRoleBinding"},
	{Group: "networking.k8s.io", Version: "v1", Kind: "NetworkPolicy"},
	{Group: "policy", Version: "v1", Kind: "PodDisruptionBudget"},
	{Group: "monitoring.coreos.com", Version: "v1", Kind: "ServiceMonitor"},
	{Group: "monitoring.coreos.com", Version: "v1", Kind: "PodMonitor"},
	{Group: "monitoring.coreos.com", Version: "v1", Kind: "PrometheusRule"},
	{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"},
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingAdmissionPolicy"},
	{Group: "admissionregistration.k8s.io", Version: "v1", Kind: "ValidatingAdmissionPolicyBinding"},
	{Group: "flowcontrol.apiserver.k8s.io", Version: "v1", Kind: "FlowSchema"},
	{Group: "flowcontrol.apiserver.k8s.io", Version: "v1", Kind: "PriorityLevelConfiguration"},
	{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"},
}

var crdGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}

// projectCRDs are the CRDs the chart installs.
var projectCRDs = []string{"webhookendpoints.webhook-operator.io", "retrypolicies.webhook-operator.io", "webhookreplays.webhook-operator.io",
	"webhookquotas.webhook-operator.io", "webhookerasures.webhook-operator.io"}

// TestInstallUninstall installs the chart into a real kube-apiserver and etcd (every object
// must be accepted by the real API server's validation), then uninstalls it and lists every
// kind the chart creates to show that nothing of the release is left; the CRDs stay only
// with crds.keep.
func TestInstallUninstall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	cp, err := testenv.StartControlPlane()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(cp.Config, client.Options{Scheme: cp.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	h := &cluster{t: t, c: c, cfg: cp.Config, env: []string{"KUBECONFIG=" + kubeconfig}}

	// Stand-ins for the Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule
	// CRDs, so the ServiceMonitor, the dispatchers' PodMonitor and the alerts are installed
	// and removed too.
	for _, kind := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"} {
		crd := testenv.StandInCRD(schema.GroupVersionKind{Group: "monitoring.coreos.com", Version: "v1", Kind: kind}, nil)
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(crd)
		if err != nil {
			t.Fatal(err)
		}
		h.apply(&unstructured.Unstructured{Object: u})
		h.waitEstablished(crd.Name)
	}

	// testenv installed the project's CRDs at start; the first subtest deletes them.
	for _, name := range projectCRDs {
		h.waitEstablished(name)
	}

	// Every optional object on (ServiceMonitor, PodMonitor, PrometheusRule, the dashboard's
	// ConfigMap, NetworkPolicy, PDB, inline credentials, leader election Role), the CRDs managed outside the chart: testenv installed them.
	t.Run("crds managed elsewhere", func(t *testing.T) {
		h := h.with(t)
		// And without the admission policy, which NOTES warns of.
		h.installUninstall("wo-external-crds", nonDefaultValues+"\ncrds: {enabled: false}\nadmissionPolicy: {enabled: false}\n")
		for _, name := range projectCRDs {
			if !h.exists(crdGVK, "", name) {
				t.Errorf("CRD %s, not the release's, was removed", name)
			}
		}
	})

	// The chart installs the CRDs from here on: remove those testenv installed.
	for _, name := range projectCRDs {
		crd := &unstructured.Unstructured{}
		crd.SetGroupVersionKind(crdGVK)
		crd.SetName(name)
		if err := cp.Client.Delete(context.Background(), crd); err != nil {
			t.Fatal(err)
		}
		h.eventuallyGone(crdGVK, "", name)
	}

	t.Run("crds removed with the release", func(t *testing.T) {
		h := h.with(t)
		// nonDefaultValues has crds.keep=false, and the ingress with its API priority level:
		// the API server takes its FlowSchema and PriorityLevelConfiguration.
		h.installUninstall("wo-no-keep", nonDefaultValues, func() {
			for _, kind := range []string{"FlowSchema", "PriorityLevelConfiguration"} {
				if !h.exists(schema.GroupVersionKind{Group: "flowcontrol.apiserver.k8s.io", Version: "v1", Kind: kind}, "", "wo-no-keep-webhook-operator-ingress") {
					t.Errorf("the ingress's %s is not installed", kind)
				}
			}
		})
		for _, name := range projectCRDs {
			h.eventuallyGone(crdGVK, "", name)
		}
	})

	t.Run("crds kept", func(t *testing.T) {
		h := h.with(t)
		// Default values, and an endpoint that must survive the uninstall with its CRD.
		h.installUninstall("webhook-operator", "", func() {
			h.apply(mustDecode(t, "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}")[0])
			b, err := os.ReadFile(filepath.Join(testenv.Root(), "config", "samples", "webhook-operator_v1alpha1_webhookendpoint_orders.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			ep := mustDecode(t, string(b))[0]
			ep.SetNamespace("shop")
			h.apply(ep)
			h.dispatchersGetNoReviews("webhook-operator", "shop")
		})
		for _, name := range projectCRDs {
			if !h.exists(crdGVK, "", name) {
				t.Errorf("CRD %s removed though crds.keep is true", name)
			}
		}
		if !h.exists(schema.GroupVersionKind{Group: "webhook-operator.io", Version: "v1alpha1", Kind: "WebhookEndpoint"}, "shop", "orders") {
			t.Error("the endpoint did not survive the uninstall")
		}
	})
}

// cluster drives helm and reads the API server for one test.
type cluster struct {
	t   *testing.T
	c   client.WithWatch
	cfg *rest.Config
	env []string
}

func (h *cluster) with(t *testing.T) *cluster { return &cluster{t: t, c: h.c, cfg: h.cfg, env: h.env} }

// installUninstall installs release with values, checks every object of its manifest
// exists, runs whileInstalled, uninstalls and checks that nothing of the release remains
// apart from CRDs with the keep policy (which the caller checks).
func (h *cluster) installUninstall(release, values string, whileInstalled ...func()) {
	t := h.t
	t.Helper()
	args := []string{"install", release, chartDir(), "--namespace", releaseNamespace, "--create-namespace", "--timeout", "2m"}
	if values != "" {
		args = append(args, "--values", valuesFile(t, values))
	}
	out, err := helm(t, h.env, args...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"STATUS: deployed", "kubectl -n my-app get whe", "kubectl webhooks -n my-app status"} {
		if !strings.Contains(out, want) {
			t.Errorf("helm install output lacks %q:\n%s", want, out)
		}
	}
	if off, warned := strings.Contains(values, "admissionPolicy: {enabled: false}"), strings.Contains(out, "WARNING: admissionPolicy.enabled=false"); off != warned {
		t.Errorf("admission policy off: %v, NOTES warn of it: %v:\n%s", off, warned, out)
	}

	manifest, err := helm(t, h.env, "get", "manifest", release, "--namespace", releaseNamespace)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) < 8 {
		t.Fatalf("release %s has only %d objects: %v", release, len(objs), objs.kinds())
	}
	var kept []*unstructured.Unstructured
	for _, o := range objs {
		if !h.exists(o.GroupVersionKind(), o.GetNamespace(), o.GetName()) {
			t.Errorf("%s %s/%s of the release is not in the API server", o.GetKind(), o.GetNamespace(), o.GetName())
		}
		if o.GetAnnotations()["helm.sh/resource-policy"] == "keep" {
			kept = append(kept, o)
		}
		if o.GetKind() == "CustomResourceDefinition" {
			h.waitEstablished(o.GetName())
		}
	}
	t.Logf("release %s installed: %v", release, objs.kinds())
	for _, f := range whileInstalled {
		f()
	}

	out, err = helm(t, h.env, "uninstall", release, "--namespace", releaseNamespace, "--wait", "--timeout", "2m")
	if err != nil {
		h.describeLeft(objs)
		t.Fatal(err)
	}
	if len(kept) > 0 && !strings.Contains(out, "kept due to the resource policy") {
		t.Errorf("helm uninstall does not report the kept CRDs:\n%s", out)
	}

	// Every object of the manifest is gone, unless kept by policy.
	for _, o := range objs {
		if o.GetAnnotations()["helm.sh/resource-policy"] == "keep" {
			continue
		}
		h.eventuallyGone(o.GroupVersionKind(), o.GetNamespace(), o.GetName())
	}
	// And no object of any kind the chart can create carries the release's label.
	sel := client.MatchingLabels{"app.kubernetes.io/instance": release}
	for _, gvk := range releaseKinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := h.c.List(context.Background(), list, sel); err != nil {
			if meta.IsNoMatchError(err) {
				continue
			}
			t.Fatalf("listing %s: %v", gvk.Kind, err)
		}
		for _, o := range list.Items {
			t.Errorf("left after uninstall: %s %s/%s", gvk.Kind, o.GetNamespace(), o.GetName())
		}
	}
	// Nor helm's record of the release.
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "SecretList"})
	if err := h.c.List(context.Background(), list, client.InNamespace(releaseNamespace), client.MatchingLabels{"owner": "helm", "name": release}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("helm's release Secrets left: %d", len(list.Items))
	}
	if out, err := helm(t, h.env, "list", "--all", "--short", "--namespace", releaseNamespace); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("helm list after uninstall: %q %v", out, err)
	}
}

// describeLeft logs every object of the manifest still in the API server, with what holds
// it there (deletion time, finalizers, conditions), so that a failed uninstall says why.
func (h *cluster) describeLeft(objs rendered) {
	h.t.Helper()
	for _, o := range objs {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(o.GroupVersionKind())
		err := h.c.Get(context.Background(), client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetName()}, got)
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			continue
		}
		if err != nil {
			h.t.Logf("left: %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			continue
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		h.t.Logf("left: %s %s/%s deletionTimestamp=%v finalizers=%v conditions=%v",
			o.GetKind(), o.GetNamespace(), o.GetName(), got.GetDeletionTimestamp(), got.GetFinalizers(), conds)
	}
}

// exists reports whether the object is in the API server.
func (h *cluster) exists(gvk schema.GroupVersionKind, ns, name string) bool {
	h.t.Helper()
	o := &unstructured.Unstructured{}
	o.SetGroupVersionKind(gvk)
	err := h.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, o)
	if err != nil && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
		h.t.Fatalf("getting %s %s/%s: %v", gvk.Kind, ns, name, err)
	}
	return err == nil
}

// eventuallyGone waits (bounded) until the object is deleted: CRDs and objects with
// finalizers go asynchronously.
func (h *cluster) eventuallyGone(gvk schema.GroupVersionKind, ns, name string) {
	h.t.Helper()
	o := &unstructured.Unstructured{}
	o.SetGroupVersionKind(gvk)
	o.SetNamespace(ns)
	o.SetName(name)
	h.eventually(fmt.Sprintf("%s %s/%s to be deleted", gvk.Kind, ns, name), func() bool { return !h.exists(gvk, ns, name) }, func() { h.describeLeft(rendered{o}) })
}

// waitEstablished waits until the CRD is established and its watch cache is ready.
//
// The second half matters for a CRD deleted seconds after it was created, as these tests
// do: until the API server's watch cache for the new resource has initialised, its CRD
// finalizer's list of instances fails ("storage is (re)initializing") and is retried with
// exponential backoff, which on a loaded machine delayed the CRD's removal past helm's
// 2-minute uninstall wait. A watch is refused with 429 until that cache is ready, so an
// accepted watch is the signal. A CRD that has existed for more than a moment, as on a real
// cluster, is long past this.
func (h *cluster) waitEstablished(name string) {
	h.t.Helper()
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(crdGVK)
	h.eventually("CRD "+name+" to be established", func() bool {
		if err := h.c.Get(context.Background(), client.ObjectKey{Name: name}, crd); err != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == string(metav1.ConditionTrue) {
				return true
			}
		}
		return false
	})
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	version, _ := versions[0].(map[string]any)["name"].(string)
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Group: group, Version: version, Kind: kind + "List"})
	h.eventually("the watch cache of "+name+" to be ready", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		w, err := h.c.Watch(ctx, list)
		if err != nil {
			return false
		}
		w.Stop()
		return true
	})
}

// eventually polls cond for at most 30 seconds; on a timeout it runs onTimeout (to describe
// what is left) and fails the test.
func (h *cluster) eventually(what string, cond func() bool, onTimeout ...func()) {
	h.t.Helper()
	if testenv.Poll(30*time.Second, cond) == nil {
		return
	}
	for _, f := range onTimeout {
		f()
	}
	h.t.Fatalf("timed out waiting for %s", what)
}

// apply creates o.
func (h *cluster) apply(o *unstructured.Unstructured) {
	h.t.Helper()
	if err := h.c.Create(context.Background(), o); err != nil {
		h.t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

func mustDecode(t *testing.T, s string) rendered {
	t.Helper()
	objs, err := decodeManifests(s)
	if err != nil || len(objs) == 0 {
		t.Fatalf("decoding %q: %v", s, err)
	}
	return objs
}
