package dataapi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// shippedRoles installs config/rbac/tenant_roles.yaml's ClusterRoles once.
func shippedRoles(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.Root(), "config", "rbac", "tenant_roles.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &role); err != nil || role.Name == "" {
			continue
		}
		if err := world.cp.Client.Create(context.Background(), &role); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// boundTo is user bound in the tenant's namespace to the shipped ClusterRoles roles.
func (tn *tenant) boundTo(user string, roles ...string) rest.Interface {
	tn.t.Helper()
	for _, r := range roles {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: tn.ns, Name: user + "-" + r},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}}}
		if err := world.cp.Client.Create(context.Background(), rb); err != nil {
			tn.t.Fatal(err)
		}
	}
	return dataClient(tn.t, user)
}

func payloadOf(rc rest.Interface, ns, resource, name string) (*datav1alpha1.DeliveryPayload, error) {
	var p datav1alpha1.DeliveryPayload
	return &p, rc.Get().Namespace(ns).Resource(resource).Name(name).SubResource(datav1alpha1.SubresourcePayload).Do(context.Background()).Into(&p)
}

func TestShippedRolesSayWhoReadsPayloadsPurgesAndPublishes(t *testing.T) {
	shippedRoles(t)
	tn := newTenant(t)
	st := tn.stored()
	// A delivery whose event is still in the events stream, its response body and request
	// headers logged; and a dead letter.
	seq := st.Event("order.created", "evt-personal", `{"email":"ada@example.com"}`, nil)
	m := st.Delivery("orders", "evt-personal", seq, time.Now())
	st.Log(records.LogRecord{DeliveryID: m.DeliveryID, EventID: m.EventID, EventType: m.EventType, EventSeq: seq, Namespace: tn.ns, Endpoint: "orders",
		State: records.StateSucceeded, Attempt: 1, Time: time.Now(), RequestHeaders: map[string]string{"X-Tenant": "acme"},
		Response: records.Response{StatusCode: 200, Body: `{"received":"ada@example.com"}`}})
	dm := st.Delivery("orders", "evt-dead", seq, time.Now())
	st.DeadLetter(dm, 2, records.ReasonExhausted, `{"email":"bob@example.com"}`, time.Now(), nil)

	viewer := tn.boundTo("viewer", "webhook-operator-viewer")
	editor := tn.boundTo("editor", "webhook-operator-editor")
	reader := tn.boundTo("reader", "webhook-operator-viewer", "webhook-operator-payload-reader")
	producer := tn.boundTo("producer", "webhook-operator-producer")
	outsider := newTenant(t).boundTo("outsider", "webhook-operator-editor")

	// The viewer lists and watches deliveries and dead letters, without their payloads.
	l, err := list(viewer, tn.ns)
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("the viewer's list: %v, %d items; want the logged one", err, len(l.Items))
	}
	if strings.Contains(string(mustJSON(t, l)), "example.com") {
		t.Errorf("a list shows payload: %s", mustJSON(t, l))
	}
	for _, res := range []string{datav1alpha1.ResourceDeliveries, datav1alpha1.ResourceDeadLetters} {
		name := m.DeliveryID
		if res == datav1alpha1.ResourceDeadLetters {
			name = dm.DeliveryID
		}
		for who, rc := range map[string]rest.Interface{"viewer": viewer, "producer": producer, "outsider": outsider} {
			if _, err := payloadOf(rc, tn.ns, res, name); !apierrors.IsForbidden(err) {
				t.Errorf("%s reads the payload of %s %s: %v; want 403", who, res, name, err)
			}
		}
		for who, rc := range map[string]rest.Interface{"editor": editor, "payload reader": reader} {
			p, err := payloadOf(rc, tn.ns, res, name)
			if err != nil || p.Event == nil || p.Event.JSON == nil || !strings.Contains(string(p.Event.JSON.Raw), "@example.com") || p.Endpoint != "orders" {
				t.Errorf("%s reads the payload of %s %s: %v %+v", who, res, name, err, p)
			}
		}
	}
	p, _ := payloadOf(editor, tn.ns, datav1alpha1.ResourceDeliveries, m.DeliveryID)
	if p.Response == nil || !strings.Contains(string(p.Response.JSON.Raw), "received") || p.RequestHeaders["X-Tenant"] != "acme" {
		t.Errorf("the delivery's payload: %+v", p)
	}

	// Purging is the editor's; publishing the editor's and the producer's.
	if err := reader.Delete().Namespace(tn.ns).Resource(datav1alpha1.ResourceDeadLetters).Name(dm.DeliveryID).Do(context.Background()).Error(); !apierrors.IsForbidden(err) {
		t.Errorf("the payload reader purges: %v; want 403", err)
	}
	for who, rc := range map[string]rest.Interface{"viewer": viewer, "payload reader": reader} {
		if _, err := createEvent(rc, tn.ns, event("evt-"+strings.ReplaceAll(who, " ", "-"), "order.created", `{}`)); !apierrors.IsForbidden(err) {
			t.Errorf("the %s publishes: %v; want 403", who, err)
		}
	}
	for who, rc := range map[string]rest.Interface{"editor": editor, "producer": producer} {
		if _, err := createEvent(rc, tn.ns, event("evt-by-"+who, "order.created", `{}`)); err != nil {
			t.Errorf("the %s publishes: %v", who, err)
		}
	}
	if _, err := list(producer, tn.ns); !apierrors.IsForbidden(err) {
		t.Errorf("the producer lists deliveries: %v; want 403", err)
	}
	if err := editor.Delete().Namespace(tn.ns).Resource(datav1alpha1.ResourceDeadLetters).Name(dm.DeliveryID).Do(context.Background()).Error(); err != nil {
		t.Errorf("the editor purges: %v", err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
