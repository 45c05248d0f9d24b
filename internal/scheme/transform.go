package scheme

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// StripApplied is the informer caches' transform of every object the operator's processes
// watch: it drops what no reconciler reads and every object carries, its managedFields and
// kubectl's last-applied copy of it (as large as its spec, on every object applied
// client-side). A tombstone is left as it is.
func StripApplied(in any) (any, error) {
	obj, err := meta.Accessor(in)
	if err != nil {
		return in, nil // a tombstone
	}
	if obj.GetManagedFields() != nil {
		obj.SetManagedFields(nil)
	}
	if a := obj.GetAnnotations(); a != nil {
		delete(a, corev1.LastAppliedConfigAnnotation)
	}
	return in, nil
}
