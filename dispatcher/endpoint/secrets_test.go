package endpoint

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// secretReader answers a Get of Secret name with what secret makes of it (the API server's
// answer, as a client.Reader gives it).
type secretReader struct {
	client.Reader
	secret func(name string) *corev1.Secret
}

func (r secretReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	*obj.(*corev1.Secret) = *r.secret(key.Name)
	return nil
}

// The Secret cache gives back what Resolve reads of a Secret (its data, its resourceVersion,
// and what consent decides with: the same decision for every endpoint), and keeps little of
// each: a shared dispatcher keeps a Secret per endpoint at least (its signing Secret).
func TestSecretCacheKeepsWhatResolveReads(t *testing.T) {
	const n = 2000
	ctrl := true
	full := func(name string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: "42", UID: types.UID("uid-" + name),
				Labels: map[string]string{names.LabelManagedBy: names.LabelManagedByValue, "team": "a"},
				Annotations: map[string]string{consent.AllowedEndpoints: "orders", "kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 300),
					"note": "kept nowhere"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "webhook-operator.io/v1alpha1", Kind: "WebhookEndpoint", Name: "orders", UID: "uid-orders", Controller: &ctrl}},
				ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{names.SigningSecretKey: []byte("whsec_" + strings.Repeat("k", 44))},
		}
	}
	c := NewSecretCache(secretReader{secret: full}, "shop", time.Hour)
	ctx := context.Background()
	endpoints := []*metav1.ObjectMeta{{Namespace: "shop", Name: "orders", UID: "uid-orders"}, {Namespace: "shop", Name: "crm", UID: "uid-crm"}}
	for _, name := range []string{"s", names.SigningSecret("orders")} {
		want := full(name)
		for range 2 { // read, then from the cache
			got, err := c.Get(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if got.Name != name || got.ResourceVersion != "42" || !maps.EqualFunc(got.Data, want.Data, func(a, b []byte) bool { return string(a) == string(b) }) {
				t.Fatalf("Secret %s: got %+v", name, got)
			}
			for _, ep := range endpoints {
				if g, w := fmt.Sprint(consent.Secret(got, ep, "")), fmt.Sprint(consent.Secret(want, ep, "")); g != w {
					t.Errorf("Secret %s for endpoint %s: %s, the whole Secret: %s", name, ep.Name, g, w)
				}
			}
		}
	}

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range n {
		if _, err := c.Get(ctx, fmt.Sprintf("secret-%04d", i)); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n; per > 1024 {
		t.Fatalf("the cache keeps %d bytes per Secret, want at most 1024", per)
	}
	runtime.KeepAlive(c)
}

// A Secret read is kept for the cache's hold, not for as long as the endpoints that use it
// exist: thousands of idle endpoints' signing Secrets go, and the map that held them with them.
// Read again afterwards, a Secret comes from the API server.
func TestSecretCacheLetsGoOfSecretsAfterItsHold(t *testing.T) {
	const n = 500
	var reads atomic.Int64
	c := NewSecretCache(secretReader{secret: func(name string) *corev1.Secret {
		reads.Add(1)
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, ResourceVersion: "1"},
			Data: map[string][]byte{names.SigningSecretKey: []byte("whsec_" + strings.Repeat("k", 44))}}
	}}, "shop", 200*time.Millisecond)
	ctx := context.Background()
	for i := range n {
		if _, err := c.Get(ctx, fmt.Sprintf("secret-%04d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Get(ctx, "secret-0000"); err != nil || reads.Load() != n {
		t.Fatalf("a Secret read within the hold was read again (%d reads for %d Secrets, %v)", reads.Load(), n, err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return c.Len() == 0 }, "the cache still holds %d Secrets", lazyLen{c})
	c.mu.Lock()
	peak := c.peak
	c.mu.Unlock()
	// The map that held all n was made again; on a busy machine the last few Secrets read may
	// have outlived the first ones' sweep and be counted in the new map's peak.
	if peak >= n/4 {
		t.Errorf("the emptied cache's map was not made again (its peak is %d of %d)", peak, n)
	}
	if _, err := c.Get(ctx, "secret-0000"); err != nil || reads.Load() != n+1 {
		t.Fatalf("a Secret let go of was not read again (%d reads, %v)", reads.Load(), err)
	}
}

// lazyLen shows how many Secrets a cache holds when a failure is reported.
type lazyLen struct{ c *SecretCache }

func (l lazyLen) String() string { return fmt.Sprint(l.c.Len()) }
