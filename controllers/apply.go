package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// applier server-side applies the objects the controller owns, as FieldManager. It remembers
// what it last applied to each object and the resourceVersion that produced, and skips an
// apply when both still match the cache: the API server is asked again only when the desired
// object changed or somebody else touched the live one (which the apply then corrects).
type applier struct {
	client client.Client

	mu   sync.Mutex
	last map[string]applied
}

type applied struct {
	hash            [32]byte
	resourceVersion string
}

func newApplier(c client.Client) *applier {
	return &applier{client: c, last: map[string]applied{}}
}

// apply applies ac, whose live form is read from the cache into current (an empty typed object
// of the same kind). ac must carry its kind, name and namespace.
func (a *applier) apply(ctx context.Context, current client.Object, ac runtime.ApplyConfiguration) error {
	b, err := json.Marshal(ac)
	if err != nil {
		return err
	}
	hash := sha256.Sum256(b)
	// Apply a copy: the answer is decoded into it, and ac may share maps with other objects.
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(b); err != nil {
		return err
	}
	key := objectKey(u.GetKind(), u.GetNamespace(), u.GetName())
	err = a.client.Get(ctx, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}, current)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	a.mu.Lock()
	last, ok := a.last[key]
	a.mu.Unlock()
	if err == nil && ok && last.hash == hash && last.resourceVersion == current.GetResourceVersion() {
		return nil
	}
	if err := a.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return err
	}
	a.mu.Lock()
	a.last[key] = applied{hash: hash, resourceVersion: u.GetResourceVersion()}
	a.mu.Unlock()
	return nil
}

// forget drops what was remembered about an object, after deleting it.
func (a *applier) forget(kind, namespace, name string) {
	a.mu.Lock()
	delete(a.last, objectKey(kind, namespace, name))
	a.mu.Unlock()
}
