package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/webhook-operator/webhook-operator/controllers"
)

func parseControllerFlags(t *testing.T, args ...string) (*controllerFlags, error) {
	t.Helper()
	t.Setenv("OPERATOR_IMAGE", "ghcr.io/webhook-operator/webhook-operator:v1")
	f := newControllerFlags()
	fs := pflag.NewFlagSet("controller", pflag.ContinueOnError)
	f.add(fs)
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
	if _, ok := r.Limits["cpu"]; ok {
		t.Error("no CPU limit by default")
	}
	if o.DispatcherReplicas != 1 || f.metricsAddr != ":8080" || f.probeAddr != ":8081" || f.leaderElect {
		t.Errorf("defaults: %+v", f)
	}
	if o.Autoscaling != nil {
		t.Errorf("autoscaling is off by default, got %+v", o.Autoscaling)
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
		{[]string{"--max-concurrent-reconciles=0"}, "--max-concurrent-reconciles must be at least 1"},
		{[]string{"--nats-url="}, "--nats-url is required"},
		{[]string{"--nats-credentials-secret=just-a-name"}, "--nats-credentials-secret must be namespace/name"},
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
		"max-concurrent-reconciles", "allow-http", "allowed-cidrs", "allow-cross-namespace-sources",
		"events-max-age", "attempts-max-age", "dead-letter-max-age", "zap-log-level", "kubeconfig",
		"autoscaling", "autoscaling-nats-monitoring-endpoint", "autoscaling-nats-monitoring-https", "autoscaling-nats-account",
		"autoscaling-max-replicas", "autoscaling-lag-threshold", "autoscaling-max-triggers", "autoscaling-polling-interval",
	} {
		if cmd.Flags().Lookup(name) == nil {
			t.Errorf("no --%s flag", name)
		}
	}
}

// config/manager/manager.yaml runs the controller with arguments it accepts.
func TestManagerManifestArgumentsAreValid(t *testing.T) {
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
