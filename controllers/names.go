package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// FieldManager is the controller's server-side apply field manager. The dispatcher uses its
// own, so neither clobbers the other's status fields.
const FieldManager = "webhook-operator-controller"

// Finalizer holds a WebhookEndpoint until its pending deliveries are dead-lettered and its
// JetStream consumer and dispatcher are gone.
const Finalizer = "webhook-operator.io/finalizer"

// Names and labels of the objects the controller creates for dispatchers.
const (
	// SharedDispatcherName is the Deployment (and ServiceAccount, Role, RoleBinding) serving
	// the non-dedicated endpoints of a namespace.
	SharedDispatcherName = "webhook-dispatcher"
	// NATSSecretName is the mirror of --nats-credentials-secret in each dispatcher namespace.
	NATSSecretName = "webhook-dispatcher-nats"

	LabelName       = "app.kubernetes.io/name"
	LabelManagedBy  = "app.kubernetes.io/managed-by"
	LabelDispatcher = "webhook-operator.io/dispatcher"
	LabelEndpoint   = "webhook-operator.io/endpoint"

	// LabelNameValue and LabelManagedByValue mark every object the controller creates for
	// dispatchers; the controller caches only objects carrying them.
	LabelNameValue      = "webhook-dispatcher"
	LabelManagedByValue = "webhook-operator"
	// LabelNameStreams marks the streams ConfigMap of each namespace (StreamsConfigMapName).
	LabelNameStreams = "webhook-operator-streams"

	// AnnotationEndpoint names the endpoint of a dedicated dispatcher in full (a label value
	// is limited to 63 characters).
	AnnotationEndpoint = "webhook-operator.io/endpoint"
	// AnnotationNATSChecksum on the pod template changes when the mirrored NATS credentials do,
	// so dispatchers restart with the new ones; nothing else about Secrets is in the template.
	AnnotationNATSChecksum = "webhook-operator.io/nats-credentials-checksum"
	// AnnotationSourceVersion on the NATS mirror is the source Secret's resourceVersion.
	AnnotationSourceVersion = "webhook-operator.io/source-resource-version"
)

// maxNameLength keeps dispatcher names usable as label values.
const maxNameLength = 63

// DispatcherName is the Deployment delivering ep: the namespace's shared dispatcher, or its
// own `webhook-dispatcher-<endpoint>` when dedicated.
func DispatcherName(ep *v1alpha1.WebhookEndpoint) string {
	if isDedicated(ep) {
		return DedicatedDispatcherName(ep.Name)
	}
	return SharedDispatcherName
}

// DedicatedDispatcherName is `webhook-dispatcher-<endpoint>`, shortened with a hash of the
// endpoint's name when longer than 63 characters.
func DedicatedDispatcherName(endpoint string) string {
	return shorten(SharedDispatcherName+"-"+endpoint, maxNameLength)
}

// GeneratedSigningSecretName is the Secret created when spec.signing is absent:
// `<endpoint>-signing`, shortened with a hash when it would exceed 253 characters.
func GeneratedSigningSecretName(endpoint string) string {
	return shorten(endpoint+"-signing", 253)
}

// shorten keeps name when it fits in limit, else cuts it and appends a hash of all of it, so
// different long names stay different. The cut never ends in '-' or '.'.
func shorten(name string, limit int) string {
	if len(name) <= limit {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	suffix := hex.EncodeToString(sum[:5])
	return strings.TrimRight(name[:limit-len(suffix)-1], "-.") + "-" + suffix
}

func isDedicated(ep *v1alpha1.WebhookEndpoint) bool {
	return ep.Spec.Dispatcher != nil && ep.Spec.Dispatcher.Dedicated
}

// dispatcherLabels are the labels (and selector, without the endpoint label) of a dispatcher's
// objects.
func dispatcherLabels(name, dedicatedEndpoint string) map[string]string {
	l := selectorLabels(name)
	l[LabelManagedBy] = LabelManagedByValue
	if dedicatedEndpoint != "" && len(dedicatedEndpoint) <= maxNameLength {
		l[LabelEndpoint] = dedicatedEndpoint
	}
	return l
}

func selectorLabels(name string) map[string]string {
	return map[string]string{LabelName: LabelNameValue, LabelDispatcher: name}
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
// rotation, headersFrom, and the TLS client certificate and CA bundle. Each name appears once.
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
		add(GeneratedSigningSecretName(ep.Name), signingSecret, "the generated signing secret")
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
	return refs
}

// signingSecretName is the Secret whose key signs ep's requests.
func signingSecretName(ep *v1alpha1.WebhookEndpoint) string {
	if ep.Spec.Signing != nil {
		return ep.Spec.Signing.SecretRef.Name
	}
	return GeneratedSigningSecretName(ep.Name)
}

// retryPolicyName is the RetryPolicy ep refers to, or "" for the built-in default.
func retryPolicyName(ep *v1alpha1.WebhookEndpoint) string {
	if ep.Spec.RetryPolicyRef != nil {
		return ep.Spec.RetryPolicyRef.Name
	}
	return ""
}
