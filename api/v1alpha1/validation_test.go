package v1alpha1_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

var (
	k8s client.Client
	cp  *testenv.ControlPlane
)

func TestMain(m *testing.M) {
	var err error
	cp, err = testenv.StartControlPlane()
	if err != nil {
		println(err.Error())
		os.Exit(1)
	}
	k8s = cp.Client
	code := m.Run()
	_ = cp.Stop()
	os.Exit(code)
}

func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "api-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func decode(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.NewYAMLOrJSONDecoder(strings.NewReader(doc), 4096).Decode(&u.Object); err != nil {
		t.Fatalf("bad test YAML: %v\n%s", err, doc)
	}
	return u
}

// Every sample is accepted by the real API server, and the schema's defaults are stored.
func TestSamplesAreAcceptedWithDefaults(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	files, err := filepath.Glob(filepath.Join(testenv.Root(), "config", "samples", "*.yaml"))
	if err != nil || len(files) < 7 {
		t.Fatalf("samples: %v %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		u := decode(t, string(b))
		u.SetNamespace(ns)
		if err := k8s.Create(ctx, u); err != nil {
			t.Errorf("%s rejected: %v", filepath.Base(f), err)
		}
	}

	var crm v1alpha1.WebhookEndpoint
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "crm"}, &crm); err != nil {
		t.Fatal(err)
	}
	if crm.Spec.MaxInFlight == nil || *crm.Spec.MaxInFlight != 50 {
		t.Errorf("maxInFlight default not stored: %v", crm.Spec.MaxInFlight)
	}
	if crm.Spec.Ordering == nil || crm.Spec.Ordering.Mode != v1alpha1.OrderingBestEffort {
		t.Errorf("ordering default not stored: %+v", crm.Spec.Ordering)
	}
	var orders v1alpha1.WebhookEndpoint
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orders"}, &orders); err != nil {
		t.Fatal(err)
	}
	if orders.Spec.Timeout == nil || orders.Spec.Timeout.Duration != 10*time.Second {
		t.Errorf("timeout: %v", orders.Spec.Timeout)
	}

	var exp v1alpha1.RetryPolicy
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "exponential"}, &exp); err != nil {
		t.Fatal(err)
	}
	cb := exp.Spec.CircuitBreaker
	if cb == nil || cb.ConsecutiveFailures != 5 || cb.OpenDuration.Duration != 30*time.Second || cb.SuccessesToClose != 1 || cb.RampUp.Duration != 30*time.Second {
		t.Errorf("circuitBreaker defaults not stored: %+v", cb)
	}
	if ra := exp.Spec.RetryAfter; ra == nil || !ra.Honor || ra.MaxDelay.Duration != time.Hour {
		t.Errorf("retryAfter defaults not stored: %+v", ra)
	}

	// A minimal endpoint gets every default.
	minimal := decode(t, `{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookEndpoint","metadata":{"name":"minimal"},"spec":{"url":"https://x.example.com/","eventTypes":["a"]}}`)
	minimal.SetNamespace(ns)
	if err := k8s.Create(ctx, minimal); err != nil {
		t.Fatal(err)
	}
	var m v1alpha1.WebhookEndpoint
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "minimal"}, &m); err != nil {
		t.Fatal(err)
	}
	if m.Spec.Timeout == nil || m.Spec.Timeout.Duration != 10*time.Second {
		t.Errorf("timeout default not stored: %v", m.Spec.Timeout)
	}
	// A backoff given with only a strategy gets seed 000's numbers.
	bo := decode(t, `{"apiVersion":"webhook-operator.io/v1alpha1","kind":"RetryPolicy","metadata":{"name":"bo"},"spec":{"backoff":{"strategy":"Exponential"}}}`)
	bo.SetNamespace(ns)
	if err := k8s.Create(ctx, bo); err != nil {
		t.Fatal(err)
	}
	var rp v1alpha1.RetryPolicy
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bo"}, &rp); err != nil {
		t.Fatal(err)
	}
	if b := rp.Spec.Backoff; b.InitialInterval.Duration != 2*time.Second || b.Factor != "2" || b.MaxInterval.Duration != time.Hour || b.Jitter != v1alpha1.JitterFull {
		t.Errorf("backoff defaults are not seed 000's: %+v", b)
	}
}

const endpointFmt = `{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookEndpoint","metadata":{"name":"bad"},"spec":%s}`
const replayFmt = `{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookReplay","metadata":{"name":"bad"},"spec":%s}`
const policyFmt = `{"apiVersion":"webhook-operator.io/v1alpha1","kind":"RetryPolicy","metadata":{"name":"bad"},"spec":%s}`

func TestInvalidObjectsAreRejectedWithTheField(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	ep := func(spec string) string { return strings.Replace(endpointFmt, "%s", spec, 1) }
	rp := func(spec string) string { return strings.Replace(policyFmt, "%s", spec, 1) }
	wr := func(spec string) string { return strings.Replace(replayFmt, "%s", spec, 1) }
	cases := []struct {
		name string
		doc  string
		// want lists substrings of the error: the field path and the explanation.
		want []string
	}{
		{"url missing", ep(`{"eventTypes":["a"]}`), []string{"spec", "set exactly one of url and urlFrom"}},
		{"url not http", ep(`{"url":"ftp://x.example.com/","eventTypes":["a"]}`), []string{"spec.url", "absolute http:// or https:// URL"}},
		{"url relative", ep(`{"url":"/hooks","eventTypes":["a"]}`), []string{"spec.url", "absolute http:// or https:// URL"}},
		{"url with user-info", ep(`{"url":"https://user:pw@x.example.com/","eventTypes":["a"]}`), []string{"spec.url", "user-info"}},
		{"url with fragment", ep(`{"url":"https://x.example.com/#frag","eventTypes":["a"]}`), []string{"spec.url", "fragment"}},
		{"no event types", ep(`{"url":"https://x.example.com/","eventTypes":[]}`), []string{"spec.eventTypes", "at least 1"}},
		{"event type with space", ep(`{"url":"https://x.example.com/","eventTypes":["order created"]}`), []string{"spec.eventTypes[0]", "dot-separated tokens"}},
		{"event type with > not last", ep(`{"url":"https://x.example.com/","eventTypes":["order.>.x"]}`), []string{"spec.eventTypes[0]", "only the last may be '>'"}},
		{"event type with empty token", ep(`{"url":"https://x.example.com/","eventTypes":["order..created"]}`), []string{"spec.eventTypes[0]", "no empty tokens"}},
		{"too many event types", ep(`{"url":"https://x.example.com/","eventTypes":[` + manyEventTypes(65) + `]}`), []string{"spec.eventTypes", "64"}},
		{"timeout too short", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"timeout":"500ms"}`), []string{"spec.timeout", "between 1s and 120s"}},
		{"timeout too long", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"timeout":"121s"}`), []string{"spec.timeout", "between 1s and 120s"}},
		{"negative timeout", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"timeout":"-5s"}`), []string{"spec.timeout", "between 1s and 120s"}},
		{"3xx success code", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"successStatusCodes":[200,301]}`), []string{"spec.successStatusCodes", "only list 2xx"}},
		{"5xx success code", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"successStatusCodes":[500]}`), []string{"spec.successStatusCodes", "only list 2xx"}},
		{"reserved header", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"Webhook-Signature","value":"x"}]}`), []string{"spec.headers[0]", "header Webhook-Signature: headers cannot set webhook-*", "dispatcher owns them"}},
		{"reserved header from a Secret", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headersFrom":[{"name":"Content-Type","secretKeyRef":{"name":"s","key":"k"}}]}`), []string{"spec.headersFrom[0]", "header Content-Type: headersFrom cannot set", "dispatcher owns them"}},
		{"header value with CR LF", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"X-Team","value":"payments\r\nX-Injected: 1"}]}`), []string{"spec.headers[0]", "header X-Team: the value must not contain control characters"}},
		{"header value with LF", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"X-Ok","value":"a"},{"name":"X-Team","value":"a\nb"}]}`), []string{"spec.headers[1]", "header X-Team: the value must not contain control characters"}},
		{"header value with NUL", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"X-Team","value":"a\u0000b"}]}`), []string{"spec.headers[0]", "header X-Team: the value must not contain control characters"}},
		{"header value with DEL", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"X-Team","value":"a\u007fb"}]}`), []string{"spec.headers[0]", "header X-Team: the value must not contain control characters"}},
		{"header value with ESC", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"X-Team","value":"\u001b[31m"}]}`), []string{"spec.headers[0]", "header X-Team: the value must not contain control characters"}},
		{"header name with CR LF", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"X-Team\r\nX-Evil","value":"a"}]}`), []string{"spec.headers[0].name", `Invalid value: "X-Team\r\nX-Evil"`, "should match"}},
		{"header name with a space", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"X Team","value":"a"}]}`), []string{"spec.headers[0].name", `Invalid value: "X Team"`, "should match"}},
		{"header name from a Secret with LF", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headersFrom":[{"name":"Authorization\n","secretKeyRef":{"name":"s","key":"k"}}]}`), []string{"spec.headersFrom[0].name", `Invalid value: "Authorization\n"`, "should match"}},
		{"header value too long", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"X-Team","value":"` + strings.Repeat("v", 4097) + `"}]}`), []string{"spec.headers[0].value", "4096"}},
		{"header twice, differing in case", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"X-Team","value":"a"},{"name":"x-team","value":"b"}]}`), []string{"spec", "only once in headers and headersFrom"}},
		{"header in headers and headersFrom", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":[{"name":"Authorization","value":"a"}],"headersFrom":[{"name":"authorization","secretKeyRef":{"name":"s","key":"k"}}]}`), []string{"spec", "only once in headers and headersFrom"}},
		{"headers as a map", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headers":{"X-Team":"payments"}}`), []string{"spec.headers", "must be of type array"}},
		{"filter too long", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"filter":"` + strings.Repeat("x", 4097) + `"}`), []string{"spec.filter", "4096"}},
		{"empty filter", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"filter":""}`), []string{"spec.filter", "at least 1"}},
		{"empty transform", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"transform":{}}`), []string{"spec.transform", "needs a body expression, headers, or both"}},
		{"transform body too long", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"transform":{"body":"` + strings.Repeat("x", 4097) + `"}}`), []string{"spec.transform.body", "4096"}},
		{"transform reserved header", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"transform":{"headers":[{"name":"Webhook-Id","expression":"id"}]}}`), []string{"spec.transform.headers[0]", "header Webhook-Id: transform headers cannot set webhook-*", "dispatcher owns them"}},
		{"transform header not a token", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"transform":{"headers":[{"name":"X A","expression":"id"}]}}`), []string{"spec.transform.headers[0].name", `Invalid value: "X A"`, "should match"}},
		{"transform header with CR LF", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"transform":{"headers":[{"name":"X-A\r\nX-Evil","expression":"id"}]}}`), []string{"spec.transform.headers[0].name", "should match"}},
		{"transform header expression too long", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"transform":{"headers":[{"name":"X-A","expression":"` + strings.Repeat("x", 1025) + `"}]}}`), []string{"spec.transform.headers[0].expression", "1024"}},
		{"transform header expression empty", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"transform":{"headers":[{"name":"X-A","expression":""}]}}`), []string{"spec.transform.headers[0].expression", "at least 1"}},
		{"transform header twice, differing in case", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"transform":{"headers":[{"name":"X-A","expression":"id"},{"name":"x-a","expression":"type"}]}}`), []string{"spec.transform.headers", "only once in transform.headers"}},
		{"transform header the same name twice", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"transform":{"headers":[{"name":"X-A","expression":"id"},{"name":"X-A","expression":"type"}]}}`), []string{"spec.transform.headers[1]", "Duplicate value"}},
		{"transform headers as a map", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"transform":{"headers":{"X-A":"id"}}}`), []string{"spec.transform.headers", "must be of type array"}},
		{"transform header of headersFrom", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"headersFrom":[{"name":"Authorization","secretKeyRef":{"name":"s","key":"k"}}],"transform":{"headers":[{"name":"authorization","expression":"id"}]}}`), []string{"spec", "cannot set a header of headersFrom"}},
		{"maxInFlight zero", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"maxInFlight":0}`), []string{"spec.maxInFlight", "greater than or equal to 1"}},
		{"rate limit zero", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"rateLimit":{"requestsPerSecond":0}}`), []string{"spec.rateLimit.requestsPerSecond", "greater than or equal to 1"}},
		{"PerKey without key", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"ordering":{"mode":"PerKey"}}`), []string{"spec.ordering", "ordering.key is required"}},
		{"key with both sources", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"ordering":{"mode":"PerKey","key":{"header":"X-Key","jsonField":"id"}}}`), []string{"spec.ordering.key", "exactly one"}},
		{"cloudEventsMode of a raw format", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"format":{"type":"Raw","cloudEventsMode":"Structured"}}`), []string{"spec.format", "cloudEventsMode applies only to format type CloudEvents"}},
		{"unknown format", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"format":{"type":"Avro"}}`), []string{"spec.format.type", "Raw", "CloudEvents", "Slack", "Teams"}},
		{"a chat format with a transformed body", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"format":{"type":"Slack"},"transform":{"body":"payload"}}`), []string{"spec", "format Slack or Teams writes the request body from the event: transform.body cannot be set with it"}},
		{"unknown CloudEvents mode", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"format":{"type":"CloudEvents","cloudEventsMode":"Batched"}}`), []string{"spec.format.cloudEventsMode", "Binary", "Structured"}},
		{"unknown ordering mode", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"ordering":{"mode":"Strict"}}`), []string{"spec.ordering.mode", "BestEffort", "PerKey"}},
		{"replicas on shared dispatcher", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"dispatcher":{"replicas":3}}`), []string{"spec.dispatcher", "only to a dedicated dispatcher"}},
		{"rotation end without previous secret", ep(`{"url":"https://x.example.com/","eventTypes":["a"],"signing":{"secretRef":{"name":"s","key":"k"},"rotationEndsAt":"2030-01-01T00:00:00Z"}}`), []string{"spec.signing", "rotationEndsAt needs previousSecretRef"}},
		{"schedule and backoff", rp(`{"schedule":["0s","1m"],"backoff":{"strategy":"Linear"}}`), []string{"spec", "either schedule or backoff, not both"}},
		{"factor below 1", rp(`{"backoff":{"factor":0.5}}`), []string{"spec.backoff.factor", "factor must be a number from 1 to 10"}},
		{"factor above 10", rp(`{"backoff":{"factor":11}}`), []string{"spec.backoff.factor", "factor must be a number from 1 to 10"}},
		{"factor quoted", rp(`{"backoff":{"factor":"1.5"}}`), []string{"spec.backoff.factor", "must be of type number"}},
		{"factor not a number", rp(`{"backoff":{"factor":"two"}}`), []string{"spec.backoff.factor", "must be of type number"}},
		{"replay without endpoint", wr(`{}`), []string{"spec.endpointRef", "Required"}},
		{"replay of an unknown source", wr(`{"endpointRef":{"name":"crm"},"source":"Everything"}`), []string{"spec.source", "DeadLetters", "DeliveryLog"}},
		{"recover without since", wr(`{"endpointRef":{"name":"crm"},"source":"DeliveryLog"}`), []string{"spec", "source DeliveryLog needs since"}},
		{"recover with reasons", wr(`{"endpointRef":{"name":"crm"},"source":"DeliveryLog","since":"2026-07-19T09:00:00Z","reasons":["exhausted"]}`), []string{"spec", "apply only to source DeadLetters"}},
		{"replay until before since", wr(`{"endpointRef":{"name":"crm"},"since":"2026-07-19T10:00:00Z","until":"2026-07-19T09:00:00Z"}`), []string{"spec", "until must be later than since"}},
		{"replay of ids and since", wr(`{"endpointRef":{"name":"crm"},"deliveryIDs":["whdl_0123456789abcdefghjkmnpqrs"],"since":"2026-07-19T09:00:00Z"}`), []string{"spec", "leave out reasons, since and until"}},
		{"replay of a malformed id", wr(`{"endpointRef":{"name":"crm"},"deliveryIDs":["whdl_x.y"]}`), []string{"spec.deliveryIDs[0]", "should match"}},
		{"replay of an unknown reason", wr(`{"endpointRef":{"name":"crm"},"reasons":["bored"]}`), []string{"spec.reasons[0]", "exhausted"}},
		{"replay rate zero", wr(`{"endpointRef":{"name":"crm"},"ratePerSecond":0}`), []string{"spec.ratePerSecond", "greater than or equal to 1"}},
		{"jitterPercent without Additive", rp(`{"backoff":{"jitter":"Full","jitterPercent":10}}`), []string{"spec.backoff", "jitterPercent applies only to jitter: Additive"}},
		{"jitterPercent above 100", rp(`{"backoff":{"jitter":"Additive","jitterPercent":101}}`), []string{"spec.backoff.jitterPercent", "less than or equal to 100"}},
		{"maxRetryDuration zero", rp(`{"maxRetryDuration":"0s"}`), []string{"spec.maxRetryDuration", "between 1s and 720h"}},
		{"maxRetryDuration above 30 days", rp(`{"maxRetryDuration":"721h"}`), []string{"spec.maxRetryDuration", "between 1s and 720h"}},
		{"maxInterval below initialInterval", rp(`{"backoff":{"initialInterval":"10s","maxInterval":"5s"}}`), []string{"spec.backoff", "maxInterval must not be below initialInterval"}},
		{"failure rate above 100", rp(`{"autoDisable":{"failureRatePercent":101,"window":"72h","minAttempts":20}}`), []string{"spec.autoDisable.failureRatePercent", "less than or equal to 100"}},
		{"failure rate zero", rp(`{"autoDisable":{"failureRatePercent":0,"window":"72h","minAttempts":20}}`), []string{"spec.autoDisable.failureRatePercent", "greater than or equal to 1"}},
		{"failure rate without window", rp(`{"autoDisable":{"failureRatePercent":95}}`), []string{"spec.autoDisable", "needs window and minAttempts"}},
		{"empty autoDisable", rp(`{"autoDisable":{}}`), []string{"spec.autoDisable", "needs consecutiveFailures, failureRatePercent, or both"}},
		{"maxAttempts zero", rp(`{"maxAttempts":0}`), []string{"spec.maxAttempts", "greater than or equal to 1"}},
		{"maxAttempts above 100", rp(`{"maxAttempts":101}`), []string{"spec.maxAttempts", "less than or equal to 100"}},
		{"maxAttempts beyond schedule", rp(`{"maxAttempts":3,"schedule":["0s","1s"]}`), []string{"spec", "cannot exceed the number of waits"}},
		{"negative schedule wait", rp(`{"schedule":["0s","-30s"]}`), []string{"spec.schedule", "cannot be negative"}},
		{"schedule not starting at 0s", rp(`{"schedule":["5s","30s"]}`), []string{"spec.schedule", "must be 0s"}},
		{"too many schedule waits", rp(`{"schedule":[` + manyDurations(101) + `]}`), []string{"spec.schedule", "100"}},
		{"negative open duration", rp(`{"circuitBreaker":{"openDuration":"-1s"}}`), []string{"spec.circuitBreaker.openDuration", "must be positive"}},
		{"unknown jitter", rp(`{"backoff":{"jitter":"Some"}}`), []string{"spec.backoff.jitter", "Full", "Equal", "Additive", "None"}},
	}
	if len(cases) < 20 {
		t.Fatalf("the issue asks for at least 20 invalid objects, have %d", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := decode(t, tc.doc)
			u.SetNamespace(ns)
			err := k8s.Create(ctx, u)
			if err == nil {
				_ = k8s.Delete(ctx, u)
				t.Fatalf("accepted, want a rejection naming %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}

func manyEventTypes(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = `"t` + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `"`
	}
	return strings.Join(s, ",")
}

func manyDurations(n int) string {
	s := make([]string, n)
	for i := range s {
		s[i] = `"1s"`
	}
	return strings.Join(s, ",")
}

// `kubectl apply -f config/samples/` works as docs/spec/retrypolicy.md says, and `kubectl get whe` prints the
// printer columns.
func TestKubectlApplySamplesAndPrinterColumns(t *testing.T) {
	ns := namespace(t)
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(testenv.Kubectl(), append([]string{"--kubeconfig", kubeconfig, "-n", ns}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := kubectl("apply", "-f", filepath.Join(testenv.Root(), "config", "samples")+"/")
	for _, want := range []string{"webhookendpoint.webhook-operator.io/orders created", "retrypolicy.webhook-operator.io/payments-schedule created", "secret/orders-signing created"} {
		if !strings.Contains(out, want) {
			t.Errorf("apply output lacks %q:\n%s", want, out)
		}
	}
	header := strings.Fields(strings.SplitN(kubectl("get", "whe"), "\n", 2)[0])
	if got, want := strings.Join(header, " "), "NAME URL READY CIRCUIT SUCCESS PENDING AGE"; got != want {
		t.Errorf("kubectl get whe columns = %q, want %q", got, want)
	}
	wide := strings.Fields(strings.SplitN(kubectl("get", "whe", "-o", "wide"), "\n", 2)[0])
	if !strings.Contains(strings.Join(wide, " "), "DISABLED REASON") {
		t.Errorf("kubectl get whe -o wide columns = %v", wide)
	}
	if out := kubectl("get", "rp"); !strings.Contains(out, "payments-schedule") {
		t.Errorf("kubectl get rp:\n%s", out)
	}
}

// factor is a YAML number: 2 and 1.5 are accepted as users write them, stored as numbers, and
// read back by Go clients; a typed client writes it as a number too. (Out-of-range and quoted
// factors are in TestInvalidObjectsAreRejectedWithTheField.)
func TestBackoffFactorIsANumber(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	for name, doc := range map[string]string{
		"two":          `{"backoff":{"factor":2}}`,
		"one-and-half": `{"backoff":{"factor":1.5}}`,
		"ten":          `{"backoff":{"factor":10,"jitter":"Additive","jitterPercent":10}}`,
	} {
		u := decode(t, strings.Replace(strings.Replace(policyFmt, "%s", doc, 1), `"bad"`, `"`+name+`"`, 1))
		u.SetNamespace(ns)
		if err := k8s.Create(ctx, u); err != nil {
			t.Fatalf("%s %s refused: %v", name, doc, err)
		}
	}
	for name, want := range map[string]float64{"two": 2, "one-and-half": 1.5, "ten": 10} {
		var rp v1alpha1.RetryPolicy
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &rp); err != nil {
			t.Fatal(err)
		}
		if f, err := rp.Spec.Backoff.Factor.Float64(); err != nil || f != want {
			t.Errorf("%s: factor reads %q = %v (%v), want %v", name, rp.Spec.Backoff.Factor, f, err, want)
		}
	}
	// A typed client writes the factor as a number, which the API server accepts.
	typed := &v1alpha1.RetryPolicy{ObjectMeta: metav1.ObjectMeta{Name: "typed", Namespace: ns},
		Spec: v1alpha1.RetryPolicySpec{Backoff: &v1alpha1.BackoffSpec{Factor: "1.25"}}}
	if err := k8s.Create(ctx, typed); err != nil {
		t.Fatalf("typed client: %v", err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("RetryPolicy"))
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "typed"}, u); err != nil {
		t.Fatal(err)
	}
	if f, _, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "backoff", "factor"); f != 1.25 {
		t.Errorf("stored factor = %#v, want the number 1.25", f)
	}
}

// headers is a list of {name, value}: a tab in a value is fine, server-side apply merges the
// list by name, and `kubectl describe whe` prints the header's name as it is (a map's key
// X-Team used to print as "X - Team").
func TestHeadersAreANamedListThatDescribeReadsWell(t *testing.T) {
	ns := namespace(t)
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kubectl := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.Command(testenv.Kubectl(), append([]string{"--kubeconfig", kubeconfig, "-n", ns}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	kubectl(`apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: teams}
spec:
  url: https://x.example.com/
  eventTypes: [a]
  headers:
    - {name: X-Team, value: payments}
    - {name: X-Trace-Tags, value: "a	b"}
  transform:
    headers:
      - {name: X-Order-Id, expression: payload.order_id}
`, "apply", "--server-side", "--field-manager=team-a", "-f", "-")
	// Another manager adds one header: the list merges by name, nothing is replaced.
	kubectl(`apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: teams}
spec:
  headers:
    - {name: X-Region, value: eu}
  transform:
    headers:
      - {name: X-Type, expression: type}
`, "apply", "--server-side", "--field-manager=team-b", "-f", "-")
	var ep v1alpha1.WebhookEndpoint
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "teams"}, &ep); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, h := range ep.Spec.Headers {
		got[h.Name] = h.Value
	}
	if len(got) != 3 || got["X-Team"] != "payments" || got["X-Trace-Tags"] != "a\tb" || got["X-Region"] != "eu" {
		t.Errorf("headers after two server-side applies = %v", ep.Spec.Headers)
	}
	exprs := map[string]string{}
	for _, h := range ep.Spec.Transform.Headers {
		exprs[h.Name] = h.Expression
	}
	if len(exprs) != 2 || exprs["X-Order-Id"] != "payload.order_id" || exprs["X-Type"] != "type" {
		t.Errorf("transform.headers after two server-side applies = %v", ep.Spec.Transform.Headers)
	}
	out := kubectl("", "describe", "whe", "teams")
	for _, want := range []string{`Name:\s+X-Team\n\s+Value:\s+payments\n`, `Name:\s+X-Region\n\s+Value:\s+eu\n`,
		`Expression:\s+payload.order_id\n\s+Name:\s+X-Order-Id\n`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("kubectl describe whe lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "X - Team") {
		t.Errorf("kubectl describe whe splits the header name:\n%s", out)
	}
}

// A WebhookReplay is one replay: its spec cannot change after creation, and the API server
// says why; its status can.
func TestReplaySpecIsImmutable(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	u := decode(t, `{"apiVersion":"webhook-operator.io/v1alpha1","kind":"WebhookReplay","metadata":{"name":"fix-1"},"spec":{"endpointRef":{"name":"crm"}}}`)
	u.SetNamespace(ns)
	if err := k8s.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	var wr v1alpha1.WebhookReplay
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fix-1"}, &wr); err != nil {
		t.Fatal(err)
	}
	if wr.Spec.Source != v1alpha1.ReplayDeadLetters {
		t.Errorf("source default not stored: %q", wr.Spec.Source)
	}
	wr.Spec.Reasons = []v1alpha1.DeadLetterReason{"exhausted"}
	err := k8s.Update(ctx, &wr)
	if err == nil || !strings.Contains(err.Error(), "spec is immutable") || !strings.Contains(err.Error(), "create another WebhookReplay") {
		t.Errorf("changing the spec: %v, want a refusal saying it is immutable", err)
	}
}
