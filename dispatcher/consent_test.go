package dispatcher_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A shared dispatcher may read a Secret because one of its endpoints may use it; another
// endpoint of the namespace that references it without the Secret's consent never sends its
// value: its deliveries fail with a configuration error that says why, while the consenting
// endpoint gets the header.
func TestSecretUsedOnlyByTheEndpointsItConsentsTo(t *testing.T) {
	e := newEnv(t)
	const token = "Bearer only-for-orders-0123456789"
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "orders-auth",
		Annotations: map[string]string{consent.AllowedEndpoints: "orders"}}, StringData: map[string]string{"token": token}}
	if err := e.k8s.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	good, evil := newReceiver(t, nil), newReceiver(t, nil)
	ref := e.policy("once", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}}, CircuitBreaker: noCircuit()})
	header := []v1alpha1.HeaderFromSecret{{Name: "Authorization", SecretKeyRef: v1alpha1.SecretKeySelector{Name: "orders-auth", Key: "token"}}}
	e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: good.URL(), RetryPolicyRef: ref, HeadersFrom: header})
	e.endpoint("leak", v1alpha1.WebhookEndpointSpec{URL: evil.URL(), RetryPolicyRef: ref, HeadersFrom: header})
	e.dispatcher("d1")
	e.publish("a", "evt_1", []byte(`{}`))

	testenv.Eventually(t, 10*time.Second, func() bool { return good.Stats().Requests == 1 }, "orders got no request")
	if got := good.Requests()[0].Header.Get("Authorization"); got != token {
		t.Fatalf("orders did not get its header: %q", got)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.deadLetters()) == 1 }, "no dead letter for leak")
	dl := e.deadLetters()[0]
	if dl.Endpoint != "leak" || len(dl.Attempts) == 0 || dl.Attempts[0].Reason != records.FailConfig ||
		!strings.Contains(dl.Attempts[0].Error, "orders-auth does not consent to endpoint leak") {
		t.Fatalf("dead letter: %+v, want endpoint leak failing with a configuration error naming the consent", dl)
	}
	if evil.Stats().Requests != 0 {
		t.Fatalf("the endpoint without consent sent %d requests (first Authorization %q)", evil.Stats().Requests, evil.Requests()[0].Header.Get("Authorization"))
	}
}

// An endpoint whose signing Secret the dispatcher cannot read when it first resolves it (not
// created yet; in a cluster also: the controller names it in the dispatcher's Role a moment
// after the endpoint appears) fails its attempts with a configuration error, and is resolved
// again within seconds, though nothing the dispatcher watches changed: its next attempt is
// signed and delivered. Before, it waited for the periodic resync five minutes later (seen in
// the scale-endpoints bench: a tenth of the endpoints of the namespaces created last got
// nothing for minutes, every attempt "signing secret: ... forbidden").
func TestAnEndpointWhoseSecretComesLaterIsResolvedAgainSoon(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	every := e.policy("every-second", v1alpha1.RetryPolicySpec{Schedule: []metav1.Duration{{}, {Duration: time.Second}, {Duration: time.Second},
		{Duration: time.Second}, {Duration: time.Second}, {Duration: time.Second}, {Duration: time.Second}, {Duration: time.Second},
		{Duration: time.Second}, {Duration: time.Second}, {Duration: time.Second}, {Duration: time.Second}, {Duration: time.Second}},
		CircuitBreaker: noCircuit()})
	const name = "late-signing"
	e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), RetryPolicyRef: every,
		Signing: &v1alpha1.SigningSpec{SecretRef: v1alpha1.SecretKeySelector{Name: name, Key: "secret"}}})
	e.dispatcher("d1")
	e.publish("order.created", "evt_1", []byte(`{}`))
	testenv.Eventually(t, 10*time.Second, func() bool {
		recs := e.logRecords("orders")
		return len(recs) > 0 && recs[0].Reason == records.FailConfig
	}, "no attempt failed with a configuration error")
	secret := newSecret()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name,
		Annotations: map[string]string{consent.AllowedEndpoints: "orders"}}, StringData: map[string]string{"secret": secret}}
	if err := e.k8s.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	rcv.Trust(secret)
	testenv.Eventually(t, 10*time.Second, func() bool { return rcv.RequestsByID()["evt_1"] == 1 },
		"the endpoint was not delivered to once its Secret existed (%d dead letters)", lazyN(func() int { return len(e.deadLetters()) }))
}
