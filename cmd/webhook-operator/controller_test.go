package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/webhook-operator/webhook-operator/controllers"
)

// parseControllerFlags parses args after --metrics-secure=false, unless they say how metrics
// are served (secure metrics need the scraper CA's Secret: TestControllerMetricsCAFlags).
func parseControllerFlags(t *testing.T, args ...string) (*controllerFlags, error) {
	t.Helper()
	t.Setenv("OPERATOR_IMAGE", "ghcr.io/webhook-operator/webhook-operator:v1")
	f := newControllerFlags()
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	f.add(fs)
	if !slices.ContainsFunc(args, func(a string) bool {
		return strings.HasPrefix(a, "--metrics-secure") || strings.HasPrefix(a, "--dispatcher-metrics-ca-secret")
	}) {
		args = append([]string{"--metrics-secure=false"}, args...)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return f, nil
}

func TestControllerFlagsDefaults(t *testing.T) {
	f, err := parseControllerFlags(t)
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.options()
	if err != nil {
		t.Fatal(err)
	}
	if o.DispatcherImage != "ghcr.io/webhook-operator/webhook-operator:v1" {
		t.Errorf("image defaults to $OPERATOR_IMAGE, got %q", o.DispatcherImage)
	}
	r := o.DispatcherResources
	if r.Requests.Cpu().String() != "100m" || r.Requests.Memory().String() != "64Mi" || r.Limits.Memory().String() != "256Mi" {
		t.Errorf("resources: %v", r)
	}
	if r.Limits.Cpu().String() != "1" {
		t.Errorf("CPU limit %s by default, want 1", r.Limits.Cpu())
	}
	if c := o.DispatcherCaps; c.MaxReplicas != 10 || c.MaxResources.Cpu().String() != "2" || c.MaxResources.Memory().String() != "1Gi" {
		t.Errorf("dedicated dispatchers' caps %+v, want 10 replicas, 2 CPUs, 1Gi", c)
	}
	if o.DispatcherReplicas != 1 || f.metricsAddr != ":8080" || f.probeAddr != ":8081" || f.leaderElect {
		t.Errorf("defaults: %+v", f)
	}
	if o.ReplayTTL != 24*time.Hour {
		t.Errorf("completed replays kept %s by default, want 24h", o.ReplayTTL)
	}
	f, _ = parseControllerFlags(t, "--replay-ttl=0")
	if o, err := f.options(); err != nil || o.ReplayTTL != 0 {
		t.Errorf("--replay-ttl=0: %v, %v; want kept forever", o, err)
	}
	if o.Autoscaling != nil {
		t.Errorf("autoscaling is off by default, got %+v", o.Autoscaling)
	}
	if want := []string{"kube-system", "kube-public", "kube-node-lease"}; !slices.Equal(o.ExcludedNamespaces, want) {
		t.Errorf("excluded namespaces %v by default, want %v", o.ExcludedNamespaces, want)
	}
	f, _ = parseControllerFlags(t, "--excluded-namespaces=")
	if o, err := f.options(); err != nil || len(o.ExcludedNamespaces) != 0 {
		t.Errorf("--excluded-namespaces=: %v, %v; want none (the controller's own namespace stays excluded)", o, err)
	}
}

// --autoscaling turns on the dispatchers' ScaledObjects with the defaults of the other
// autoscaling flags.
func TestControllerAutoscalingFlags(t *testing.T) {
	f, err := parseControllerFlags(t, "--autoscaling", "--autoscaling-nats-monitoring-endpoint=nats.nats.svc:8222", "--autoscaling-max-replicas=6")
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.options()
	if err != nil {
		t.Fatal(err)
	}
	want := controllers.DefaultAutoscaling()
	want.MonitoringEndpoint, want.MaxReplicas = "nats.nats.svc:8222", 6
	if o.Autoscaling == nil || *o.Autoscaling != want {
		t.Errorf("autoscaling %+v, want %+v", o.Autoscaling, want)
	}
}

func TestControllerFlagsAreValidated(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dispatcher-image="}, "--dispatcher-image is required"},
		{[]string{"--dispatcher-replicas=0"}, "--dispatcher-replicas must be 1 to 20"},
		{[]string{"--dispatcher-cpu-request=lots"}, "--dispatcher-cpu-request must be a positive quantity"},
		{[]string{"--dispatcher-memory-request=512Mi"}, "memory request (512Mi) exceeds its limit (256Mi)"},
		{[]string{"--dispatcher-max-replicas=21"}, "--dispatcher-max-replicas must be 1 to 20"},
		{[]string{"--dispatcher-replicas=4", "--dispatcher-max-replicas=3"}, "the dispatchers' default size exceeds the installation's caps: 4 replicas exceed the cap of 3"},
		{[]string{"--dispatcher-cpu-limit=4"}, "the cpu limit 4 exceeds the cap of 2"},
		{[]string{"--dispatcher-max-memory=lots"}, "--dispatcher-max-memory must be a positive quantity"},
		{[]string{"--max-concurrent-reconciles=0"}, "--max-concurrent-reconciles must be at least 1"},
		{[]string{"--replay-ttl=-1h"}, "--replay-ttl must be 0 (keep completed replays) or more"},
		{[]string{"--nats-url="}, "--nats-url is required"},
		{[]string{"--nats-credentials-secret=just-a-name"}, "--nats-credentials-secret must be namespace/name"},
		{[]string{"--excluded-namespaces=kube-system,Kube_Public"}, `--excluded-namespaces: "Kube_Public" is not a namespace name`},
		{[]string{"--autoscaling"}, "--autoscaling: autoscaling needs the NATS monitoring endpoint"},
		{[]string{"--autoscaling", "--autoscaling-nats-monitoring-endpoint=n:8222", "--autoscaling-lag-threshold=0"}, "lag threshold must be positive"},
		{[]string{"--autoscaling", "--autoscaling-nats-monitoring-endpoint=n:8222", "--autoscaling-max-replicas=0"}, "maximum must be 1 to 100 replicas"},
	} {
		f, err := parseControllerFlags(t, c.args...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if _, err := f.options(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}

// The flags the Helm chart and config/manager templates rely on exist under these names.
func TestControllerFlagNames(t *testing.T) {
	cmd := controllerCommand()
	for _, name := range []string{
		"nats-url", "nats-credentials-secret", "dispatcher-image", "dispatcher-replicas",
		"dispatcher-cpu-request", "dispatcher-memory-request", "dispatcher-cpu-limit", "dispatcher-memory-limit",
		"leader-elect", "leader-election-namespace", "metrics-bind-address", "health-probe-bind-address",
		"max-concurrent-reconciles", "max-endpoints-per-namespace", "replay-ttl", "allow-http", "allowed-cidrs", "blocked-cidrs", "allow-cross-namespace-sources",
		"events-max-age", "attempts-max-age", "dead-letter-max-age", "zap-log-level", "kubeconfig",
		"autoscaling", "autoscaling-nats-monitoring-endpoint", "autoscaling-nats-monitoring-https", "autoscaling-nats-account",
		"autoscaling-max-replicas", "autoscaling-lag-threshold", "autoscaling-polling-interval",
		"excluded-namespaces", "dispatcher-max-replicas", "dispatcher-max-cpu", "dispatcher-max-memory",
		"dispatcher-otel-env", "dispatcher-otel-env-secret", "pprof-bind-address",
	} {
		if cmd.Flags().Lookup(name) == nil {
			t.Errorf("no --%s flag", name)
		}
	}
}

// Secure metrics (the default) need the scraper CA's Secret, of the controller's namespace,
// whose certificate the dispatchers accept client certificates of; plain metrics do not.
func TestControllerMetricsCAFlags(t *testing.T) {
	f, err := parseControllerFlags(t, "--metrics-secure=true")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.options(); err == nil || !strings.Contains(err.Error(), "--metrics-secure needs --dispatcher-metrics-ca-secret") {
		t.Errorf("secure metrics without a scraper CA: %v", err)
	}
	f, _ = parseControllerFlags(t, "--dispatcher-metrics-ca-secret=scraper-ca")
	if _, err := f.options(); err == nil || !strings.Contains(err.Error(), "--dispatcher-metrics-ca-secret needs the controller's own namespace") {
		t.Errorf("a scraper CA Secret without the controller's namespace: %v", err)
	}
	t.Setenv("POD_NAMESPACE", "webhook-operator-system")
	f, _ = parseControllerFlags(t, "--dispatcher-metrics-ca-secret=scraper-ca", "--dispatcher-metrics-client-name=prometheus")
	o, err := f.options()
	if err != nil {
		t.Fatal(err)
	}
	if o.DispatcherMetricsCA.String() != "webhook-operator-system/scraper-ca" || o.DispatcherMetricsClientName != "prometheus" || !o.Config.MetricsSecure {
		t.Errorf("scraper CA %s, name %q, secure %v", o.DispatcherMetricsCA, o.DispatcherMetricsClientName, o.Config.MetricsSecure)
	}
	f, _ = parseControllerFlags(t, "--dispatcher-metrics-ca-secret=Not_A_Name")
	if _, err := f.options(); err == nil || !strings.Contains(err.Error(), "--dispatcher-metrics-ca-secret=") {
		t.Errorf("a scraper CA Secret of a bad name: %v", err)
	}
	f, _ = parseControllerFlags(t, "--metrics-secure=false")
	if o, err := f.options(); err != nil || o.DispatcherMetricsCA.Name != "" {
		t.Errorf("plain metrics: %v, %v", o, err)
	}
}

// config/manager/manager.yaml runs the controller with arguments it accepts (in its own
// namespace, which the manifest gives it as POD_NAMESPACE).
func TestManagerManifestArgumentsAreValid(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "webhook-operator-system")
	raw, err := os.ReadFile(filepath.Join("..", "..", "config", "manager", "manager.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var d appsv1.Deployment
		if err := dec.Decode(&d); err != nil {
			if err == io.EOF {
				t.Fatal("no controller Deployment in manager.yaml")
			}
			t.Fatal(err)
		}
		if d.Kind != "Deployment" {
			continue
		}
		c := d.Spec.Template.Spec.Containers[0]
		if len(c.Args) == 0 || c.Args[0] != "controller" {
			t.Fatalf("the container runs %v, want the controller subcommand", c.Args)
		}
		for _, e := range c.Env {
			if e.Name == "OPERATOR_IMAGE" && e.Value != c.Image {
				t.Errorf("OPERATOR_IMAGE %q differs from the image %q: dispatchers would run another version", e.Value, c.Image)
			}
		}
		f, err := parseControllerFlags(t, c.Args[1:]...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.options(); err != nil {
			t.Fatal(err)
		}
		return
	}
}

// --dispatcher-otel-env passes OTEL_* variables to every dispatcher, in order; any other name
// (which could override a dispatcher's identity or NATS credentials) and a name given twice
// are refused.
func TestControllerDispatcherOTELEnvFlag(t *testing.T) {
	f, err := parseControllerFlags(t, "--dispatcher-otel-env=OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4317",
		"--dispatcher-otel-env=OTEL_RESOURCE_ATTRIBUTES=deployment.environment=prod,team=payments")
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.options()
	if err != nil {
		t.Fatal(err)
	}
	if len(o.DispatcherOTELEnv) != 2 || o.DispatcherOTELEnv[0].Name != "OTEL_EXPORTER_OTLP_ENDPOINT" || o.DispatcherOTELEnv[0].Value != "http://otel-collector:4317" ||
		o.DispatcherOTELEnv[1].Value != "deployment.environment=prod,team=payments" {
		t.Fatalf("dispatcher OTEL env %+v", o.DispatcherOTELEnv)
	}
	for _, bad := range [][]string{{"--dispatcher-otel-env=NATS_TOKEN=x"}, {"--dispatcher-otel-env=OTEL_SERVICE_NAME"},
		{"--dispatcher-otel-env=OTEL_A=1", "--dispatcher-otel-env=OTEL_A=2"}, {"--dispatcher-otel-env-secret=Not_A_Name"}} {
		f, err := parseControllerFlags(t, bad...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.options(); err == nil || !strings.Contains(err.Error(), "--dispatcher-otel-env") {
			t.Errorf("%v: error %v, want one naming --dispatcher-otel-env", bad, err)
		}
	}
}

// Values that would put a secret into every dispatcher's pod template (the collector's
// headers, certificate and key files) are refused in --dispatcher-otel-env, with the flag that
// takes them from a Secret instead; --dispatcher-otel-env-secret names a Secret of the
// controller's own namespace.
func TestControllerDispatcherOTELSecrets(t *testing.T) {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_CLIENT_KEY",
		"OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE"} {
		f, err := parseControllerFlags(t, "--dispatcher-otel-env="+name+"=authorization=Bearer s3cret")
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.options()
		if err == nil || !strings.Contains(err.Error(), "--dispatcher-otel-env sets "+name+", refused") || !strings.Contains(err.Error(), "--dispatcher-otel-env-secret") {
			t.Errorf("%s: error %v, want a refusal naming --dispatcher-otel-env-secret", name, err)
		}
	}
	t.Setenv("POD_NAMESPACE", "webhook-operator-system")
	f, err := parseControllerFlags(t, "--dispatcher-otel-env-secret=otel-collector-auth")
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.options()
	if err != nil {
		t.Fatal(err)
	}
	if got := o.DispatcherOTELSecret.String(); got != "webhook-operator-system/otel-collector-auth" {
		t.Errorf("tracing Secret %s, want webhook-operator-system/otel-collector-auth", got)
	}
}

func TestControllerEgressProxyFlags(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "webhook-operator-system")
	f, err := parseControllerFlags(t, "--egress-proxy-credentials-secret=egress-proxy")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.options(); err == nil || !strings.Contains(err.Error(), "--egress-proxy-credentials-secret needs --egress-proxy") {
		t.Fatalf("credentials without a proxy: %v", err)
	}
	f, err = parseControllerFlags(t, "--egress-proxy=http://u:p@proxy.egress:3128")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.options(); err == nil || !strings.Contains(err.Error(), "--egress-proxy: the proxy URL carries user-info") {
		t.Fatalf("credentials in the proxy URL: %v", err)
	}
	f, err = parseControllerFlags(t, "--egress-proxy=http://proxy.egress:3128", "--egress-proxy-credentials-secret=egress-proxy")
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.options()
	if err != nil {
		t.Fatal(err)
	}
	if o.EgressProxySecret.String() != "webhook-operator-system/egress-proxy" || !slices.Contains(o.Config.DispatcherArgs(), "--egress-proxy=http://proxy.egress:3128") {
		t.Fatalf("secret %s, dispatcher args %v", o.EgressProxySecret, o.Config.DispatcherArgs())
	}
}

// The auth callout is its own command: the controller takes the bus's callout mode (what it
// gives dispatchers) but none of the callout's keys, so it cannot serve it; `callout` needs
// its issuer seed.
func TestCalloutIsItsOwnCommand(t *testing.T) {
	f, err := parseControllerFlags(t, "--nats-url=tls://nats:4222", "--nats-auth-callout", "--nats-token-expiration-seconds=600")
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.options()
	if err != nil {
		t.Fatal(err)
	}
	if b := o.BusAuth; !b.Callout || b.TokenSeconds != 600 || b.Audience == "" {
		t.Errorf("bus auth %+v, want callout mode with 600s tokens", b)
	}
	for _, flag := range []string{"--nats-callout-issuer-seed-file=/x", "--nats-callout-xkey-seed-file=/x", "--nats-max-session=1h", "--nats-ingress-service-account=a/b"} {
		if _, err := parseControllerFlags(t, flag); err == nil || !strings.Contains(err.Error(), "unknown flag") {
			t.Errorf("the controller accepts %s (%v): only `webhook-operator callout` serves the callout", flag, err)
		}
	}

	cmd := calloutCommand()
	cmd.SetArgs([]string{"--nats-url=tls://nats:4222"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--nats-callout-issuer-seed-file") {
		t.Errorf("callout without its issuer seed: %v", err)
	}
}
