package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

// options are the demo's settings.
type options struct {
	dir, binDir, manifests string
	duration               time.Duration
	verbose                bool
}

// The demo's namespace and endpoints (hack/demo).
const (
	namespace       = "default"
	healthyEndpoint = "orders"
	failingEndpoint = "crm"
	// opsEndpoint receives the operational events (webhook_operator.*).
	opsEndpoint = "ops"
)

// event is one event the demo publishes.
type event struct {
	id, typ, data string
}

var events = []event{
	{"evt_demo_1", "order.created", `{"order_id":"ord_1001","total":42.50,"currency":"EUR"}`},
	{"evt_demo_2", "order.created", `{"order_id":"ord_1002","total":19.99,"currency":"EUR"}`},
	{"evt_demo_3", "order.paid", `{"order_id":"ord_1001","amount":42.50}`},
	{"evt_demo_4", "order.refund.requested", `{"order_id":"ord_1002","reason":"damaged"}`},
	{"evt_demo_5", "contact.created", `{"contact_id":"c_77","email":"ada@example.com"}`},
	{"evt_demo_6", "contact.updated", `{"contact_id":"c_77","phone":"+33 1 23 45 67 89"}`},
}

// demo is one run.
type demo struct {
	o       options
	out     io.Writer
	stack   *localstack.Stack
	kubectl string
	env     []string
	began   time.Time
	// receivers' URLs
	healthyURL, failingURL string
	opsURL                 string
	// traces says whether and where the dispatchers export traces.
	traces string
}

func run(ctx context.Context, o options) int {
	d := &demo{o: o, out: os.Stdout, began: time.Now()}
	if err := d.run(ctx); err != nil {
		if ctx.Err() != nil && o.duration == 0 {
			return 0 // Ctrl-C
		}
		fmt.Fprintf(os.Stderr, "\nwebhook-operator-demo: %v\n", err)
		return 1
	}
	return 0
}

func (d *demo) run(ctx context.Context) error {
	root := testenv.Root()
	if _, err := os.Stat(filepath.Join(root, "config", "crd", "bases")); err != nil {
		return fmt.Errorf("the CRDs are not in %s: run the demo from a checkout, with `make demo`", root)
	}
	if d.o.binDir == "" {
		d.o.binDir = filepath.Join(root, "bin")
	}
	if d.o.manifests == "" {
		d.o.manifests = filepath.Join(root, "hack", "demo")
	}
	binary := filepath.Join(d.o.binDir, "webhook-operator")
	d.kubectl = testenv.Kubectl()
	for _, b := range []string{binary, filepath.Join(d.o.binDir, "kubectl-webhooks"), d.kubectl} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s is missing: `make demo` builds it", b)
		}
	}
	unlock, err := prepareDir(d.o.dir)
	if err != nil {
		return err
	}
	defer unlock()

	runCtx := ctx
	if d.o.duration > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, d.o.duration)
		defer cancel()
	}

	d.title("webhook-operator demo: the whole product on this machine")
	fmt.Fprintf(d.out, "Everything lives in %s and listens on 127.0.0.1 only.\n", d.o.dir)
	if d.o.duration > 0 {
		fmt.Fprintf(d.out, "Bounded mode: at most %s, then it stops by itself.\n", d.o.duration)
	}
	d.step("Starting the local stack")
	fmt.Fprintln(d.out, "The controller runs with --allow-http --allowed-cidrs=127.0.0.0/8: the demo's receivers are")
	fmt.Fprintln(d.out, "plain-HTTP servers on loopback, which the operator refuses by default (HTTPS only, no")
	fmt.Fprintln(d.out, "private, loopback or link-local addresses).")
	var output io.Writer
	if d.o.verbose {
		output = os.Stdout
	}
	otelArgs := d.tracing()
	d.stack, err = localstack.Start(runCtx, localstack.Options{
		Dir:            d.o.dir,
		Binary:         binary,
		ControllerArgs: append([]string{"--allow-http", "--allowed-cidrs=127.0.0.0/8"}, otelArgs...),
		Logf:           d.logf,
		Output:         output,
		Ingress:        true,
		APIServer:      true,
		Console:        true,
	})
	if err != nil {
		return err
	}
	defer d.stop()
	d.env = append(cleanEnv(),
		"KUBECONFIG="+d.stack.Kubeconfig,
		"PATH="+d.o.binDir+string(os.PathListSeparator)+filepath.Dir(d.kubectl)+string(os.PathListSeparator)+os.Getenv("PATH"))

	healthy, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: testenv.SecretKey(d.stack.Client, namespace, "orders-signing", "secret")})
	if err != nil {
		return err
	}
	defer healthy.Close()
	failing, err := testenv.NewReceiver(testenv.ReceiverOptions{Respond: testenv.Failing})
	if err != nil {
		return err
	}
	defer failing.Close()
	ops, err := testenv.NewReceiver(testenv.ReceiverOptions{Secrets: testenv.SecretKey(d.stack.Client, namespace, names.SigningSecret(opsEndpoint), names.SigningSecretKey)})
	if err != nil {
		return err
	}
	defer ops.Close()
	d.healthyURL, d.failingURL, d.opsURL = healthy.URL(), failing.URL(), ops.URL()
	d.logf("receiver verifying Standard Webhooks signatures (secret orders-signing) at %s", healthy.URL())
	d.logf("receiver failing on purpose (always 503) at %s", failing.URL())

	d.step("Applying hack/demo (the samples, pointed at the local receivers)")
	manifest, err := d.manifest(map[string]string{"RECEIVER_URL": healthy.URL(), "FAILING_RECEIVER_URL": failing.URL(), "OPS_RECEIVER_URL": ops.URL()})
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "RECEIVER_URL=%s FAILING_RECEIVER_URL=%s OPS_RECEIVER_URL=%s\n", healthy.URL(), failing.URL(), ops.URL())
	if err := d.show(runCtx, manifest, "kubectl", "apply", "-f", "-"); err != nil {
		return err
	}
	d.step("Waiting for the endpoints to be Ready (wired to JetStream, dispatcher available)")
	if err := d.show(runCtx, nil, "kubectl", "wait", "--for=condition=Ready", "whe/"+healthyEndpoint, "whe/"+failingEndpoint, "whe/"+opsEndpoint, "--timeout=120s"); err != nil {
		return err
	}

	d.step("Publishing events through the ingress with curl (order.* go to orders, contact.* to crm)")
	if err := d.publishWithCurl(runCtx); err != nil {
		return err
	}

	d.step("Waiting for the deliveries and the dead letters")
	var want []string
	for _, e := range events {
		if strings.HasPrefix(e.typ, "order.") {
			want = append(want, e.id)
		}
	}
	checkErr := d.waitFor(runCtx, 90*time.Second, func() (bool, string) {
		got := healthy.Received()
		dl := d.deadLetters(runCtx)
		opsGot := len(opsEvents(ops))
		return containsAll(got, want) && dl >= 2 && opsGot > 0,
			fmt.Sprintf("orders received %d of %d events, crm has %d of 2 dead letters, ops received %d operational events", countIn(got, want), len(want), dl, opsGot)
	})
	if checkErr == nil {
		// The dispatcher writes health at a bounded rate: wait until status shows it.
		_ = d.waitFor(runCtx, 30*time.Second, func() (bool, string) {
			o, c := d.health(runCtx, healthyEndpoint), d.health(runCtx, failingEndpoint)
			return o != nil && c != nil && o.Delivered >= int64(len(want)) && c.DeadLettered >= 2,
				"status.health not yet written"
		})
	}
	if runCtx.Err() != nil {
		return d.result(checkErr)
	}

	d.step("What a user sees")
	d.show(runCtx, nil, "kubectl", "get", "whe,rp")
	d.show(runCtx, nil, "kubectl", "describe", "whe", healthyEndpoint)
	d.show(runCtx, nil, "kubectl", "describe", "whe", failingEndpoint)
	d.show(runCtx, nil, "kubectl", "webhooks", "status")
	d.show(runCtx, nil, "kubectl", "webhooks", "log", healthyEndpoint)
	d.show(runCtx, nil, "kubectl", "webhooks", "log", failingEndpoint)
	d.show(runCtx, nil, "kubectl", "webhooks", "dlq", "list", failingEndpoint)
	fmt.Fprintf(d.out, "\nThe same deliveries and dead letters as Kubernetes resources (the data API, docs/deliveries-api.md):\n")
	d.show(runCtx, nil, "kubectl", "get", "webhookdeliveries", "--field-selector", "spec.endpoint="+healthyEndpoint)
	d.show(runCtx, nil, "kubectl", "get", "webhookdeliveries", "--field-selector", "spec.endpoint="+failingEndpoint+",status.state=DeadLettered")
	d.show(runCtx, nil, "kubectl", "get", "webhookdeadletters")
	if id := d.firstDeadLetter(runCtx); id != "" {
		d.show(runCtx, nil, "kubectl", "webhooks", "dlq", "show", id)
	}
	fmt.Fprintf(d.out, "\nOperational events (webhook_operator.*) delivered to the ops endpoint, signed like any other:\n")
	d.show(runCtx, nil, "kubectl", "webhooks", "log", opsEndpoint)
	for _, b := range opsEvents(ops) {
		fmt.Fprintf(d.out, "  %s\n", b)
	}
	st := healthy.Stats()
	fmt.Fprintf(d.out, "\nThe verifying receiver got %d requests: %d events (%d unique), %d with a bad signature.\n",
		st.Requests, st.Accepted, st.Unique, st.BadSignatures)
	fmt.Fprintf(d.out, "The failing receiver answered 503 to %d requests.\n", failing.Stats().Refused)

	if d.o.duration > 0 {
		return d.result(checkErr)
	}
	if checkErr != nil {
		fmt.Fprintf(d.out, "\nWARNING: %v\n", checkErr)
	}
	d.usage()
	<-ctx.Done()
	fmt.Fprintln(d.out, "\nCtrl-C: stopping")
	return nil
}

// result ends a bounded run.
func (d *demo) result(checkErr error) error {
	d.title("Result")
	if checkErr != nil {
		return fmt.Errorf("FAILED after %s: %w (logs in %s)", time.Since(d.began).Round(time.Second), checkErr, filepath.Join(d.o.dir, "logs"))
	}
	fmt.Fprintf(d.out, "PASSED in %s: orders delivered every event, crm has dead letters, ops received operational events.\n", time.Since(d.began).Round(time.Second))
	return nil
}

func (d *demo) stop() {
	began := time.Now()
	_ = d.stack.Stop()
	left, _ := localstack.Descendants(os.Getpid())
	if len(left) > 0 {
		fmt.Fprintf(d.out, "stopped in %s, but processes remain: %v\n", time.Since(began).Round(time.Millisecond), left)
		return
	}
	fmt.Fprintf(d.out, "Stopped in %s: no process left behind.\n", time.Since(began).Round(time.Millisecond))
}

// usage tells how to use the running stack.
func (d *demo) usage() {
	d.title("The stack is running: try it")
	bin := d.o.binDir
	fmt.Fprintf(d.out, `In another terminal:

  export KUBECONFIG=%s
  export PATH=%s:%s:$PATH

The console (docs/console.md): %s
  sign in with a token, e.g. the stack's admin's: kubectl create token %s -n %s
  (the console calls the Kubernetes API with it: RBAC decides what it shows and allows)

The ingress: %s (POST /v1/namespaces/<ns>/events and /cloudevents; docs/ingress.md),
for any ServiceAccount token of audience %s whose RBAC allows create on webhookevents:

  AUTH=$(mktemp)   # 0600: the token stays off command lines (ps) and out of others' reach
  kubectl create token %s --audience %s | sed 's/^/Authorization: Bearer /' > "$AUTH"
  curl -sS -H @"$AUTH" -H 'Content-Type: application/json' \
    --data '{"id":"evt_try_1","type":"order.created","data":{"order_id":"ord_3001"}}' \
    %s/v1/namespaces/%s/events
  kubectl create token %s --audience %s | kubectl webhooks publish order.paid --via http \
    --data '{"order_id":"ord_3001"}' --ingress-token-file /dev/stdin \
    --ingress-url %s --ingress-allow-plaintext-tokens   # plain HTTP: this loopback demo only

NATS JetStream: %s (kubectl webhooks finds it in the Secret
webhook-operator-system/webhook-operator-nats, as after helm install). It runs with
the auth callout: kubectl webhooks connects as your kubeconfig's user (its token), the
dispatchers with their ServiceAccounts' projected tokens, each with its namespace's
permissions only (docs/multi-tenancy.md).

  kubectl get whe -o wide
  kubectl webhooks publish order.created --data '{"order_id":"ord_2001","total":7}'
  kubectl webhooks log orders --limit 5
  kubectl webhooks dlq list crm
  kubectl get webhookdeliveries --field-selector spec.endpoint=orders,status.state=Succeeded
  kubectl get webhookdeliveries -w                # outcomes as they are logged
  kubectl get webhookdeadletters -o wide          # kubectl explain webhookdelivery.status
  kubectl webhooks replay crm --all --idempotency-key try-1 --wait   # a WebhookReplay: kubectl get whr
  kubectl webhooks publish contact.created --data '{"contact_id":"c_1"}'   # a few: crm's circuit opens
  kubectl get deploy,sa,role,rolebinding -l app.kubernetes.io/managed-by=webhook-operator
  kubectl apply -f config/samples/   # the samples as shipped (their https://*.example.com URLs stay unreachable)

Logs: %s (controller.log, callout.log, one file per dispatcher pod)
Receivers: verifying %s (orders), failing %s (crm), operational events %s (ops)

Operational events (docs/operational-events.md): endpoint disabled/enabled, circuit
opened/half-open/closed, dead letters, replays, published on webhooks.default.webhook_operator.>
and delivered to the ops endpoint (hack/demo/12-ops.yaml):
  kubectl webhooks log ops
  for i in 1 2 3 4; do kubectl webhooks publish contact.created --data '{"contact_id":"c_'$i'"}'; done
  kubectl webhooks log ops --limit 5        # crm's circuit opened, its dead letters
  kubectl webhooks enable crm               # once disabled: endpoint.enabled

Traces (docs/tracing.md): %s

Dashboard and alerts: the chart ships them (off by default):
  helm install ... --set grafana.dashboards.enabled=true --set prometheusRule.enabled=true
  dashboard charts/webhook-operator/dashboards/webhook-operator.json, alerts in
  charts/webhook-operator/templates/prometheusrule.yaml, runbooks in docs/runbooks.md.
  The metrics they read:
  controller %s
  dispatcher %s

Ctrl-C stops everything.
`, d.stack.Kubeconfig, bin, filepath.Dir(d.kubectl), d.stack.ConsoleURL, localstack.AdminServiceAccount, localstack.OperatorNamespace,
		d.stack.IngressURL, ingress.DefaultAudience, localstack.ProducerServiceAccount, ingress.DefaultAudience, d.stack.IngressURL, namespace,
		localstack.ProducerServiceAccount, ingress.DefaultAudience, d.stack.IngressURL,
		d.stack.NATSURL, filepath.Join(d.o.dir, "logs"),
		d.healthyURL, d.failingURL, d.opsURL, d.traces, d.stack.ControllerMetricsURL(),
		strings.Join(d.stack.Runner.MetricsURLs(namespace, names.SharedDispatcher), " "))
}

// publishWithCurl publishes the demo's events as a producer Pod would, with one HTTP call
// each: a token of its ServiceAccount (webhook-producer, bound to webhook-operator-producer in
// the namespace) for the ingress's audience, and curl. The token goes to curl as a header file
// (-H @file, mode 0600), never on a command line where ps shows it to every user of the
// machine. It prints the commands as a user types them; the token itself is not printed.
func (d *demo) publishWithCurl(ctx context.Context) error {
	if _, err := d.stack.Producer(ctx, namespace); err != nil {
		return err
	}
	args := []string{"create", "token", localstack.ProducerServiceAccount, "--audience", ingress.DefaultAudience}
	fmt.Fprintf(d.out, "\n$ AUTH=$(mktemp)\n$ kubectl %s | sed 's/^/Authorization: Bearer /' > \"$AUTH\"\n", quoteArgs(args))
	out, err := d.command(ctx, nil, "kubectl", args...)
	if err != nil {
		d.out.Write(out)
		return fmt.Errorf("kubectl create token: %w", err)
	}
	auth := filepath.Join(d.o.dir, "ingress-auth")
	if err := os.WriteFile(auth, []byte("Authorization: Bearer "+strings.TrimSpace(string(out))+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(auth)
	url := d.stack.IngressURL + "/v1/namespaces/" + namespace + "/events"
	for _, e := range events {
		body := fmt.Sprintf(`{"id":%q,"type":%q,"data":%s}`, e.id, e.typ, e.data)
		shown := []string{"-sS", "-H", "@$AUTH", "-H", "Content-Type: application/json", "--data", body, url}
		fmt.Fprintf(d.out, "\n$ curl %s\n", strings.Replace(quoteArgs(shown), "'@$AUTH'", `@"$AUTH"`, 1))
		run := append([]string{"--fail-with-body"}, shown...)
		run[3] = "@" + auth
		out, err := d.command(ctx, nil, "curl", run...)
		d.out.Write(out)
		if err != nil {
			return fmt.Errorf("publishing %s through the ingress: %w", e.id, err)
		}
	}
	return nil
}

// manifest reads hack/demo/*.yaml in name order, filling in ${NAME} from vars.
func (d *demo) manifest(vars map[string]string) ([]byte, error) {
	files, err := filepath.Glob(filepath.Join(d.o.manifests, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no manifests in %s", d.o.manifests)
	}
	sort.Strings(files)
	var b bytes.Buffer
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var missing []string
		text := os.Expand(string(raw), func(k string) string {
			v, ok := vars[k]
			if !ok {
				missing = append(missing, k)
			}
			return v
		})
		if len(missing) > 0 {
			return nil, fmt.Errorf("%s uses unknown variables %v", f, missing)
		}
		fmt.Fprintf(&b, "---\n%s\n", text)
	}
	return b.Bytes(), nil
}

// show runs a command as a user would type it, printing it and its output.
func (d *demo) show(ctx context.Context, stdin []byte, name string, args ...string) error {
	fmt.Fprintf(d.out, "\n$ %s %s\n", name, quoteArgs(args))
	out, err := d.command(ctx, stdin, name, args...)
	d.out.Write(out)
	if err != nil {
		fmt.Fprintf(d.out, "(%v)\n", err)
	}
	return err
}

// command runs kubectl (or kubectl webhooks) against the stack and returns its output.
func (d *demo) command(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	path := name
	if name == "kubectl" {
		path = d.kubectl
	}
	cctx, cancel := context.WithTimeout(ctx, 150*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, path, args...)
	cmd.Env = d.env
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	return cmd.CombinedOutput()
}

// deadLetters counts crm's dead letters with the plugin.
func (d *demo) deadLetters(ctx context.Context) int {
	var page struct {
		Data []struct {
			DeliveryID string `json:"deliveryId"`
		} `json:"data"`
	}
	out, err := d.command(ctx, nil, "kubectl", "webhooks", "dlq", "list", failingEndpoint, "-o", "json")
	if err != nil || json.Unmarshal(out, &page) != nil {
		return 0
	}
	return len(page.Data)
}

func (d *demo) firstDeadLetter(ctx context.Context) string {
	var page struct {
		Data []struct {
			DeliveryID string `json:"deliveryId"`
		} `json:"data"`
	}
	out, err := d.command(ctx, nil, "kubectl", "webhooks", "dlq", "list", failingEndpoint, "-o", "json")
	if err != nil || json.Unmarshal(out, &page) != nil || len(page.Data) == 0 {
		return ""
	}
	return page.Data[0].DeliveryID
}

func (d *demo) health(ctx context.Context, name string) *v1alpha1.DeliveryHealth {
	ep := &v1alpha1.WebhookEndpoint{}
	if err := d.stack.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, ep); err != nil {
		return nil
	}
	return ep.Status.Health
}

// waitFor polls cond every half second until it holds, timeout passes or ctx ends.
func (d *demo) waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		if state != last {
			d.logf("%s", state)
			last = state
		}
		if time.Now().After(deadline) {
			return errors.New(state)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s (%w)", state, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (d *demo) title(s string) {
	fmt.Fprintf(d.out, "\n==== %s ====\n", s)
}

func (d *demo) step(s string) {
	fmt.Fprintf(d.out, "\n---- %s\n", s)
}

func (d *demo) logf(format string, args ...any) {
	fmt.Fprintf(d.out, "  [%6.1fs] %s\n", time.Since(d.began).Seconds(), fmt.Sprintf(format, args...))
}

// prepareDir empties dir (keeping it) and locks it against a second demo using it.
func prepareDir(dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("another demo is running in %s (set DEMO_DIR to run a second one)", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		lock.Close()
		return nil, err
	}
	for _, e := range entries {
		if e.Name() != ".lock" {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				lock.Close()
				return nil, err
			}
		}
	}
	return func() { lock.Close() }, nil
}

// cleanEnv is the environment without what would point kubectl and the plugin elsewhere.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "KUBECONFIG" || k == "PATH" || strings.HasPrefix(k, "NATS_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " '\"{}$*><|&;") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

func containsAll(got, want []string) bool { return countIn(got, want) == len(want) }

func countIn(got, want []string) int {
	set := map[string]bool{}
	for _, g := range got {
		set[g] = true
	}
	n := 0
	for _, w := range want {
		if set[w] {
			n++
		}
	}
	return n
}

// tracing passes the demo's own OTEL_* environment to the dispatchers, through the controller's
// --dispatcher-otel-env flags as the chart's tracing values do, and says where traces go.
func (d *demo) tracing() []string {
	var args []string
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); controllers.IsOTELEnvName(name) {
			// The controller refuses what would show a secret in every dispatcher's pod
			// template; the demo has no Secret to take it from.
			if why := controllers.OTELSecretOnly(name); why != "" {
				fmt.Fprintf(d.out, "Traces: %s is not passed to the dispatchers: %s\n", name, why)
				continue
			}
			args = append(args, "--dispatcher-otel-env="+kv)
		}
	}
	set, err := tracing.ReadSettings(os.Getenv)
	switch {
	case err != nil:
		d.traces = "off: " + err.Error()
	case set.Enabled:
		endpoint := os.Getenv(tracing.EnvTracesEndpoint)
		if endpoint == "" {
			endpoint = os.Getenv(tracing.EnvEndpoint)
		}
		d.traces = fmt.Sprintf("on: every delivery attempt is a span (webhook.attempt), exported with OTLP %s to %s by the dispatchers", set.Protocol, endpoint)
	default:
		d.traces = "off. To see them, run an OTLP collector or Jaeger (OTLP/HTTP on 127.0.0.1:4318) and start the demo with\n" +
			"  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 make demo\n" +
			"  then find service webhook-dispatcher, spans webhook.attempt (webhook.endpoint, webhook.delivery_id, webhook.outcome...)"
	}
	fmt.Fprintf(d.out, "Traces: %s\n", d.traces)
	return args
}

// opsEvents summarises the operational events a receiver got, one line each.
func opsEvents(r *testenv.Receiver) []string {
	var out []string
	for _, req := range r.Requests() {
		var ev records.OpsEvent
		if json.Unmarshal(req.Body, &ev) != nil || !records.IsOpsType(ev.Type) {
			continue
		}
		what := fmt.Sprint(ev.Data["message"])
		if ev.Type == records.OpsDeliveryDeadLettered {
			what = fmt.Sprintf("%v dead letter(s) %v", ev.Data["count"], ev.Data["reasons"])
		}
		out = append(out, fmt.Sprintf("%s %s/%s: %s", ev.Type, ev.Namespace, ev.Endpoint, what))
	}
	return out
}
