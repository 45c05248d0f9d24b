package controllers

import (
	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/names"
)

// FieldManager is the controller's server-side apply field manager. The dispatcher uses its
// own, so neither clobbers the other's status fields.
const FieldManager = "webhook-operator-controller"

// Finalizer holds a deleted WebhookEndpoint until its dispatcher, which serves it as long as
// the finalizer is there, has dead-lettered what was queued for it, and its JetStream consumers
// are deleted.
const Finalizer = "webhook-operator.io/finalizer"

// dispatcherLabels are the labels (and selector, without the endpoint label) of a dispatcher's
// objects.
func dispatcherLabels(name, dedicatedEndpoint string) map[string]string {
	l := selectorLabels(name)
	l[names.LabelManagedBy] = names.LabelManagedByValue
	if dedicatedEndpoint != "" && len(dedicatedEndpoint) <= validation.LabelValueMaxLength {
		l[names.LabelEndpoint] = dedicatedEndpoint
	}
	return l
}

func selectorLabels(name string) map[string]string {
	return map[string]string{names.LabelName: names.LabelNameValue, names.LabelDispatcher: name}
}

// secretKind says which Ready reason a missing Secret gives.
type secretKind int

const (
	signingSecret secretKind = iota
	otherSecret
)

// secretRef is one Secret an endpoint needs.
type secretRef struct {
	Name string
	Kind secretKind
	// What names the reference for messages, e.g. "spec.signing.secretRef".
	What string
}

// referencedSecrets lists the Secrets ep's dispatcher reads, the signing ones first: the
// signing secret in use (the generated one without spec.signing), the previous one during a
// rotation, headersFrom, the TLS client certificate and CA bundle, urlFrom, auth's client id,
// secret and keys, and the proxy's credentials. Each name appears once.
func referencedSecrets(ep *v1alpha1.WebhookEndpoint) []secretRef {
	var refs []secretRef
	add := func(name string, kind secretKind, what string) {
		if name == "" {
			return
		}
		for _, r := range refs {
			if r.Name == name {
				return
			}
		}
		refs = append(refs, secretRef{Name: name, Kind: kind, What: what})
	}
	if s := ep.Spec.Signing; s != nil {
		add(s.SecretRef.Name, signingSecret, "spec.signing.secretRef")
		if s.PreviousSecretRef != nil {
			add(s.PreviousSecretRef.Name, signingSecret, "spec.signing.previousSecretRef")
		}
	} else {
		add(names.SigningSecret(ep.Name), signingSecret, "the generated signing secret")
	}
	for _, h := range ep.Spec.HeadersFrom {
		add(h.SecretKeyRef.Name, otherSecret, "spec.headersFrom["+h.Name+"]")
	}
	if t := ep.Spec.TLS; t != nil {
		if t.ClientCertificateSecretRef != nil {
			add(t.ClientCertificateSecretRef.Name, otherSecret, "spec.tls.clientCertificateSecretRef")
		}
		if t.CABundleSecretRef != nil {
			add(t.CABundleSecretRef.Name, otherSecret, "spec.tls.caBundleSecretRef")
		}
	}
	if u := ep.Spec.URLFrom; u != nil {
		add(u.SecretKeyRef.Name, otherSecret, "spec.urlFrom.secretKeyRef")
	}
	if a := ep.Spec.Auth; a != nil {
		if o := a.OAuth2ClientCredentials; o != nil {
			add(o.ClientIDRef.Name, otherSecret, "spec.auth.oauth2ClientCredentials.clientIDRef")
			if o.ClientSecretRef != nil {
				add(o.ClientSecretRef.Name, otherSecret, "spec.auth.oauth2ClientCredentials.clientSecretRef")
			}
			if o.ClientAssertion != nil {
				add(o.ClientAssertion.KeyRef.Name, otherSecret, "spec.auth.oauth2ClientCredentials.clientAssertion.keyRef")
			}
		}
		if j := a.SignedJWT; j != nil {
			add(j.KeyRef.Name, otherSecret, "spec.auth.signedJWT.keyRef")
		}
	}
	if p := ep.Spec.Proxy; p != nil && p.CredentialsSecretRef != nil {
		add(p.CredentialsSecretRef.Name, otherSecret, "spec.proxy.credentialsSecretRef")
	}
	return refs
}

// signingSecretName is the Secret whose key signs ep's requests.
func signingSecretName(ep *v1alpha1.WebhookEndpoint) string {
	if ep.Spec.Signing != nil {
		return ep.Spec.Signing.SecretRef.Name
	}
	return names.SigningSecret(ep.Name)
}

// retryPolicyName is the RetryPolicy ep refers to, or "" for the built-in default.
func retryPolicyName(ep *v1alpha1.WebhookEndpoint) string {
	if ep.Spec.RetryPolicyRef != nil {
		return ep.Spec.RetryPolicyRef.Name
	}
	return ""
}
