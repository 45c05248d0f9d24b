package ingress_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go/jetstream"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/webhook-operator/webhook-operator/internal/cloudevent"
	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/kubeauth"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

var (
	cs      kubernetes.Interface
	restCfg *rest.Config
)

func TestMain(m *testing.M) {
	cp, err := testenv.StartControlPlane()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cs, restCfg = kubernetes.NewForConfigOrDie(cp.Config), cp.Config
	code := m.Run()
	_ = cp.Stop()
	os.Exit(code)
}

// world is an ingress on loopback in front of a real nats-server with namespaces a and b's
// streams (c has none), and a real API server deciding who may publish.
type world struct {
	t   testing.TB
	url string
	js  jetstream.JetStream
	cfg streams.Config
}

func newWorld(t testing.TB, tweak func(*ingress.Options)) *world {
	t.Helper()
	return newServingWorld(t, tweak, ingress.ServerOptions{Addr: "127.0.0.1:0"})
}

// newServingWorld is newWorld with the HTTP server's own options.
func newServingWorld(t testing.TB, tweak func(*ingress.Options), so ingress.ServerOptions) *world {
	t.Helper()
	n := testenv.NewNATS(t)
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := streams.DefaultConfig()
	for _, ns := range []string{"a", "b"} {
		if err := cfg.For(ns).Ensure(context.Background(), js); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{"a", "b", "c"} {
		ensureNamespace(t, ns)
	}
	o := ingress.Options{JS: js, MaxPayload: nc.MaxPayload, Names: cfg.Names,
		Auth:          &ingress.Authorizer{Reviewer: kubeauth.Reviewer{Client: cs}},
		MaxEventBytes: 64 << 10}
	if tweak != nil {
		tweak(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- ingress.Serve(ctx, ingress.NewHandler(o), so, func(a net.Addr) { addr <- a })
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case a := <-addr:
		return &world{t: t, url: "http://" + a.String(), js: js, cfg: cfg}
	case err := <-done:
		t.Fatal(err)
	}
	return nil
}

func ensureNamespace(t testing.TB, ns string) {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// producer makes ns/name, bound (when rbac) to create on webhookevents in ns, and returns a
// token of audience (default the ingress's).
func producer(t testing.TB, ns, name string, rbac bool, audiences ...string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if rbac {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"webhook-operator.io"}, Resources: []string{kubeauth.ResourceEvents}, Verbs: []string{"create"}}}}
		if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if len(audiences) == 0 {
		audiences = []string{ingress.DefaultAudience}
	}
	if audiences[0] == "" {
		audiences = nil
	}
	seconds := int64(600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// forged is a well-formed JWT of audience, expiring in ttl, that no API server signed: it
// passes the ingress's precheck and only a TokenReview refuses it.
func forged(audience string, ttl time.Duration) string {
	enc := base64.RawURLEncoding.EncodeToString
	claims, _ := json.Marshal(map[string]any{"aud": []string{audience}, "exp": time.Now().Add(ttl).Unix(), "iss": "forged",
		"sub": "system:serviceaccount:a:forged", "jti": fmt.Sprint(forgedCount.Add(1))})
	return enc([]byte(`{"alg":"RS256","kid":"forged"}`)) + "." + enc(claims) + "." + enc([]byte("not a signature"))
}

var forgedCount atomic.Int64

// post sends body to path with token and headers (K, V pairs) and returns the status, the
// response headers and body.
func (w *world) post(path, token, contentType string, body []byte, kv ...string) (int, http.Header, []byte) {
	w.t.Helper()
	req, err := http.NewRequest(http.MethodPost, w.url+path, bytes.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// stored is what namespace ns's events stream holds.
func (w *world) stored(ns string) []jetstream.RawStreamMsg {
	w.t.Helper()
	ctx := context.Background()
	s, err := w.js.Stream(ctx, w.cfg.Names.For(ns).EventsStream())
	if err != nil {
		w.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		out = append(out, *m)
	}
	return out
}

func event(id, typ, data string) []byte {
	b, _ := json.Marshal(map[string]any{"id": id, "type": typ, "data": json.RawMessage(data)})
	return b
}

func TestPublishJSON(t *testing.T) {
	w := newWorld(t, nil)
	tok := producer(t, "a", "pub", true)
	trace := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	body := []byte(`{"id":"evt_1","type":"order.created","data":{"total":42},"time":"2026-12-01T10:00:00Z","subject":"orders/o-1","orderingKey":"o-1","headers":{"X-Region":"eu"}}`)
	status, _, resp := w.post("/v1/namespaces/a/events", tok, "application/json", body, "traceparent", trace)
	if status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, resp)
	}
	var res ingress.Result
	if err := json.Unmarshal(resp, &res); err != nil || res.Stream != "WEBHOOKS_a" || res.Sequence != 1 || res.Duplicate || res.ID != "evt_1" {
		t.Fatalf("result %s (%v)", resp, err)
	}
	msgs := w.stored("a")
	if len(msgs) != 1 {
		t.Fatalf("%d events stored", len(msgs))
	}
	m := msgs[0]
	h := m.Header
	if m.Subject != "webhooks.a.order.created" || string(m.Data) != `{"total":42}` || h.Get(records.HeaderMsgID) != "evt_1" ||
		h.Get(records.HeaderEventTime) != "2026-12-01T10:00:00Z" || h.Get(cloudevent.HeaderSubject) != "orders/o-1" ||
		h.Get(cloudevent.HeaderPartitionKey) != "o-1" || h.Get("X-Region") != "eu" || h.Get(records.HeaderContentType) != "application/json" ||
		h.Get(records.HeaderTraceParent) != trace {
		t.Errorf("stored %s %q %v", m.Subject, m.Data, h)
	}

	// The same id again: acknowledged as a duplicate of what is stored, nothing new.
	status, _, resp = w.post("/v1/namespaces/a/events", tok, "application/json", body)
	if err := json.Unmarshal(resp, &res); status != http.StatusAccepted || err != nil || !res.Duplicate || res.Sequence != 1 {
		t.Errorf("a retried publish: %d %s", status, resp)
	}

	// A batch: one result per event, in order.
	batch := []byte(`[` + string(event("evt_2", "order.paid", `{"n":2}`)) + `,` + string(event("evt_3", "order.paid", `"three"`)) + `]`)
	status, _, resp = w.post("/v1/namespaces/a/events", tok, "application/json", batch)
	var br ingress.BatchResult
	if err := json.Unmarshal(resp, &br); status != http.StatusAccepted || err != nil || len(br.Results) != 2 ||
		br.Results[0].ID != "evt_2" || br.Results[1].ID != "evt_3" || br.Results[1].Sequence != 3 || br.Results[0].Status != 202 {
		t.Errorf("a batch: %d %s", status, resp)
	}
	if n := len(w.stored("a")); n != 3 {
		t.Errorf("%d events stored, want 3", n)
	}
}

// Every bad input and every refusal gets its status and a message that says what is wrong, and
// publishes nothing.
func TestRefusalsPublishNothing(t *testing.T) {
	w := newWorld(t, func(o *ingress.Options) { o.MaxBatchEvents = 3 })
	good := producer(t, "a", "pub", true)
	norbac := producer(t, "a", "norbac", false)
	apiAudience := producer(t, "a", "pub", true, "")
	ok := event("evt_ok", "order.created", `{}`)
	big := event("evt_big", "order.created", `"`+strings.Repeat("x", 70<<10)+`"`)
	for _, tc := range []struct {
		name, path, token, contentType string
		body                           []byte
		headers                        []string
		status                         int
		want                           string
	}{
		{"no token", "/v1/namespaces/a/events", "", "application/json", ok, nil, 401, "no bearer token"},
		{"a token that is no JWT", "/v1/namespaces/a/events", "not-a-token", "application/json", ok, nil, 401, "is not a Kubernetes ServiceAccount token"},
		{"a token the API server does not know", "/v1/namespaces/a/events", forged(ingress.DefaultAudience, time.Hour), "application/json", ok, nil, 401, "does not accept the bearer token"},
		{"a token of the API server's audience", "/v1/namespaces/a/events", apiAudience, "application/json", ok, nil, 401, "for audience " + ingress.DefaultAudience},
		{"no RBAC", "/v1/namespaces/a/events", norbac, "application/json", ok, nil, 403, "system:serviceaccount:a:norbac may not publish events in namespace a"},
		{"another namespace", "/v1/namespaces/b/events", good, "application/json", ok, nil, 403, "may not publish events in namespace b"},
		{"not a namespace", "/v1/namespaces/A_B/events", good, "application/json", ok, nil, 404, "is not a DNS label"},
		{"malformed JSON", "/v1/namespaces/a/events", good, "application/json", []byte(`{"id":"x","type":`), nil, 400, "not a JSON event"},
		{"an unknown field", "/v1/namespaces/a/events", good, "application/json", []byte(`{"id":"x","type":"t","data":1,"payload":2}`), nil, 400, "unknown field"},
		{"no id", "/v1/namespaces/a/events", good, "application/json", event("", "order.created", `{}`), nil, 400, "has no id"},
		{"no data", "/v1/namespaces/a/events", good, "application/json", []byte(`{"id":"x","type":"t"}`), nil, 400, "has no data"},
		{"a type that is no subject token", "/v1/namespaces/a/events", good, "application/json", event("x", "order created", `{}`), nil, 400, "cannot be a subject token"},
		{"a wildcard type", "/v1/namespaces/a/events", good, "application/json", event("x", "order.*", `{}`), nil, 400, "wildcards"},
		{"an operational event", "/v1/namespaces/a/events", good, "application/json", event("x", "webhook_operator.endpoint.disabled", `{}`), nil, 403, "operator's own operational events"},
		{"a forged operator header", "/v1/namespaces/a/events", good, "application/json", ok, []string{"Whk-Delivery-Id", "whdl_x"}, 400, "belong to JetStream and the operator"},
		{"a forged JetStream header", "/v1/namespaces/a/events", good, "application/json", ok, []string{"Nats-Msg-Id", "other"}, 400, "belong to JetStream and the operator"},
		{"a forged header in the event", "/v1/namespaces/a/events", good, "application/json", []byte(`{"id":"x","type":"t","data":1,"headers":{"Whk-Attempts":"9"}}`), nil, 400, "belong to JetStream and the operator"},
		{"a time that is no time", "/v1/namespaces/a/events", good, "application/json", []byte(`{"id":"x","type":"t","data":1,"time":"yesterday"}`), nil, 400, "not an RFC 3339 time"},
		{"too large", "/v1/namespaces/a/events", good, "application/json", big, nil, 413, "at most"},
		{"a batch with one bad event", "/v1/namespaces/a/events", good, "application/json", []byte(`[` + string(ok) + `,{"id":"y","type":"bad type","data":1}]`), nil, 400, "another event of the batch is invalid"},
		{"a batch too long", "/v1/namespaces/a/events", good, "application/json", []byte(`[` + strings.Repeat(string(ok)+",", 3) + string(ok) + `]`), nil, 413, "at most 3"},
		{"no events stream", "/v1/namespaces/c/events", producer(t, "c", "pub", true), "application/json", ok, nil, 404, "has no events stream WEBHOOKS_c"},
		{"malformed CloudEvent", "/v1/namespaces/a/cloudevents", good, "application/cloudevents+json", []byte(`{"specversion":"1.0","id":`), nil, 400, "not a CloudEvent"},
		{"a CloudEvent without a source", "/v1/namespaces/a/cloudevents", good, "application/cloudevents+json", []byte(`{"specversion":"1.0","id":"x","type":"t"}`), nil, 400, "source"},
		{"a CloudEvent with both data and data_base64", "/v1/namespaces/a/cloudevents", good, "application/cloudevents+json",
			[]byte(`{"specversion":"1.0","id":"both","source":"/s","type":"t","datacontenttype":"application/json","data":{"n":1},"data_base64":"eyJuIjoyfQ=="}`), nil, 400, "both data and data_base64"},
		{"a batch with a CloudEvent holding both data and data_base64", "/v1/namespaces/a/cloudevents", good, "application/cloudevents-batch+json",
			[]byte(`[{"specversion":"1.0","id":"ok","source":"/s","type":"t","data":1},{"specversion":"1.0","id":"both","source":"/s","type":"t","data":null,"data_base64":"AA=="}]`), nil, 400, "both data and data_base64"},
		{"binary mode without ce- headers", "/v1/namespaces/a/cloudevents", good, "application/json", []byte(`{}`), nil, 400, "not a CloudEvent"},
		{"a CloudEvent type that is no subject token", "/v1/namespaces/a/cloudevents", good, "application/json", []byte(`{}`),
			[]string{"ce-specversion", "1.0", "ce-id", "x", "ce-source", "/s", "ce-type", "com/example"}, 400, "cannot be a subject token"},
		{"a wrong method", "/v1/namespaces/a/events", good, "", nil, []string{"X-Method", "GET"}, 405, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(w.stored("a"))
			var status int
			var body []byte
			if len(tc.headers) == 2 && tc.headers[0] == "X-Method" {
				resp, err := http.Get(w.url + tc.path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				status = resp.StatusCode
			} else {
				status, _, body = w.post(tc.path, tc.token, tc.contentType, tc.body, tc.headers...)
			}
			if status != tc.status || !strings.Contains(string(body), tc.want) {
				t.Errorf("status %d %s, want %d with %q", status, body, tc.status, tc.want)
			}
			if after := len(w.stored("a")); after != before {
				t.Errorf("%d events published", after-before)
			}
		})
	}
}

// A namespace over its rate gets 429 with Retry-After, and publishes nothing more; another
// namespace is unaffected.
func TestRateLimit(t *testing.T) {
	w := newWorld(t, func(o *ingress.Options) { o.RateLimit = &ingress.RateLimiter{Rate: 0.01, Burst: 2} })
	a, b := producer(t, "a", "pub", true), producer(t, "b", "pub", true)
	for i := range 2 {
		if status, _, resp := w.post("/v1/namespaces/a/events", a, "application/json", event(fmt.Sprintf("evt_%d", i), "t", "1")); status != 202 {
			t.Fatalf("within the burst: %d %s", status, resp)
		}
	}
	status, h, resp := w.post("/v1/namespaces/a/events", a, "application/json", event("evt_over", "t", "1"))
	if status != http.StatusTooManyRequests || h.Get("Retry-After") == "" || !strings.Contains(string(resp), "at most 0.01 events per second") {
		t.Errorf("over the rate: %d %v %s", status, h, resp)
	}
	if n := len(w.stored("a")); n != 2 {
		t.Errorf("%d events stored, want 2", n)
	}
	if status, _, resp := w.post("/v1/namespaces/b/events", b, "application/json", event("evt_b", "t", "1")); status != 202 {
		t.Errorf("namespace b: %d %s", status, resp)
	}

	// A batch larger than the burst can never pass, however long it waits: 413 saying the
	// largest batch allowed, no Retry-After.
	batch := []byte(`[` + string(event("evt_b1", "t", "1")) + `,` + string(event("evt_b2", "t", "1")) + `,` + string(event("evt_b3", "t", "1")) + `]`)
	status, h, resp = w.post("/v1/namespaces/b/events", b, "application/json", batch)
	if status != http.StatusRequestEntityTooLarge || h.Get("Retry-After") != "" || !strings.Contains(string(resp), "send batches of at most 2 events") {
		t.Errorf("a batch over the burst: %d %v %s", status, h, resp)
	}
	if n := len(w.stored("b")); n != 1 {
		t.Errorf("%d events stored in b, want 1", n)
	}
}

// A CloudEvents producer using the official SDK's client publishes in binary, structured and
// batched mode; the event's attributes are stored with it.
func TestCloudEventsSDKProducer(t *testing.T) {
	w := newWorld(t, nil)
	tok := producer(t, "a", "pub", true)
	target := w.url + "/v1/namespaces/a/cloudevents"
	auth := cehttp.WithHeader("Authorization", "Bearer "+tok)
	for i, mode := range []string{"binary", "structured"} {
		c, err := cloudevents.NewClientHTTP(cloudevents.WithTarget(target), auth)
		if err != nil {
			t.Fatal(err)
		}
		e := cloudevents.NewEvent()
		e.SetID("ce-" + mode)
		e.SetSource("//github.com/org/repo")
		e.SetType("com.github.pull_request.opened")
		e.SetSubject("pr/" + mode)
		e.SetTime(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC))
		e.SetExtension(cloudevent.PartitionKey, "repo-1")
		if err := e.SetData(cloudevents.ApplicationJSON, map[string]any{"number": i}); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if mode == "structured" {
			ctx = cloudevents.WithEncodingStructured(ctx)
		} else {
			ctx = cloudevents.WithEncodingBinary(ctx)
		}
		if res := c.Send(ctx, e); !cloudevents.IsACK(res) {
			t.Fatalf("%s: %v", mode, res)
		}
	}
	// Batched mode: the SDK's batch request.
	var batch []cloudevents.Event
	for i := range 3 {
		e := cloudevents.NewEvent()
		e.SetID(fmt.Sprintf("ce-batch-%d", i))
		e.SetSource("/ping")
		e.SetType("dev.knative.sources.ping")
		_ = e.SetData(cloudevents.TextPlain, fmt.Sprintf("tick %d", i))
		batch = append(batch, e)
	}
	req, err := cehttp.NewHTTPRequestFromEvents(context.Background(), target, batch)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var br ingress.BatchResult
	if resp.StatusCode != 202 || json.Unmarshal(b, &br) != nil || len(br.Results) != 3 {
		t.Fatalf("batch: %d %s", resp.StatusCode, b)
	}

	msgs := w.stored("a")
	if len(msgs) != 5 {
		t.Fatalf("%d events stored, want 5", len(msgs))
	}
	for i, mode := range []string{"binary", "structured"} {
		m := msgs[i]
		got := cloudevent.FromMessage(m.Header.Get(records.HeaderMsgID), strings.TrimPrefix(m.Subject, "webhooks.a."), "a", time.Time{}, m.Header, m.Header.Get(records.HeaderContentType), m.Data)
		if got.ID != "ce-"+mode || got.Type != "com.github.pull_request.opened" || got.Source != "//github.com/org/repo" || got.Subject != "pr/"+mode ||
			got.Extensions[cloudevent.PartitionKey] != "repo-1" || m.Header.Get(records.HeaderEventTime) != "2026-12-01T10:00:00Z" ||
			string(m.Data) != fmt.Sprintf(`{"number":%d}`, i) {
			t.Errorf("%s stored as %s %q %v", mode, m.Subject, m.Data, m.Header)
		}
	}
	if m := msgs[4]; m.Subject != "webhooks.a.dev.knative.sources.ping" || string(m.Data) != "tick 2" || m.Header.Get(records.HeaderContentType) != "text/plain" {
		t.Errorf("batch event stored as %s %q %v", m.Subject, m.Data, m.Header)
	}
}

// Decisions are cached (a second request asks the API server nothing), bounded, and refusals
// too; a token's identity is looked up per namespace.
func TestAuthorizerCache(t *testing.T) {
	ensureNamespace(t, "a")
	tok := producer(t, "a", "cached", true)
	hits, misses := 0, 0
	now := time.Now()
	a := &ingress.Authorizer{Reviewer: kubeauth.Reviewer{Client: cs}, Size: 2, TTL: time.Minute,
		Observe: func(hit bool) {
			if hit {
				hits++
			} else {
				misses++
			}
		}, Now: func() time.Time { return now }}
	for range 3 {
		if d, err := a.Authorize(context.Background(), tok, "a"); err != nil || d.Status != 0 {
			t.Fatalf("%+v %v", d, err)
		}
	}
	if hits != 2 || misses != 1 {
		t.Errorf("hits %d misses %d, want 2 and 1", hits, misses)
	}
	if d, _ := a.Authorize(context.Background(), tok, "b"); d.Status != http.StatusForbidden {
		t.Errorf("namespace b: %+v", d)
	}
	if d, _ := a.Authorize(context.Background(), "garbage", "a"); d.Status != http.StatusUnauthorized {
		t.Errorf("garbage: %+v", d)
	}
	if allowed, refused := a.Len(); allowed > 2 || refused > 2 {
		t.Errorf("%d decisions and %d refusals kept, bound 2 each", allowed, refused)
	}
	now = now.Add(2 * time.Minute)
	before := misses
	_, _ = a.Authorize(context.Background(), tok, "a")
	if misses != before+1 {
		t.Error("an expired decision was used")
	}
}

// Binary mode's ce-* values are percent-decoded as the HTTP binding requires: what a
// conformant sender encoded is stored as it meant it (and a dispatcher encodes it once again
// for its receivers), a '%' that escapes nothing is kept (senders that do not encode), and a
// value that decodes to bytes that are not UTF-8 is refused.
func TestCloudEventsBinaryHeadersPercentDecoded(t *testing.T) {
	w := newWorld(t, nil)
	tok := producer(t, "a", "pub", true)
	binary := func(id string, kv ...string) (int, []byte) {
		status, _, resp := w.post("/v1/namespaces/a/cloudevents", tok, "application/json", []byte(`{}`),
			append([]string{"ce-specversion", "1.0", "ce-id", id, "ce-source", "/s%2520x", "ce-type", "order.created"}, kv...)...)
		return status, resp
	}
	if status, resp := binary("evt%5Fpct", "ce-subject", "caf%C3%A9%20%22q%22%20%25", "ce-region", "100%"); status != http.StatusAccepted {
		t.Fatalf("%d %s", status, resp)
	}
	msgs := w.stored("a")
	if len(msgs) != 1 {
		t.Fatalf("%d events stored", len(msgs))
	}
	h := msgs[0].Header
	if h.Get(records.HeaderMsgID) != "evt_pct" || h.Get(cloudevent.HeaderSource) != "/s%20x" || h.Get(cloudevent.HeaderSubject) != `café "q" %` || h.Get("Ce-Region") != "100%" {
		t.Errorf("stored %v", h)
	}
	if status, resp := binary("evt_bad", "ce-subject", "%C3"); status != http.StatusBadRequest || !strings.Contains(string(resp), "not UTF-8") {
		t.Errorf("a value that is not UTF-8: %d %s", status, resp)
	}
	if n := len(w.stored("a")); n != 1 {
		t.Errorf("%d events stored, want 1", n)
	}
}

// A path that is not exactly a route's is answered the documented JSON 404, whatever its
// method: never a redirect to a cleaned path (.., ., //, a trailing slash), never a 405 for a
// path with more segments than a route's; a route's own path with another method is a 405.
func TestPathsThatAreNoRouteAreJSON404(t *testing.T) {
	w := newWorld(t, nil)
	tok := producer(t, "a", "pub", true)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, p string) (int, []byte) {
		req, err := http.NewRequest(method, w.url+p, bytes.NewReader(event("evt_path", "t", "1")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, p := range []string{
		"/v1/namespaces/a/../a/events", "/v1/namespaces/./a/events", "/v1/namespaces//a/events", "//v1/namespaces/a/events",
		"/v1/namespaces/a/events/", "/v1/namespaces/a/b/events", "/v1/namespaces/a/b/cloudevents", "/v1/namespaces/events", "/v1/x/../namespaces/a/events",
	} {
		for _, method := range []string{http.MethodPost, http.MethodGet} {
			status, body := do(method, p)
			var e struct {
				Status int    `json:"status"`
				Error  string `json:"error"`
			}
			if status != http.StatusNotFound || json.Unmarshal(body, &e) != nil || e.Status != http.StatusNotFound || !strings.Contains(e.Error, "no such route") {
				t.Errorf("%s %s: %d %s, want the JSON 404", method, p, status, body)
			}
		}
	}
	if status, body := do(http.MethodGet, "/v1/namespaces/a/events"); status != http.StatusMethodNotAllowed {
		t.Errorf("GET of a route: %d %s", status, body)
	}
	if n := len(w.stored("a")); n != 0 {
		t.Errorf("%d events stored", n)
	}
}
