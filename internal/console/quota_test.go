package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// The quota page shows the namespace's WebhookQuota, its limits and its usage, read-only
// (there is no form on it); without one it says the installation's defaults apply, and a
// user who may not read quotas is told so by RBAC's words.
func TestQuotaPageShowsLimitsAndUsage(t *testing.T) {
	s := consoleStack(t)
	const ns = "quotas"
	s.tenant(t, ns)
	viewer := signIn(t, s.url, s.token(t, ns, "viewer", readRules...))

	// A fresh API server answers 503 "storage is (re)initializing" for a while after the
	// CRD is established; the page says so (the console does not wait for it).
	var code int
	var page string
	testenv.Eventually(t, time.Minute, func() bool {
		code, page = viewer.get("/ns/" + ns + "/quota")
		return code != http.StatusBadGateway || !strings.Contains(element(page, "error"), "initializing")
	}, "the API server did not serve WebhookQuotas")
	if code != http.StatusOK || !strings.Contains(element(page, "quota-note"), "No WebhookQuota in this namespace") {
		t.Errorf("without a quota (%d): %q %q", code, element(page, "quota-note"), element(page, "error"))
	}

	q := &v1alpha1.WebhookQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.QuotaName},
		Spec: v1alpha1.WebhookQuotaSpec{MaxEndpoints: ptr.To[int32](7)}}
	must(t, s.cp.Client.Create(s.ctx, q))
	q.Status.Endpoints = &v1alpha1.QuotaCount{Limit: ptr.To[int64](7), Used: 3}
	must(t, s.cp.Client.Status().Update(s.ctx, q))

	code, page = viewer.get("/ns/" + ns + "/quota")
	limits, usage := element(page, "limits-"+q.Name), element(page, "usage-"+q.Name)
	if code != http.StatusOK || !strings.Contains(limits, `"maxEndpoints": 7`) || !strings.Contains(usage, `"used": 3`) {
		t.Errorf("the quota page (%d): limits %q, usage %q", code, limits, usage)
	}
	if section := element(page, "quota-"+q.Name); strings.Contains(section, "<form") || strings.Contains(page, `action="/ns/`+ns+`/quota`) {
		t.Errorf("the quota page offers a change: %s", section)
	}

	blind := signIn(t, s.url, s.token(t, ns, "blind", readRules[1]))
	code, page = blind.get("/ns/" + ns + "/quota")
	if note := element(page, "quota-note"); code != http.StatusOK || !strings.Contains(note, "The quotas are not shown") || !strings.Contains(note, "forbidden") {
		t.Errorf("without the grant to read quotas (%d): %q", code, note)
	}
}

// Purging a dead letter from its page deletes it through the Data API as the signed-in user:
// the page says so, the dead letter is gone from the list and from the API, the other one
// stays; a user RBAC does not allow is refused with its reason and nothing is deleted.
func TestPurgeDeletesTheDeadLetter(t *testing.T) {
	s := consoleStack(t)
	const ns = "purging"
	s.tenant(t, ns)
	s.endpoint(t, ns, "orders")
	st := s.stored(t, ns)
	now := time.Now().UTC()
	dead := func(id string) string {
		seq := st.Event("order.created", id, `{"id":"`+id+`"}`, nil)
		m := st.Delivery("orders", id, seq, now.Add(-time.Minute))
		st.DeadLetter(m, 2, records.ReasonExhausted, `{"id":"`+id+`"}`, now, nil)
		return m.DeliveryID
	}
	gone, kept := dead("evt_gone"), dead("evt_kept")

	viewer := signIn(t, s.url, s.token(t, ns, "viewer", readRules...))
	viewer.get("/ns/" + ns + "/deadletters/" + gone)
	if code, page := viewer.post("/ns/"+ns+"/deadletters/purge", url.Values{"id": {gone}}); code != http.StatusForbidden || !strings.Contains(element(page, "flash"), "Purge refused") {
		t.Errorf("a viewer's purge: %d %q", code, element(page, "flash"))
	}

	purger := signIn(t, s.url, s.token(t, ns, "purger", with(readRules,
		rbacv1.PolicyRule{APIGroups: []string{datav1alpha1.GroupName}, Resources: []string{datav1alpha1.ResourceDeadLetters}, Verbs: []string{"delete"}})...))
	code, page := purger.get("/ns/" + ns + "/deadletters/" + gone)
	if code != http.StatusOK || element(page, "purge-why") != "" || !strings.Contains(page, `id="purge"`) {
		t.Fatalf("the purger's dead letter page (%d): purge button %q", code, element(page, "purge-why"))
	}
	code, page = purger.post("/ns/"+ns+"/deadletters/purge", url.Values{"id": {gone}})
	if code != http.StatusOK || !strings.Contains(element(page, "flash"), "Purged dead letter "+gone) {
		t.Fatalf("purging: %d %q", code, element(page, "flash"))
	}
	if strings.Contains(element(page, "deadletters"), gone) || !strings.Contains(element(page, "deadletters"), kept) {
		t.Errorf("after the purge the list is %q, want %s only", element(page, "deadletters"), kept)
	}
	if code, _ := purger.get("/ns/" + ns + "/deadletters/" + gone); code != http.StatusNotFound {
		t.Errorf("the purged dead letter's page answers %d, want 404", code)
	}
	if code, _ := purger.get("/ns/" + ns + "/deadletters/" + kept); code != http.StatusOK {
		t.Errorf("the other dead letter's page answers %d", code)
	}
}
