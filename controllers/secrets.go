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

// reservedSecret says whose the Secret m is when the installation's settings make it the
// operator's: its NATS credentials Secret, anything in its own namespace. What the Secret's
// name and labels say (the mirrors, what the controller manages or the chart installed) is
// consent.Reserved's. "" otherwise.
func (o *Options) reservedSecret(m metav1.Object) string {
	switch {
	case o.Config.NATS.CredentialsSecret != "" && m.GetNamespace()+"/"+m.GetName() == o.Config.NATS.CredentialsSecret:
		return "the operator's NATS credentials"
	case o.Namespace != "" && m.GetNamespace() == o.Namespace:
		return "in the operator's own namespace " + o.Namespace
	}
	return ""
}

// secretUse decides whether ep may use the Secret whose metadata is m (see consent.Secret):
// the Secret must consent, and the operator's own Secrets and ServiceAccount tokens never do,
// whoever owns them.
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
