package controllers

import (
	"context"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/names"
)

// labelPartOf marks what the chart installs (the operator's NATS Secret among them).
const (
	labelPartOf      = "app.kubernetes.io/part-of"
	labelPartOfValue = "webhook-operator"
)

// reservedSecret says whose the Secret m is when it belongs to the operator, which no
// endpoint may use whatever it says: the NATS credentials (the installation's and their
// mirror in each dispatcher namespace), anything in the operator's own namespace, anything the
// controller manages or the chart installed. "" for a tenant's Secret.
func (o *Options) reservedSecret(m metav1.Object) string {
	key := m.GetNamespace() + "/" + m.GetName()
	switch {
	case m.GetName() == names.NATSSecret:
		return "the operator's NATS credentials (mirrored into dispatcher namespaces)"
	case m.GetName() == names.OTELSecret:
		return "the operator's tracing credentials (mirrored into dispatcher namespaces)"
	case o.Config.NATS.CredentialsSecret != "" && key == o.Config.NATS.CredentialsSecret:
		return "the operator's NATS credentials"
	case o.Namespace != "" && m.GetNamespace() == o.Namespace:
		return "in the operator's own namespace " + o.Namespace
	case m.GetLabels()[names.LabelManagedBy] == names.LabelManagedByValue:
		return "an object the operator manages (labelled " + names.LabelManagedBy + "=" + names.LabelManagedByValue + ")"
	case m.GetLabels()[labelPartOf] == labelPartOfValue:
		return "part of the operator's installation (labelled " + labelPartOf + "=" + labelPartOfValue + ")"
	}
	return ""
}

// secretUse decides whether ep may use the Secret whose metadata is m (see consent.Secret):
// the Secret must consent, and the operator's own Secrets and ServiceAccount tokens never do.
func (o *Options) secretUse(m metav1.Object, ep *v1alpha1.WebhookEndpoint) error {
	return consent.Secret(m, ep, o.reservedSecret(m))
}

// generatedForEarlier reports whether m is the signing Secret generated for an endpoint of the
// same name that is gone (a different UID): the garbage collector deletes it.
func generatedForEarlier(m metav1.Object, ep *v1alpha1.WebhookEndpoint) bool {
	owner := metav1.GetControllerOf(m)
	return m.GetName() == names.SigningSecret(ep.Name) && m.GetLabels()[names.LabelManagedBy] == names.LabelManagedByValue &&
		owner != nil && owner.Kind == "WebhookEndpoint" && owner.Name == ep.Name && owner.UID != ep.UID
}

// secretMetadata reads a Secret's metadata only (from the metadata-only cache).
func secretMetadata(ctx context.Context, c client.Reader, key types.NamespacedName) (*metav1.PartialObjectMetadata, error) {
	m := secretMeta()
	if err := c.Get(ctx, key, m); err != nil {
		return nil, err
	}
	return m, nil
}

// usableSecrets are the names of the Secrets eps reference that the endpoint referencing each
// may use, sorted and each once: the only Secrets their dispatcher's Role lets it read. A
// Secret not found (or not yet in the cache) is left out until it appears.
func (o *Options) usableSecrets(ctx context.Context, c client.Reader, eps []*v1alpha1.WebhookEndpoint) ([]string, error) {
	seen := map[string]bool{}
	var names []string
	for _, ep := range eps {
		for _, ref := range referencedSecrets(ep) {
			if seen[ref.Name] {
				continue
			}
			m, err := secretMetadata(ctx, c, types.NamespacedName{Namespace: ep.Namespace, Name: ref.Name})
			if err != nil {
				if client.IgnoreNotFound(err) != nil {
					return nil, err
				}
				continue
			}
			if o.secretUse(m, ep) != nil {
				continue
			}
			seen[ref.Name] = true
			names = append(names, ref.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}
