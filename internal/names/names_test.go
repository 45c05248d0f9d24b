package names

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

func TestDispatcherNames(t *testing.T) {
	shared := &v1alpha1.WebhookEndpoint{}
	shared.Name = "orders"
	if got := Dispatcher(shared); got != "webhook-dispatcher" {
		t.Errorf("shared: %q", got)
	}
	for _, name := range []string{
		"orders",
		"orders.v1",
		strings.Repeat("a", 44),             // exactly 63 with the prefix
		strings.Repeat("a", 45),             // one too many
		strings.Repeat("b.", 100) + "c",     // dots at the cut
		strings.Repeat("d-", 100) + "e.f-g", // dashes at the cut
	} {
		got := DedicatedDispatcher(name)
		if len(got) > 63 {
			t.Errorf("%q: %q is %d characters", name, got, len(got))
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("%q: %q is not a valid name: %v", name, got, errs)
		}
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Errorf("%q: %q is not a valid label value: %v", name, got, errs)
		}
		if len(name) <= 44 && got != "webhook-dispatcher-"+name {
			t.Errorf("%q: a name that fits is kept, got %q", name, got)
		}
	}
	a, b := DedicatedDispatcher(strings.Repeat("x", 60)+"1"), DedicatedDispatcher(strings.Repeat("x", 60)+"2")
	if a == b {
		t.Errorf("two long names shortened to the same %q", a)
	}
	if got := SigningSecret(strings.Repeat("s", 253)); len(got) > 253 {
		t.Errorf("signing secret name is %d characters", len(got))
	}
}
