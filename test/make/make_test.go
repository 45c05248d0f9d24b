// Package make checks the Makefile's promise to a newcomer: every target works as the first
// command on a fresh clone, because each one depends on the tools it runs (built by
// hack/build-tools.sh) instead of asking the user to run another target first.
package make

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// toolBuilds is the hack/build-tools.sh command line that builds each tool.
var toolBuilds = map[string]string{
	"control-plane":  "hack/build-tools.sh etcd kube",
	"controller-gen": "hack/build-tools.sh controller-gen",
	"helm":           "hack/build-tools.sh helm",
}

// TestTargetsBuildTheToolsTheyNeed runs `make -n <target>` with an empty bin/ and checks that
// the target's tools are built before the command that uses them. `make test` on a fresh clone
// once failed in every chart test with "helm not found" because it built only the control
// plane.
func TestTargetsBuildTheToolsTheyNeed(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is not on PATH: %v", err)
	}
	for _, tc := range []struct {
		target string
		tools  []string
		// uses is a fragment of the first command that needs the tools.
		uses string
	}{
		// test/chart runs helm; every integration test starts the control plane.
		{"test", []string{"control-plane", "helm"}, "go test"},
		{"test-race", []string{"control-plane"}, "go test"},
		{"test-faults", []string{"control-plane"}, "go test"},
		{"bench", []string{"control-plane"}, "go build"},
		// The demo runs kube-apiserver, etcd and kubectl.
		{"demo", []string{"control-plane"}, "go build"},
		{"generate", []string{"controller-gen"}, "controller-gen object"},
		{"manifests", []string{"controller-gen"}, "controller-gen crd"},
		{"verify", []string{"controller-gen"}, "controller-gen object"},
		{"tools", []string{"control-plane", "controller-gen", "helm"}, ""},
	} {
		t.Run(tc.target, func(t *testing.T) {
			lines := dryRun(t, tc.target)
			use := len(lines)
			if tc.uses != "" {
				use = slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, tc.uses) })
				if use < 0 {
					t.Fatalf("make -n %s runs no %q:\n%s", tc.target, tc.uses, strings.Join(lines, "\n"))
				}
			}
			for _, tool := range tc.tools {
				build := slices.Index(lines, toolBuilds[tool])
				if build < 0 || build > use {
					t.Errorf("make -n %s does not build %s (%q) before %q:\n%s",
						tc.target, tool, toolBuilds[tool], tc.uses, strings.Join(lines, "\n"))
				}
			}
		})
	}
}

// dryRun returns the commands `make -n target` would run in the repository, with bin/ an
// empty directory, one trimmed line each.
func dryRun(t *testing.T, target string) []string {
	t.Helper()
	bin := t.TempDir()
	cmd := exec.Command("make", "--no-print-directory", "-n", "-C", testenv.Root(), target,
		"BIN="+bin, "KUBEBUILDER_ASSETS="+filepath.Join(bin, "k8s"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n %s: %v\n%s", target, err, out)
	}
	var lines []string
	for l := range strings.Lines(string(out)) {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// TestCIRunsTheNewcomerPath checks that .ci/run runs what the README tells a newcomer, in that
// order (`make test`, a bounded `make demo`, `make verify`) and nothing before them, so CI
// cannot pass on a path a newcomer does not take.
func TestCIRunsTheNewcomerPath(t *testing.T) {
	ci := readFile(t, filepath.Join(testenv.Root(), ".ci", "run"))
	var got []string
	for l := range strings.Lines(ci) {
		f := strings.Fields(l)
		// A command line: `make <target>`, optionally after VAR=value assignments.
		for len(f) > 0 && strings.Contains(f[0], "=") && !strings.HasPrefix(f[0], "#") {
			f = f[1:]
		}
		if len(f) > 0 && f[0] == "make" {
			got = append(got, strings.Join(f, " "))
		}
	}
	want := []string{"make test", "make demo", "make test-cluster", "make verify"}
	if !slices.Equal(got, want) {
		t.Errorf(".ci/run runs %q, want %q", got, want)
	}
	if !strings.Contains(ci, "DEMO_DURATION=") {
		t.Errorf(".ci/run runs an unbounded demo (no DEMO_DURATION)")
	}
	readme := readFile(t, filepath.Join(testenv.Root(), "README.md"))
	for _, c := range want {
		if !strings.Contains(readme, c) {
			t.Errorf("README.md does not tell a newcomer to run %q", c)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
