package plugin

import (
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

// dlq purge --reason takes the reasons the API names (DeadLetterReason's enum in the
// WebhookReplay CRD), no more, no fewer.
func TestPurgeReasonsAreTheAPIs(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "config", "crd", "bases", "webhook-operator.io_webhookreplays.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties struct {
							Spec struct {
								Properties struct {
									Reasons struct {
										Items struct {
											Enum []string `json:"enum"`
										} `json:"items"`
									} `json:"reasons"`
								} `json:"properties"`
							} `json:"spec"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &crd); err != nil || len(crd.Spec.Versions) == 0 {
		t.Fatalf("reading the CRD: %v", err)
	}
	api := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties.Spec.Properties.Reasons.Items.Enum
	got := slices.Clone(deadLetterReasons)
	slices.Sort(got)
	slices.Sort(api)
	if len(api) == 0 || !slices.Equal(got, api) {
		t.Errorf("dlq purge knows the reasons %v; the API %v", got, api)
	}
}
