package console_test

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// readRules read endpoints, replays, deliveries and dead letters (with payloads).
var readRules = []rbacv1.PolicyRule{
	{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookendpoints", "webhookreplays", "webhookquotas"}, Verbs: []string{"get", "list"}},
	{APIGroups: []string{datav1alpha1.GroupName}, Resources: []string{datav1alpha1.ResourceDeliveries, datav1alpha1.ResourceDeadLetters,
		datav1alpha1.ResourceDeliveries + "/payload", datav1alpha1.ResourceDeadLetters + "/payload"}, Verbs: []string{"get", "list"}},
}

func with(rules []rbacv1.PolicyRule, more ...rbacv1.PolicyRule) []rbacv1.PolicyRule {
	return append(slices.Clone(rules), more...)
}

// endpoint creates a WebhookEndpoint of ns receiving order.* (no controller runs: it only
// has to exist).
func (s *stack) endpoint(t *testing.T, ns, name string) *v1alpha1.WebhookEndpoint {
	t.Helper()
	ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.WebhookEndpointSpec{URL: "https://" + name + ".example.com/hooks", EventTypes: []v1alpha1.EventTypePattern{"order.*"}}}
	must(t, s.cp.Client.Create(s.ctx, ep))
	return ep
}

// Several dead letters are replayed in one action: the ones ticked (one WebhookReplay per
// endpoint, naming their delivery ids) or every one a filter selects (one WebhookReplay with
// the filter's reason and time range), created as the signed-in user; a viewer without
// create on webhookreplays finds the buttons disabled with RBAC's reason and is refused.
func TestReplayManyDeadLetters(t *testing.T) {
	s := consoleStack(t)
	const ns = "bulk"
	s.tenant(t, ns)
	s.endpoint(t, ns, "orders")
	s.endpoint(t, ns, "crm")
	st := s.stored(t, ns)
	now := time.Now().UTC()
	dead := func(ep, id, reason string, ago time.Duration) string {
		seq := st.Event("order.created", id, `{"id":"`+id+`"}`, nil)
		m := st.Delivery(ep, id, seq, now.Add(-ago-time.Minute))
		st.DeadLetter(m, 2, reason, `{"id":"`+id+`"}`, now.Add(-ago), nil)
		return m.DeliveryID
	}
	o1 := dead("orders", "evt_o1", records.ReasonExhausted, 3*time.Hour)
	o2 := dead("orders", "evt_o2", records.ReasonExhausted, 10*time.Minute)
	o3 := dead("orders", "evt_o3", records.ReasonEndpointDisabled, 5*time.Minute)
	c1 := dead("crm", "evt_c1", records.ReasonExhausted, 5*time.Minute)

	operator := signIn(t, s.url, s.token(t, ns, "operator", with(readRules,
		rbacv1.PolicyRule{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"webhookreplays"}, Verbs: []string{"create"}})...))
	viewer := signIn(t, s.url, s.token(t, ns, "viewer", readRules...))

	// The page lists them with a box each, and filters by reason and time.
	code, page := operator.get("/ns/" + ns + "/deadletters")
	if code != http.StatusOK || strings.Count(page, `name="select"`) != 4 || !strings.Contains(page, `value="orders/`+o1+`"`) {
		t.Fatalf("the dead letters page (%d) has %d boxes: %s", code, strings.Count(page, `name="select"`), element(page, "deadletters"))
	}
	if _, page := operator.get("/ns/" + ns + "/deadletters?reason=endpoint_disabled"); !strings.Contains(page, o3) || strings.Contains(page, o2) {
		t.Errorf("filtered by reason: %s", element(page, "deadletters"))
	}
	if _, page := operator.get("/ns/" + ns + "/deadletters?endpoint=orders&since=1h"); !strings.Contains(page, o2) || strings.Contains(page, o1) || strings.Contains(page, c1) {
		t.Errorf("filtered by endpoint and since 1h: %s", element(page, "deadletters"))
	}
	if code, page := operator.get("/ns/" + ns + "/deadletters?since=yesterday"); code != http.StatusBadRequest || !strings.Contains(element(page, "flash"), "is not a time") {
		t.Errorf("a bad time: %d %q", code, element(page, "flash"))
	}

	// One dead letter, inspected: why, its attempts, the event and the last response; the
	// payload only with its own grant.
	code, page = operator.get("/ns/" + ns + "/deadletters/" + o1)
	if sum := element(page, "deadletter-summary"); code != http.StatusOK || !strings.Contains(sum, "exhausted: gave up after 2 attempts") ||
		strings.Count(element(page, "attempts"), "status_code") != 2 || !strings.Contains(element(page, "attempts"), "20.0 ms") || element(page, "event") != `{ "id": "evt_o1" }` ||
		!strings.Contains(element(page, "response"), "down for maintenance") || !strings.Contains(element(page, "purge-why"), "delete webhookdeadletters") {
		t.Errorf("the dead letter's page (%d): %q, attempts %q, event %q, response %q", code, sum, element(page, "attempts"), element(page, "event"), element(page, "response"))
	}
	noPayload := signIn(t, s.url, s.token(t, ns, "nopayload",
		rbacv1.PolicyRule{APIGroups: []string{datav1alpha1.GroupName}, Resources: []string{datav1alpha1.ResourceDeadLetters}, Verbs: []string{"get", "list"}}))
	if _, page := noPayload.get("/ns/" + ns + "/deadletters/" + o1); !strings.Contains(element(page, "payload-note"), "forbidden") || strings.Contains(page, `id="event"`) {
		t.Errorf("without the payload's grant: %q", element(page, "payload-note"))
	}

	// Ticked ones: one WebhookReplay per endpoint.
	code, page = operator.post("/ns/"+ns+"/deadletters/replay-many", url.Values{"mode": {"selected"},
		"select": {"orders/" + o1, "crm/" + c1, "orders/" + o2, "orders/" + o2}})
	if code != http.StatusOK || !strings.Contains(element(page, "flash"), "Created 2 WebhookReplays") {
		t.Fatalf("replaying the selected ones: %d %q", code, element(page, "flash"))
	}
	replays := func() map[string]v1alpha1.WebhookReplaySpec {
		var l v1alpha1.WebhookReplayList
		must(t, s.cp.Client.List(s.ctx, &l, client.InNamespace(ns)))
		out := map[string]v1alpha1.WebhookReplaySpec{}
		for _, r := range l.Items {
			out[r.Name] = r.Spec
		}
		return out
	}
	got := replays()
	if len(got) != 2 {
		t.Fatalf("%d replays made, want 2: %+v", len(got), got)
	}
	for name, spec := range got {
		if !strings.Contains(element(page, "created"), name) {
			t.Errorf("the page does not link replay %s: %q", name, element(page, "created"))
		}
		switch spec.EndpointRef.Name {
		case "orders":
			if !slices.Equal(spec.DeliveryIDs, []string{o1, o2}) || spec.Source != v1alpha1.ReplayDeadLetters {
				t.Errorf("orders' replay: %+v", spec)
			}
		case "crm":
			if !slices.Equal(spec.DeliveryIDs, []string{c1}) {
				t.Errorf("crm's replay: %+v", spec)
			}
		default:
			t.Errorf("a replay of %s", spec.EndpointRef.Name)
		}
	}

	// A filter: one WebhookReplay of the endpoint, with its reason and time range; the page
	// goes to it.
	code, page = operator.post("/ns/"+ns+"/deadletters/replay-many", url.Values{"mode": {"filter"}, "endpoint": {"orders"},
		"reason": {"exhausted"}, "since": {"1h"}})
	if code != http.StatusOK || !strings.Contains(page, `id="replay-state"`) {
		t.Fatalf("replaying by filter: %d %s", code, element(page, "flash"))
	}
	// No controller runs here: the replay stays in progress, and its page follows it by
	// reloading itself (no script).
	if !strings.Contains(page, `<meta http-equiv="refresh" content="3">`) || !strings.HasPrefix(element(page, "replay-state"), "In progress") {
		t.Errorf("the replay page in progress: %q", element(page, "replay-state"))
	}
	got = replays()
	if len(got) != 3 {
		t.Fatalf("%d replays, want 3", len(got))
	}
	var byFilter *v1alpha1.WebhookReplaySpec
	for _, spec := range got {
		if len(spec.DeliveryIDs) == 0 {
			byFilter = &spec
		}
	}
	if byFilter == nil || byFilter.EndpointRef.Name != "orders" || !slices.Equal(byFilter.Reasons, []v1alpha1.DeadLetterReason{"exhausted"}) ||
		byFilter.Since == nil || byFilter.Since.Time.Before(now.Add(-time.Hour-time.Minute)) || byFilter.Since.Time.After(time.Now().Add(-time.Hour+time.Minute)) || byFilter.Until != nil {
		t.Errorf("the replay by filter: %+v", byFilter)
	}

	// Bounds and mistakes are refused with a reason, and nothing is made.
	for _, c := range []struct {
		name string
		form url.Values
		want string
	}{
		{"no endpoint", url.Values{"mode": {"filter"}, "reason": {"exhausted"}}, "choose an endpoint"},
		{"nothing ticked", url.Values{"mode": {"selected"}}, "no dead letter selected"},
		{"too many", url.Values{"mode": {"selected"}, "select": slices.Repeat([]string{"orders/" + o1}, 501)}, "at most 500"},
		{"not a selection", url.Values{"mode": {"selected"}, "select": {o1}}, "not endpoint/delivery id"},
		{"a bad reason", url.Values{"mode": {"filter"}, "endpoint": {"orders"}, "reason": {"bored"}}, "is not one of"},
		{"until before since", url.Values{"mode": {"filter"}, "endpoint": {"orders"}, "since": {"1h"}, "until": {"2h"}}, "until must be later than since"},
	} {
		code, page := operator.post("/ns/"+ns+"/deadletters/replay-many", c.form)
		if code != http.StatusBadRequest || !strings.Contains(element(page, "flash"), c.want) {
			t.Errorf("%s: %d %q, want 400 saying %q", c.name, code, element(page, "flash"), c.want)
		}
	}
	if n := len(replays()); n != 3 {
		t.Errorf("%d replays after refused forms, want 3", n)
	}

	// The viewer: disabled, with why; refused by the API server anyway.
	_, page = viewer.get("/ns/" + ns + "/deadletters?endpoint=orders")
	why := element(page, "replay-why")
	if !strings.Contains(why, "RBAC does not allow you to create webhookreplays.webhook-operator.io in namespace bulk") ||
		!strings.Contains(page, `id="replay-selected" disabled`) || !strings.Contains(page, `id="replay-filter" disabled`) {
		t.Errorf("the viewer's buttons: why %q", why)
	}
	code, page = viewer.post("/ns/"+ns+"/deadletters/replay-many", url.Values{"mode": {"selected"}, "select": {"orders/" + o1}})
	if code != http.StatusForbidden || !strings.Contains(element(page, "flash"), "Replay refused") || !strings.Contains(element(page, "flash"), "forbidden") {
		t.Errorf("the viewer replaying: %d %q", code, element(page, "flash"))
	}
	// A form without the session's anti-forgery token is refused.
	code, page = operator.post("/ns/"+ns+"/deadletters/replay-many", url.Values{"csrf": {"forged"}, "mode": {"selected"}, "select": {"orders/" + o1}})
	if code != http.StatusForbidden || !strings.Contains(element(page, "error"), "anti-forgery token") {
		t.Errorf("a forged form: %d %q", code, element(page, "error"))
	}
	if n := len(replays()); n != 3 {
		t.Errorf("%d replays after refused forms, want 3", n)
	}
}
