package plugin

import (
	"context"
	"encoding/json"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// EnableResult is what enable reports.
type EnableResult struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// EnabledAt is the value written to the webhook-operator.io/enabled-at annotation.
	EnabledAt string `json:"enabledAt"`
	// WasDisabled is true when the endpoint's Disabled condition was True.
	WasDisabled    bool       `json:"wasDisabled"`
	DisabledSince  *time.Time `json:"disabledSince,omitempty"`
	DisabledReason string     `json:"disabledReason,omitempty"`
}

func newEnableCommand(o *Options) *cobra.Command {
	return &cobra.Command{
		Use:   "enable <endpoint>",
		Short: "Re-enable an auto-disabled endpoint",
		Long: `Re-enable an endpoint the dispatcher disabled after too many failures: sets the annotation
webhook-operator.io/enabled-at to now. The dispatcher re-enables the endpoint when that time
is later than when it was disabled, resets its failure counters and closes its circuit.
Dead letters of the disabled period stay in the dead-letter queue: replay them with
` + "`kubectl webhooks replay <endpoint> --all`" + `.`,
		Example: `  kubectl webhooks enable orders -n shop`,
		Args:    cobra.ExactArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error {
			return runEnable(ctx, o, args[0])
		}),
	}
}

func runEnable(ctx context.Context, o *Options, name string) error {
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	ep, err := o.GetEndpoint(ctx, ns, name)
	if err != nil {
		return err
	}
	res := EnableResult{Namespace: ns, Name: name, EnabledAt: o.Now().UTC().Format(time.RFC3339Nano)}
	if c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionDisabled); c != nil && c.Status == metav1.ConditionTrue {
		res.WasDisabled = true
		res.DisabledReason = c.Reason
	}
	if h := ep.Status.Health; h != nil {
		res.DisabledSince = timeOf(h.DisabledSince)
		if h.DisabledReason != "" {
			res.DisabledReason = h.DisabledReason
		}
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"annotations": map[string]string{v1alpha1.AnnotationEnable: res.EnabledAt},
		},
	})
	c, err := o.Client()
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, ep, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return kubeError(err, "webhookendpoint %q in namespace %q", name, ns)
	}
	return o.print(res, func(w io.Writer) {
		if !res.WasDisabled {
			writeLine(w, "webhookendpoint %s/%s is not disabled: nothing to re-enable (%s set to %s anyway)",
				ns, name, v1alpha1.AnnotationEnable, res.EnabledAt)
			return
		}
		since := ""
		if res.DisabledSince != nil {
			since = " since " + ts(*res.DisabledSince)
		}
		writeLine(w, "webhookendpoint %s/%s re-enabled: %s=%s (it was disabled%s: %s)",
			ns, name, v1alpha1.AnnotationEnable, res.EnabledAt, since, orDash(res.DisabledReason))
		writeLine(w, "The dispatcher resumes deliveries shortly; follow with `kubectl webhooks status %s`. Dead letters of the disabled period: `kubectl webhooks replay %s --all`.", name, name)
	})
}
