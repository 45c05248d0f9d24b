package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/webhook-operator/webhook-operator/internal/cloudevent"
	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// producer makes ServiceAccount name in the user's namespace, bound to the producer ClusterRole
// when rbac, and returns a token of it for the ingress's audience (kubectl create token).
func (u *user) producer(name string, rbac bool) string {
	u.t.Helper()
	u.must(nil, "kubectl", "create", "serviceaccount", name)
	if rbac {
		u.must(nil, "kubectl", "create", "rolebinding", name, "--clusterrole=webhook-operator-producer", "--serviceaccount="+u.ns+":"+name)
	}
	return strings.TrimSpace(u.must(nil, "kubectl", "create", "token", name, "--audience", ingress.DefaultAudience))
}

// curl posts body to the ingress's path with token and extra curl arguments, and returns the
// status code and the body.
func curl(t *testing.T, path, token string, body []byte, extra ...string) (int, string) {
	t.Helper()
	args := []string{"-sS", "-o", "-", "-w", "\n%{http_code}", "-X", "POST", "--data-binary", "@-"}
	if token != "" {
		args = append(args, "-H", "Authorization: Bearer "+token)
	}
	args = append(args, extra...)
	args = append(args, stack.IngressURL+path)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "curl", args...)
	cmd.Stdin = bytes.NewReader(body)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("curl %s: %v\n%s", path, err, out)
	}
	s := strings.TrimRight(string(out), "\n")
	i := strings.LastIndexByte(s, '\n')
	var code int
	fmt.Sscan(s[i+1:], &code)
	return code, s[:max(i, 0)]
}

// events counts what namespace ns's events stream holds.
func events(t *testing.T, ns string) uint64 {
	t.Helper()
	nc, js, err := stack.ConnectAdmin()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	s, err := js.Stream(context.Background(), "WEBHOOKS_"+ns)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// TestIngressCurlAndRefusals: a producer Pod's ServiceAccount token publishes with curl and the
// endpoint receives the event signed; the plugin publishes --via http; every bad input and
// every authorization case gets its status, and nothing of them is published.
func TestIngressCurlAndRefusals(t *testing.T) {
	u := newUser(t, "e2e-ingress")
	rcv := u.receiver("shop")
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: shop}
spec: {url: %s, eventTypes: [order.*]}
`, rcv.URL()))
	u.waitReady("shop")
	token := u.producer("pub", true)
	path := "/v1/namespaces/" + u.ns + "/events"

	code, body := curl(t, path, token, []byte(`{"id":"evt_curl_1","type":"order.created","data":{"order_id":"o1"}}`), "-H", "Content-Type: application/json")
	var res ingress.Result
	if code != http.StatusAccepted || json.Unmarshal([]byte(body), &res) != nil || res.Stream != "WEBHOOKS_"+u.ns || res.Sequence == 0 {
		t.Fatalf("curl: %d %s", code, body)
	}
	receive(t, rcv, "evt_curl_1")
	if r := rcv.Requests(); len(r) == 0 || !r[0].Signed || string(rcv.Body("evt_curl_1")) != `{"order_id":"o1"}` {
		t.Errorf("the receiver got %+v", r)
	}

	// The plugin, through the ingress.
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	out := u.must(nil, "kubectl", "webhooks", "publish", "order.paid", "--id", "evt_plugin_1", "--data", `{"order_id":"o1"}`,
		"--via", "http", "--ingress-url", stack.IngressURL, "--ingress-token-file", tokenFile, "--ingress-allow-plaintext-tokens")
	if !strings.Contains(out, "through the ingress") {
		t.Errorf("kubectl webhooks publish --via http: %s", out)
	}
	receive(t, rcv, "evt_plugin_1")

	other := newUser(t, "e2e-ingress-other")
	otherToken := other.producer("pub", true)
	norbac := u.producer("norbac", false)
	apiToken := strings.TrimSpace(u.must(nil, "kubectl", "create", "token", "pub"))
	ok := []byte(`{"id":"evt_never","type":"order.created","data":{}}`)
	json := []string{"-H", "Content-Type: application/json"}
	before := events(t, u.ns)
	for _, tc := range []struct {
		name, token string
		body        []byte
		extra       []string
		status      int
		want        string
	}{
		{"no token", "", ok, json, 401, "no bearer token"},
		{"a token of the API server's audience", apiToken, ok, json, 401, "not for audience ingress.webhook-operator.io"},
		{"no RBAC", norbac, ok, json, 403, "may not publish events in namespace " + u.ns},
		{"another namespace's producer", otherToken, ok, json, 403, "system:serviceaccount:" + other.ns + ":pub may not publish events in namespace " + u.ns},
		{"malformed JSON", token, []byte(`{"id":`), json, 400, "not a JSON event"},
		{"too large", token, []byte(`{"id":"evt_big","type":"order.created","data":"` + strings.Repeat("x", 2<<20) + `"}`), json, 413, "larger than"},
		{"a type that is no subject token", token, []byte(`{"id":"evt_t","type":"order created","data":{}}`), json, 400, "cannot be a subject token"},
		{"a forged operator header", token, ok, append([]string{"-H", "Whk-Replay-Of: whdl_forged"}, json...), 400, "belong to JetStream and the operator"},
		{"an operational event", token, []byte(`{"id":"evt_o","type":"webhook_operator.endpoint.disabled","data":{}}`), json, 403, "operational events"},
		{"malformed CloudEvent", token, []byte(`{"specversion":"1.0"`), []string{"-H", "Content-Type: application/cloudevents+json"}, 400, "not a CloudEvent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := path
			if strings.Contains(tc.name, "CloudEvent") {
				p = "/v1/namespaces/" + u.ns + "/cloudevents"
			}
			code, body := curl(t, p, tc.token, tc.body, tc.extra...)
			if code != tc.status || !strings.Contains(body, tc.want) {
				t.Errorf("%d %s, want %d with %q", code, body, tc.status, tc.want)
			}
		})
	}
	if after := events(t, u.ns); after != before {
		t.Errorf("the refused requests stored %d events", after-before)
	}
	if n := rcv.Stats().Unique; n != 2 {
		t.Errorf("the receiver got %d events, want the 2 published", n)
	}
}

// TestIngressCloudEvents: a CloudEvents producer with the official SDK's client publishes in
// binary, structured and batched mode; and a Knative-style source (a process that POSTs
// CloudEvents to its sink URL, K_SINK, with a projected token) delivers through the ingress to
// endpoints of format CloudEvents, binary and structured, whose receivers verify both the
// CloudEvent (with the SDK) and the Standard Webhooks signature.
func TestIngressCloudEvents(t *testing.T) {
	u := newUser(t, "e2e-cloudevents")
	raw, bin, structured := u.receiver("raw"), u.receiver("ce-binary"), u.receiver("ce-structured")
	u.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: raw}
spec: {url: %s, eventTypes: [com.example.>]}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: ce-binary}
spec: {url: %s, eventTypes: [dev.knative.>], format: {type: CloudEvents}}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: ce-structured}
spec: {url: %s, eventTypes: [dev.knative.>], format: {type: CloudEvents, cloudEventsMode: Structured}}
`, raw.URL(), bin.URL(), structured.URL()))
	u.waitReady("raw", "ce-binary", "ce-structured")
	token := u.producer("source", true)
	sink := stack.IngressURL + "/v1/namespaces/" + u.ns + "/cloudevents"

	// The SDK client in each mode.
	c, err := cloudevents.NewClientHTTP(cloudevents.WithTarget(sink), cehttp.WithHeader("Authorization", "Bearer "+token))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"binary", "structured"} {
		e := cloudevents.NewEvent()
		e.SetID("sdk-" + mode)
		e.SetSource("/e2e/sdk")
		e.SetType("com.example.order.created")
		_ = e.SetData(cloudevents.ApplicationJSON, map[string]string{"mode": mode})
		ctx := cloudevents.WithEncodingBinary(context.Background())
		if mode == "structured" {
			ctx = cloudevents.WithEncodingStructured(context.Background())
		}
		if r := c.Send(ctx, e); !cloudevents.IsACK(r) {
			t.Fatalf("the SDK client (%s): %v", mode, r)
		}
	}
	var batch []cloudevents.Event
	for i := range 2 {
		e := cloudevents.NewEvent()
		e.SetID(fmt.Sprintf("sdk-batch-%d", i))
		e.SetSource("/e2e/sdk")
		e.SetType("com.example.order.paid")
		_ = e.SetData(cloudevents.ApplicationJSON, map[string]int{"i": i})
		batch = append(batch, e)
	}
	req, err := cehttp.NewHTTPRequestFromEvents(context.Background(), sink, batch)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("a batch: %v %v", resp, err)
	}
	resp.Body.Close()
	receive(t, raw, "sdk-binary", "sdk-structured", "sdk-batch-0", "sdk-batch-1")

	// The Knative-style source: a ContainerSource-like process with K_SINK and a token file,
	// as Knative's sink OIDC authentication gives one, sending PingSource-like events.
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 3 {
		ids = append(ids, knativeSource(t, sink, tokenFile, i))
	}
	receive(t, bin, ids...)
	receive(t, structured, ids...)
	for name, r := range map[string]*testenv.Receiver{"binary": bin, "structured": structured} {
		for _, got := range r.Requests() {
			if !got.Signed {
				t.Errorf("%s: %s is not signed", name, got.ID)
			}
			hr, _ := http.NewRequest(http.MethodPost, "http://receiver/", bytes.NewReader(got.Body))
			hr.Header = got.Header.Clone()
			ev, err := cehttp.NewEventFromHTTPRequest(hr)
			if err != nil {
				t.Fatalf("%s: not a CloudEvent: %v\n%v\n%s", name, err, got.Header, got.Body)
			}
			if ev.ID() != got.ID || ev.Type() != "dev.knative.sources.ping" || ev.Source() != "/apis/v1/namespaces/"+u.ns+"/pingsources/tick" ||
				ev.Subject() != "tick" || ev.Extensions()[cloudevent.PartitionKey] != "tick" || !strings.Contains(string(ev.Data()), `"message":"tick `) {
				t.Errorf("%s: %s", name, ev)
			}
		}
	}
	if n := raw.Stats().Unique; n != 4 {
		t.Errorf("the raw endpoint got %d events, want the SDK's 4", n)
	}
}

// knativeSource sends one event as a Knative source does: the CloudEvents SDK client posting
// to the sink URL in binary mode, with a bearer token read from a file. It returns the id.
func knativeSource(t *testing.T, sink, tokenFile string, i int) string {
	t.Helper()
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cloudevents.NewClientHTTP(cloudevents.WithTarget(sink), cehttp.WithHeader("Authorization", "Bearer "+strings.TrimSpace(string(tok))))
	if err != nil {
		t.Fatal(err)
	}
	ns := strings.Split(strings.TrimPrefix(sink, stack.IngressURL+"/v1/namespaces/"), "/")[0]
	e := cloudevents.NewEvent()
	id := fmt.Sprintf("ping-%d-%d", i, time.Now().UnixNano())
	e.SetID(id)
	e.SetSource("/apis/v1/namespaces/" + ns + "/pingsources/tick")
	e.SetType("dev.knative.sources.ping")
	e.SetSubject("tick")
	e.SetTime(time.Now())
	e.SetExtension(cloudevent.PartitionKey, "tick")
	_ = e.SetData(cloudevents.ApplicationJSON, map[string]string{"message": fmt.Sprintf("tick %d", i)})
	if r := c.Send(context.Background(), e); !cloudevents.IsACK(r) {
		t.Fatalf("the source's send: %v", r)
	}
	return id
}
