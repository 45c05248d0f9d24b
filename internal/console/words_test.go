package console

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// An endpoint's spec in words: what it receives, from where, where it goes, how, what counts
// as success, retries, limits, ordering, suspension; a secret named, never its value.
func TestSpecInWords(t *testing.T) {
	inflight, rps := int32(20), int32(5)
	for _, c := range []struct {
		name string
		spec v1alpha1.WebhookEndpointSpec
		want []string
	}{
		{"the least", v1alpha1.WebhookEndpointSpec{URL: "https://a.example.com/h", EventTypes: []v1alpha1.EventTypePattern{"order.*"}}, []string{
			"Delivers the events of type order.* published in this namespace to https://a.example.com/h.",
			"A delivery succeeds on any 2xx answer within the default timeout; redirects are failures.",
			"Failures are retried with the installation's default retry policy, then dead-lettered.",
		}},
		{"the most", v1alpha1.WebhookEndpointSpec{
			URLFrom:    &v1alpha1.URLFromSource{SecretKeyRef: v1alpha1.SecretKeySelector{Name: "slack-url", Key: "url"}},
			EventTypes: []v1alpha1.EventTypePattern{"order.*", "webhook_operator.>"}, SourceNamespaces: []string{"shop"},
			Filter: `payload.total > 100`, Format: &v1alpha1.FormatSpec{Type: v1alpha1.FormatSlack},
			Transform:          &v1alpha1.TransformSpec{Headers: []v1alpha1.TransformHeader{{Name: "X-Id", Expression: "id"}}},
			HeadersFrom:        []v1alpha1.HeaderFromSecret{{Name: "Authorization", SecretKeyRef: v1alpha1.SecretKeySelector{Name: "auth", Key: "token"}}},
			SuccessStatusCodes: []int32{200, 204}, Timeout: &metav1.Duration{Duration: 5 * time.Second},
			RetryPolicyRef: &v1alpha1.LocalObjectReference{Name: "patient"}, MaxInFlight: &inflight, RateLimit: &v1alpha1.RateLimitSpec{RequestsPerSecond: rps},
			Ordering:   &v1alpha1.OrderingSpec{Mode: v1alpha1.OrderingPerKey, Key: &v1alpha1.OrderingKeySource{JSONField: "order.id"}},
			Dispatcher: &v1alpha1.DispatcherSpec{Dedicated: true}, Suspend: true,
		}, []string{
			"Delivers the events of type order.*, webhook_operator.> published in this namespace and shop to the URL in Secret slack-url (key url).",
			"Only the events its filter accepts: payload.total > 100",
			"Each request is written as a Slack message.",
			"Header X-Id is set to: id",
			"Header Authorization comes from Secret auth (key token).",
			"A delivery succeeds on an answer of 200, 204 within a timeout of 5s; redirects are failures.",
			"Failures are retried as RetryPolicy patient says, then dead-lettered.",
			"Sends at most 20 requests at once and at most 5 requests a second.",
			"Keeps the order of the events of one key (the field order.id): no two of a key in flight.",
			"Has a dispatcher of its own.",
			"Suspended: deliveries are held in the stream until it is resumed.",
		}},
	} {
		got := specInWords(&v1alpha1.WebhookEndpoint{Spec: c.spec})
		if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%s:\n%s\nwant\n%s", c.name, strings.Join(got, "\n"), strings.Join(c.want, "\n"))
		}
	}
}
