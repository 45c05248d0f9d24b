package controllers_test

import (
	"context"
	"os"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lua "github.com/yuin/gopher-lua"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// GitOps tools judge custom resources with kstatus (sigs.k8s.io/cli-utils): Flux's health
// checks and `wait: true`, Argo CD through a health check reading the same conditions. What
// the controller writes must read as Current once wired, InProgress while it waits for
// something that will come (a Secret, the dispatcher, a new generation), and Failed when the
// spec is refused, so that a sync waits for the right thing and fails for the right reason.
func TestGitOpsToolsReadTheStatusWithKstatus(t *testing.T) {
	ns := newNamespace(t)
	create(t, endpoint(ns, "wired"))
	create(t, endpoint(ns, "waiting", func(ep *v1alpha1.WebhookEndpoint) {
		ep.Spec.Signing = &v1alpha1.SigningSpec{SecretRef: v1alpha1.SecretKeySelector{Name: "not-yet", Key: "secret"}}
	}))
	create(t, endpoint(ns, "refused", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.URL = "https://169.254.169.254/latest" }))
	create(t, &v1alpha1.RetryPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "policy"},
		Spec: v1alpha1.RetryPolicySpec{MaxAttempts: ptr(int32(5))}})

	// Before the dispatcher is available, the wired endpoint is still in progress.
	eventuallyReady(t, ns, "wired", "False/"+v1alpha1.ReasonDispatcherUnavailable)
	expectHealth(t, ns, "wired", &v1alpha1.WebhookEndpoint{}, status.InProgressStatus, "Progressing")
	markAvailable(t, ns, "webhook-dispatcher")

	eventuallyReady(t, ns, "wired", "True/Ready")
	expectHealth(t, ns, "wired", &v1alpha1.WebhookEndpoint{}, status.CurrentStatus, "Healthy")
	eventuallyReady(t, ns, "waiting", "False/"+v1alpha1.ReasonSigningSecretNotFound)
	expectHealth(t, ns, "waiting", &v1alpha1.WebhookEndpoint{}, status.InProgressStatus, "Progressing")
	eventuallyReady(t, ns, "refused", "False/"+v1alpha1.ReasonInvalidURL)
	expectHealth(t, ns, "refused", &v1alpha1.WebhookEndpoint{}, status.FailedStatus, "Degraded")
	expectHealth(t, ns, "policy", &v1alpha1.RetryPolicy{}, status.CurrentStatus, "Healthy")

	// What was waited for arrives: Current, with no change to the endpoint.
	create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "not-yet", Annotations: map[string]string{consent.AllowedEndpoints: "waiting"}},
		StringData: map[string]string{"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}})
	eventuallyReady(t, ns, "waiting", "True/Ready")
	expectHealth(t, ns, "waiting", &v1alpha1.WebhookEndpoint{}, status.CurrentStatus, "Healthy")

	// The refused spec fixed: no longer Failed, and Current once wired.
	updateEndpoint(t, ns, "refused", func(ep *v1alpha1.WebhookEndpoint) { ep.Spec.URL = "https://receiver.example.com/fixed" })
	eventuallyReady(t, ns, "refused", "True/Ready")
	expectHealth(t, ns, "refused", &v1alpha1.WebhookEndpoint{}, status.CurrentStatus, "Healthy")

	// The dispatcher auto-disables an endpoint (its own field manager, its own condition): it is
	// still wired (kstatus Current, Ready means wired), and Argo CD's check shows Degraded,
	// since only a person can re-enable it.
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("WebhookEndpoint"))
	u.SetNamespace(ns)
	u.SetName("wired")
	NewWithT(t).Expect(unstructured.SetNestedSlice(u.Object, []any{map[string]any{
		"type": v1alpha1.ConditionDisabled, "status": "True", "reason": "ConsecutiveFailures",
		"message": "10 consecutive failed attempts", "lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
	}}, "status", "conditions")).To(Succeed())
	NewWithT(t).Expect(k8s.Status().Apply(context.Background(), client.ApplyConfigurationFromUnstructured(u),
		client.FieldOwner(dispatcher.FieldManager), client.ForceOwnership)).To(Succeed())
	expectHealth(t, ns, "wired", &v1alpha1.WebhookEndpoint{}, status.CurrentStatus, "Degraded")
	ep := eventuallyReady(t, ns, "wired", "True/Ready")
	NewWithT(t).Expect(meta.IsStatusConditionTrue(ep.Status.Conditions, v1alpha1.ConditionDisabled)).To(BeTrue(),
		"the controller keeps the dispatcher's condition")
}

// What GitOps tools read while a replay runs, waits for its endpoint, and completes with
// failures: kstatus InProgress and Failed, Argo CD Progressing and Degraded; the reason
// names what is wrong.
func TestWebhookReplayKstatusAndArgoCD(t *testing.T) {
	w := newReplayWorld(t, "crm")
	w.deadLetters("crm", 4, records.ReasonExhausted)

	create(t, w.replay("slow", func(wr *v1alpha1.WebhookReplay) { wr.Spec.RatePerSecond = ptr(int32(1)) }))
	expectHealth(t, w.ns, "slow", &v1alpha1.WebhookReplay{}, status.InProgressStatus, "Progressing")
	expectHealth(t, w.ns, "slow", &v1alpha1.WebhookReplay{}, status.CurrentStatus, "Healthy")

	create(t, w.replay("early", func(wr *v1alpha1.WebhookReplay) { wr.Spec.EndpointRef.Name = "not-yet" }))
	eventuallyComplete(t, w.ns, "early", "False/"+v1alpha1.ReasonEndpointNotFound)
	expectHealth(t, w.ns, "early", &v1alpha1.WebhookReplay{}, status.InProgressStatus, "Progressing")

	ghost := records.DeliveryID("ghost", w.ns, "crm")
	create(t, w.replay("ghost", func(wr *v1alpha1.WebhookReplay) { wr.Spec.DeliveryIDs = []string{ghost} }))
	wr := eventuallyComplete(t, w.ns, "ghost", "True/"+v1alpha1.ReasonDeliveriesFailed)
	g := NewWithT(t)
	g.Expect(conditionOf(wr, v1alpha1.ConditionReady)).To(Equal("False/" + v1alpha1.ReasonDeliveriesFailed))
	g.Expect(wr.Status.Problems).To(HaveLen(1))
	g.Expect(wr.Status.Problems[0].DeliveryID).To(Equal(ghost))
	g.Expect(wr.Status.Problems[0].Message).To(ContainSubstring("not found"))
	expectHealth(t, w.ns, "ghost", &v1alpha1.WebhookReplay{}, status.FailedStatus, "Degraded")

	// The endpoint appears: the waiting replay starts without being touched.
	create(t, endpoint(w.ns, "not-yet"))
	eventuallyComplete(t, w.ns, "early", "True/"+v1alpha1.ReasonReplayed)
}

// expectHealth waits until kstatus computes want for the object, and Argo CD's health check
// (config/gitops/argocd-health.lua, run by the Lua interpreter Argo CD embeds) says argo, as
// GitOps tools polling it would.
func expectHealth(t *testing.T, ns, name string, obj client.Object, want status.Status, argo string) {
	t.Helper()
	script, err := os.ReadFile("../config/gitops/argocd-health.lua")
	if err != nil {
		t.Fatal(err)
	}
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		g.Expect(k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, obj)).To(Succeed())
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		g.Expect(err).NotTo(HaveOccurred())
		u := &unstructured.Unstructured{Object: m}
		gvk, err := k8s.GroupVersionKindFor(obj)
		g.Expect(err).NotTo(HaveOccurred())
		u.SetGroupVersionKind(gvk)
		res, err := status.Compute(u)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(res.Status).To(Equal(want), "kstatus of %s/%s: %s (%s)", ns, name, res.Status, res.Message)
		hs, msg := argoHealth(g, string(script), u.Object)
		g.Expect(hs).To(Equal(argo), "Argo CD health of %s/%s: %s (%s)", ns, name, hs, msg)
	}).WithTimeout(timeout).WithPolling(interval).Should(Succeed())
}

// argoHealth runs an Argo CD health script on obj as Argo CD does: obj is a global table, the
// script returns {status, message}.
func argoHealth(g Gomega, script string, obj map[string]any) (string, string) {
	L := lua.NewState(lua.Options{SkipOpenLibs: false})
	defer L.Close()
	L.SetGlobal("obj", toLua(L, obj))
	g.Expect(L.DoString(script)).To(Succeed())
	hs, ok := L.Get(-1).(*lua.LTable)
	g.Expect(ok).To(BeTrue(), "the script returns a table")
	return hs.RawGetString("status").String(), hs.RawGetString("message").String()
}

func toLua(L *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		t := L.NewTable()
		for k, x := range v {
			t.RawSetString(k, toLua(L, x))
		}
		return t
	case []any:
		t := L.NewTable()
		for _, x := range v {
			t.Append(toLua(L, x))
		}
		return t
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	default:
		return lua.LNil
	}
}
