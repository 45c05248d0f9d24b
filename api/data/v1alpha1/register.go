package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group, distinct from the CRDs' webhook-operator.io.
const GroupName = "data.webhook-operator.io"

// SchemeGroupVersion is the group and version of this API.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resources of the API (plural, lower case), and the payload subresource.
const (
	ResourceDeliveries  = "webhookdeliveries"
	ResourceDeadLetters = "webhookdeadletters"
	ResourceEvents      = "webhookevents"
	SubresourcePayload  = "payload"
)

// Resource is the group-qualified resource of name.
func Resource(name string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(name).GroupResource()
}

// AddToScheme registers the kinds in this version, for clients.
func AddToScheme(s *runtime.Scheme) error {
	addKnownTypes(s, SchemeGroupVersion)
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

// AddToServerScheme registers the kinds in this version and, as the same Go types, as the
// group's internal version, which the API server's handlers convert through: with one Go type
// for both, no conversion is needed (the scheme only sets the kind).
func AddToServerScheme(s *runtime.Scheme) error {
	if err := AddToScheme(s); err != nil {
		return err
	}
	addKnownTypes(s, schema.GroupVersion{Group: GroupName, Version: runtime.APIVersionInternal})
	return nil
}

func addKnownTypes(s *runtime.Scheme, gv schema.GroupVersion) {
	s.AddKnownTypes(gv,
		&WebhookDelivery{}, &WebhookDeliveryList{},
		&WebhookDeadLetter{}, &WebhookDeadLetterList{},
		&WebhookEvent{}, &WebhookEventList{},
		&DeliveryPayload{},
	)
}
