package expr

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
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

// The ops-alerts sample turns operational events into Slack messages.
func TestOpsAlertsSampleFormatsOperationalEvents(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "webhook-operator_v1alpha1_webhookendpoint_ops-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ep v1alpha1.WebhookEndpoint
	if err := yaml.UnmarshalStrict(b, &ep); err != nil {
		t.Fatal(err)
	}
	tr, err := TransformOf(&ep.Spec)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		ev   records.OpsEvent
		want string
	}{
		{records.NewOpsEvent("shop", "crm", records.OpsEndpointDisabled, "1", now, map[string]any{"message": "endpoint auto-disabled: 20 of 20 deliveries failed", "windowHours": 72, "total": 20, "failures": 20}),
			`{"text":"[shop/crm] webhook_operator.endpoint.disabled: endpoint auto-disabled: 20 of 20 deliveries failed"}`},
		{records.NewOpsEvent("shop", "crm", records.OpsDeliveryDeadLettered, "2", now, map[string]any{"count": int64(7), "deliveryId": "whdl_1", "reason": "exhausted"}),
			`{"text":"[shop/crm] webhook_operator.delivery.dead_lettered: 7 dead letter(s), the first whdl_1 (exhausted)"}`},
	} {
		data, err := json.Marshal(tc.ev)
		if err != nil {
			t.Fatal(err)
		}
		out, err := tr.Apply(context.Background(), NewInput(&Event{ID: tc.ev.ID, Type: tc.ev.Type, Namespace: "shop", Time: now, Data: data}))
		if err != nil {
			t.Fatalf("%s: %v", tc.ev.Type, err)
		}
		if string(out.Body) != tc.want {
			t.Errorf("%s: body %s, want %s", tc.ev.Type, out.Body, tc.want)
		}
	}
}
