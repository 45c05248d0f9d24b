package expr

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// The expressions of config/samples compile.
func TestSamplesCompile(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "samples", "*webhookendpoint*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("samples: %v %v", files, err)
	}
	withExpressions := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var ep v1alpha1.WebhookEndpoint
		if err := yaml.UnmarshalStrict(b, &ep); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := FilterOf(&ep.Spec); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		if _, err := TransformOf(&ep.Spec); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		if ep.Spec.Filter != "" || ep.Spec.Transform != nil {
			withExpressions++
		}
	}
	if withExpressions < 2 {
		t.Errorf("%d samples with a filter or a transformation, want at least 2", withExpressions)
	}
}
