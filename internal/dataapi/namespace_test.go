package dataapi

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/metadata"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// A namespace being deleted is emptied by the namespace controller through the metadata
// client, which asks for protobuf first: it lists every resource of the namespace and deletes
// the collections of those that allow it. The data API answers it (in JSON: its types have no
// protobuf encoding), so a tenant's namespace does not stay Terminating.
func TestTheNamespaceControllerEmptiesANamespace(t *testing.T) {
	tn := newTenant(t)
	st := tn.stored()
	at := time.Now().Add(-time.Hour)
	for i := range 3 {
		m := st.Delivery("orders", fmt.Sprintf("evt_ns_%d", i), uint64(i+1), at)
		st.DeadLetter(m, 1, records.ReasonExhausted, `{}`, at.Add(time.Duration(i)*time.Minute), nil)
	}
	mc, err := metadata.NewForConfig(world.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, res := range []string{datav1alpha1.ResourceDeliveries, datav1alpha1.ResourceDeadLetters} {
		if _, err := mc.Resource(datav1alpha1.SchemeGroupVersion.WithResource(res)).Namespace(tn.ns).List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("the namespace controller's list of %s: %v", res, err)
		}
	}
	dl := mc.Resource(datav1alpha1.SchemeGroupVersion.WithResource(datav1alpha1.ResourceDeadLetters)).Namespace(tn.ns)
	if err := dl.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatalf("the namespace controller's deletecollection of dead letters: %v", err)
	}
	if l, err := dl.List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("dead letters left after the namespace controller's deletecollection: %v, %v", err, l)
	}
}
