package plugin

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/quota"
)

// rateRestricted explains a refused publish to the bus in a namespace whose WebhookQuota sets
// a publish rate: NATS cannot hold a rate, so producers there publish through the ingress.
// Otherwise (or when the quota cannot be read) it returns err as it is.
func (o *Options) rateRestricted(ctx context.Context, ns string, err error) error {
	return o.explainRate(ctx, ns, "its producers may not publish to the bus directly; publish through the ingress (kubectl webhooks publish --via http)", err)
}

// deliveriesRateRestricted explains a refused test delivery the same way: the rate covers the
// deliveries tenants write, which only a WebhookReplay (written by the controller within the
// rate) may do there.
func (o *Options) deliveriesRateRestricted(ctx context.Context, ns string, err error) error {
	return o.explainRate(ctx, ns, "no test delivery or replay may be written to the bus directly; "+
		"publish a test event through the ingress (kubectl webhooks publish --via http), replay with kubectl webhooks replay", err)
}

func (o *Options) explainRate(ctx context.Context, ns, consequence string, err error) error {
	c, cerr := o.Client()
	if cerr != nil {
		return err
	}
	q := &v1alpha1.WebhookQuota{}
	if c.Get(ctx, client.ObjectKey{Namespace: ns, Name: v1alpha1.QuotaName}, q) != nil || !quota.RestrictsDirectPublish(&q.Spec) {
		return err
	}
	return fmt.Errorf("namespace %s's WebhookQuota sets a publish rate (spec.eventsPerSecond %d), which only the ingress and the controller can hold: %s: %w",
		ns, *q.Spec.EventsPerSecond, consequence, err)
}
