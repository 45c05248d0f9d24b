// Package chart tests the Helm chart charts/webhook-operator with the helm binary built into
// bin/ (hack/build-tools.sh): lint, rendered output for default and non-default values, the
// values schema, and install and uninstall against a real kube-apiserver and etcd.
package chart

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// releaseNamespace is where the tests install the chart.
const releaseNamespace = "webhook-operator-system"

// chartDir is the chart under test.
func chartDir() string { return filepath.Join(testenv.Root(), "charts", "webhook-operator") }

// helm runs bin/helm with its settings in a temporary directory (testenv.Helm).
var helm = testenv.Helm

// valuesFile writes values (YAML text) into a temporary file and returns its path.
func valuesFile(t *testing.T, values string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// template renders the chart as release "webhook-operator" in releaseNamespace with the
// given values (YAML text, may be empty) and returns the error helm reports.
func template(t *testing.T, values string, extra ...string) (string, error) {
	t.Helper()
	args := []string{"template", "webhook-operator", chartDir(), "--namespace", releaseNamespace}
	if values != "" {
		args = append(args, "--values", valuesFile(t, values))
	}
	return helm(t, nil, append(args, extra...)...)
}

// rendered is the chart's output as objects.
type rendered []*unstructured.Unstructured

// render renders the chart with values and decodes every document; a rendering error fails
// the test.
func render(t *testing.T, values string, extra ...string) rendered {
	t.Helper()
	out, err := template(t, values, extra...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests(out)
	if err != nil {
		t.Fatalf("decoding helm's output: %v\n%s", err, out)
	}
	return objs
}

// decodeManifests splits a multi-document YAML stream into objects, skipping empty documents.
func decodeManifests(s string) (rendered, error) {
	var objs rendered
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(s), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("a document without apiVersion, kind or name: %v", m)
		}
		objs = append(objs, u)
	}
}

// find returns the object of kind and name, or nil.
func (r rendered) find(kind, name string) *unstructured.Unstructured {
	for _, o := range r {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// ofKind returns the objects of kind.
func (r rendered) ofKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// kinds counts the objects of every kind.
func (r rendered) kinds() map[string]int {
	m := map[string]int{}
	for _, o := range r {
		m[o.GetKind()]++
	}
	return m
}

// must returns the object of kind and name, failing the test when there is none.
func (r rendered) must(t *testing.T, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := r.find(kind, name)
	if o == nil {
		t.Fatalf("no %s %q rendered; have %v", kind, name, r.kinds())
	}
	return o
}

// typed converts u into the typed object out (for example *appsv1.Deployment), strictly:
// a field the type does not know fails the test, as the API server would reject it.
func typed(t *testing.T, u *unstructured.Unstructured, out any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// readYAML decodes the YAML file at path (relative to the repository root) into out.
func readYAML(t *testing.T, path string, out any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.Root(), path))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
