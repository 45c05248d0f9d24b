package plugin_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

func TestPublishLandsOnTheNamespaceSubjectWithItsIDAndDeduplicates(t *testing.T) {
	e := newEnv(t)
	var res plugin.PublishResult
	e.run("publish", "order.created", "--data", `{"id":"ord_1"}`, "--id", "evt_1", "-H", "X-Tenant=acme", "-o", "json").
		must(t, plugin.ExitOK).decode(t, &res)
	wantSubject := "webhooks." + e.ns + ".order.created"
	if res.EventID != "evt_1" || res.Subject != wantSubject || res.Stream != "WEBHOOKS_"+e.ns || res.Sequence == 0 || res.Duplicate {
		t.Fatalf("unexpected result %+v", res)
	}
	msgs := e.subjectMsgs("WEBHOOKS_"+e.ns, wantSubject)
	if len(msgs) != 1 {
		t.Fatalf("want 1 event on %s, got %d", wantSubject, len(msgs))
	}
	m := msgs[0]
	if m.Header.Get(records.HeaderMsgID) != "evt_1" || string(m.Data) != `{"id":"ord_1"}` ||
		m.Header.Get("X-Tenant") != "acme" || m.Header.Get(records.HeaderContentType) != "application/json" {
		t.Errorf("stored event %v %q", m.Header, m.Data)
	}

	// The same id again: JetStream keeps one event and the plugin says so.
	var dup plugin.PublishResult
	e.run("publish", "order.created", "--data", `{"id":"ord_1"}`, "--id", "evt_1", "-o", "json").must(t, plugin.ExitOK).decode(t, &dup)
	if !dup.Duplicate || dup.Sequence != res.Sequence {
		t.Errorf("republishing evt_1: %+v", dup)
	}
	r := e.run("publish", "order.created", "--data", `{"id":"ord_1"}`, "--id", "evt_1").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "already published") {
		t.Errorf("table output does not say duplicate:\n%s", r)
	}
	if n := len(e.subjectMsgs("WEBHOOKS_"+e.ns, wantSubject)); n != 1 {
		t.Errorf("%d events stored after duplicates", n)
	}

	// From a file and from standard input; without --id an evt_ id is generated.
	file := filepath.Join(t.TempDir(), "order.json")
	if err := os.WriteFile(file, []byte(`{"id":"ord_2"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var fromFile plugin.PublishResult
	e.run("publish", "order.updated", "--data", "@"+file, "-o", "yaml").must(t, plugin.ExitOK)
	e.run("publish", "order.updated", "--data", "@"+file, "-o", "json").must(t, plugin.ExitOK).decode(t, &fromFile)
	if !strings.HasPrefix(fromFile.EventID, "evt_") || fromFile.Duplicate {
		t.Errorf("generated id: %+v", fromFile)
	}
	r = e.runIn(`{"id":"ord_3"}`, "publish", "order.deleted", "--data", "-").must(t, plugin.ExitOK)
	if !strings.Contains(r.out, "published event evt_") || !strings.Contains(r.out, "webhooks."+e.ns+".order.deleted") {
		t.Errorf("table output:\n%s", r)
	}
	if got := e.subjectMsgs("WEBHOOKS_"+e.ns, "webhooks."+e.ns+".order.deleted"); len(got) != 1 || string(got[0].Data) != `{"id":"ord_3"}` {
		t.Errorf("stdin event not stored: %v", got)
	}
}

func TestPublishRejectsBadInputWithUsageErrors(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"publish", "order.*", "--data", "{}"}, "wildcards"},
		{[]string{"publish", "order.>", "--data", "{}"}, "wildcards"},
		{[]string{"publish", "order..created", "--data", "{}"}, "dot-separated"},
		{[]string{"publish", "order created", "--data", "{}"}, "dot-separated"},
		{[]string{"publish", "order.created"}, "--data is required"},
		{[]string{"publish", "order.created", "--data", "{not json"}, "not valid JSON"},
		{[]string{"publish", "order.created", "--data", "{}", "-H", "Nats-Msg-Id=x"}, "belong to JetStream"},
		{[]string{"publish", "order.created", "--data", "{}", "-H", "novalue"}, "NAME=VALUE"},
		{[]string{"publish", "order.created", "--data", "{}", "-H", "Whk-Test=true"}, "belong to JetStream and the operator"},
		{[]string{"publish", "order.created", "--data", "{}", "-H", "X-Webhook-Event-Id=x"}, "belong to JetStream and the operator"},
		{[]string{"publish", "order.created", "--data", "{}", "-H", "Authorization=Bearer x"}, "belong in the endpoint's headersFrom"},
		{[]string{"publish", "order.created", "--data", "{}", "-H", "Host=evil.example"}, "not forwarded to receivers"},
		{[]string{"publish", "order.created", "--data", "{}", "-H", "Content-Type=text/plain"}, "use --content-type"},
		{[]string{"publish", "order.created", "--data", "{}", "-H", "X-Team=a\r\nX-Evil: 1"}, "control character"},
		{[]string{"publish"}, "accepts 1 arg"},
		{[]string{"publish", "order.created", "--data", "{}", "-o", "xml"}, "--output"},
		{[]string{"publish", "order.created", "--bogus"}, "unknown flag"},
	} {
		r := e.run(tc.args...)
		if r.code != plugin.ExitUsage || !strings.Contains(r.errOut, tc.msg) {
			t.Errorf("%v: want exit 2 with %q, got %s", tc.args, tc.msg, r)
		}
	}
	// Plain text is fine with a matching content type.
	e.run("publish", "note.added", "--data", "hello", "--content-type", "text/plain").must(t, plugin.ExitOK)
	if len(e.subjectMsgs("WEBHOOKS_"+e.ns, "webhooks."+e.ns+".order.created")) != 0 {
		t.Error("a rejected publish stored an event")
	}
}

// A namespace without endpoints has no events stream: publishing there is refused with what to
// do, and nothing lands in another namespace's stream.
func TestPublishToANamespaceWithoutStreams(t *testing.T) {
	e := newEnv(t)
	bare := e.ns + "-bare"
	if err := cp.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: bare}}); err != nil {
		t.Fatal(err)
	}
	r := e.run("publish", "order.created", "--data", "{}", "-n", bare).must(t, plugin.ExitNotFound)
	for _, want := range []string{"no stream stores webhooks." + bare + ".order.created", "WEBHOOKS_" + bare, "first WebhookEndpoint"} {
		if !strings.Contains(r.errOut, want) {
			t.Errorf("error lacks %q: %s", want, r)
		}
	}
	if n := len(e.subjectMsgs("WEBHOOKS_"+e.ns, "webhooks.>")); n != 0 {
		t.Errorf("%d events landed in %s's stream", n, e.ns)
	}
}
