package chart

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestControllerAcceptsChartFlags builds the operator and checks that `webhook-operator
// controller` (and `callout`, and `check`) defines every flag the chart passes, with default and non-default values, so a
// renamed flag fails here and not in a crash-looping pod.
func TestControllerAcceptsChartFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the operator")
	}
	bin := filepath.Join(t.TempDir(), "webhook-operator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/webhook-operator")
	build.Dir = testenv.Root()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// A missing or renamed controller command fails here: it is what the chart runs.
	out, err := exec.Command(bin, "controller", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("webhook-operator controller --help: %v\n%s", err, out)
	}
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		defined[m[1]] = true
	}

	for name, values := range map[string]string{"defaults": "", "non-default": nonDefaultValues} {
		_, c := deployment(t, render(t, values))
		for _, arg := range c.Args[1:] {
			if slices.Contains([]string{"--kube-api-qps=50"}, arg) { // extraArgs of nonDefaultValues
				continue
			}
			flag, _, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
			if !defined[flag] {
				t.Errorf("%s: the chart passes --%s, which `webhook-operator controller` does not define", name, flag)
			}
		}
	}

	// The callout's Deployment runs `webhook-operator callout`.
	out, err = exec.Command(bin, "callout", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("webhook-operator callout --help: %v\n%s", err, out)
	}
	calloutFlags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		calloutFlags[m[1]] = true
	}
	for name, values := range map[string]string{"defaults": "", "non-default": `nats: {auth: {callout: {existingSecret: keys, encrypted: false, tokenAudience: nats.example.com,
  maxSession: 30m, allowAPIAudienceTokens: true, replicas: 3}}, tls: {enabled: true, existingSecret: nats-tls}}
ingress: {enabled: true}
outbound: {allowCrossNamespaceSources: true}
logLevel: debug`} {
		_, c := calloutDeployment(t, render(t, values))
		if c.Args[0] != "callout" {
			t.Fatalf("%s: the callout runs %q", name, c.Args)
		}
		for _, arg := range c.Args[1:] {
			flag, _, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
			if !calloutFlags[flag] {
				t.Errorf("%s: the chart passes --%s, which `webhook-operator callout` does not define", name, flag)
			}
		}
	}

	// The chart's test pod runs `webhook-operator check nats`.
	out, err = exec.Command(bin, "check", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("webhook-operator check --help: %v\n%s", err, out)
	}
	checkFlags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		checkFlags[m[1]] = true
	}
	_, c := testPod(t, render(t, ""))
	if len(c.Args) < 3 || c.Args[0] != "check" || c.Args[1] != "nats" {
		t.Fatalf("the test pod runs %q", c.Args)
	}
	for _, arg := range c.Args[2:] {
		flag, _, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		if !checkFlags[flag] {
			t.Errorf("the test pod passes --%s, which `webhook-operator check` does not define", flag)
		}
	}
}
