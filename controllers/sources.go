package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/consent"
)

// indexSources indexes WebhookEndpoints by the namespaces of spec.sourceNamespaces.
const indexSources = "webhook-operator.io/sources"

// namespaceMeta is an empty Namespace metadata object, for the metadata-only cache.
func namespaceMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	return m
}

// sourceRefusal says why the endpoints of namespace reader may not receive the events of
// namespace source ("" when they may): source must exist and consent (consent.Source), besides
// the installation allowing cross-namespace sources at all.
func sourceRefusal(ctx context.Context, c client.Reader, reader, source string) (string, error) {
	if source == reader {
		return "", nil
	}
	m := namespaceMeta()
	if err := c.Get(ctx, types.NamespacedName{Name: source}, m); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("namespace %s does not exist; once created, it consents to namespace %s reading its events with the annotation %s: %q",
				source, reader, consent.EventReaders, reader), nil
		}
		return "", err
	}
	if err := consent.Source(m, reader); err != nil {
		return err.Error(), nil
	}
	return "", nil
}

// consentingSources are the namespaces of ep's spec.sourceNamespaces that consent to ep's
// namespace reading their events.
func consentingSources(ctx context.Context, c client.Reader, ep *v1alpha1.WebhookEndpoint) ([]string, error) {
	var out []string
	for _, src := range ep.Spec.SourceNamespaces {
		why, err := sourceRefusal(ctx, c, ep.Namespace, src)
		if err != nil {
			return nil, err
		}
		if why == "" {
			out = append(out, src)
		}
	}
	return out, nil
}
