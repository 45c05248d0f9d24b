package scheme_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
)

// The informer caches keep of an endpoint what the controller and the dispatcher read: not its managedFields,
// nor kubectl's last-applied copy of it (as large as its spec, on every endpoint applied
// client-side); the re-enable annotation stays.
func TestTheCacheKeepsNoCopyOfWhatWasApplied(t *testing.T) {
	ep := &v1alpha1.WebhookEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns",
		Annotations:   map[string]string{corev1.LastAppliedConfigAnnotation: `{"spec":{"url":"https://example.com"}}`, v1alpha1.AnnotationEnable: "2026-12-06T10:00:00Z"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}}}
	out, err := scheme.StripApplied(ep)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*v1alpha1.WebhookEndpoint)
	if _, ok := got.Annotations[corev1.LastAppliedConfigAnnotation]; ok || got.ManagedFields != nil {
		t.Fatalf("kept %v and %d managed fields", got.Annotations, len(got.ManagedFields))
	}
	if got.Annotations[v1alpha1.AnnotationEnable] == "" {
		t.Fatal("the re-enable annotation was dropped")
	}
	tomb := toolscache.DeletedFinalStateUnknown{Key: "ns/a", Obj: ep}
	if out, err := scheme.StripApplied(tomb); err != nil || out != any(tomb) {
		t.Fatalf("a tombstone: %v, %v", out, err)
	}
}
