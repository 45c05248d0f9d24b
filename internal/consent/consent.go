// Package consent decides what a namespace's endpoints may take that is not theirs alone: a
// Secret is used by an endpoint only when the Secret names it, and a namespace's events are
// read by another namespace's endpoints only when the source Namespace names that namespace.
// The owner of the thing consents, in the thing itself, so that being allowed to create a
// WebhookEndpoint never grants more than being allowed to read what it points at.
package consent

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/webhook-operator/webhook-operator/internal/names"
)

// Annotations that give consent, and the value that names everyone.
const (
	// AllowedEndpoints on a Secret lists the WebhookEndpoints of its namespace that may use it
	// (signing secret, headersFrom, TLS client certificate, CA bundle): comma-separated names,
	// or "*" for every endpoint of the namespace.
	AllowedEndpoints = "webhook-operator.io/allowed-endpoints"
	// EventReaders on a Namespace lists the namespaces whose endpoints may receive its events
	// (their spec.sourceNamespaces names it): comma-separated namespace names, or "*" for all.
	EventReaders = "webhook-operator.io/event-readers"
	// Everyone, as the whole value of either annotation, names every endpoint or namespace.
	Everyone = "*"
)

// maxListed bounds how many names of an annotation are read.
const maxListed = 256

// Names is the list an annotation value holds: trimmed, without empty entries, at most
// maxListed of them.
func Names(value string) []string {
	var out []string
	for _, n := range strings.Split(value, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
			if len(out) == maxListed {
				break
			}
		}
	}
	return out
}

// Lists reports whether the annotation value names name, or everyone.
func Lists(value, name string) bool {
	return slices.ContainsFunc(Names(value), func(n string) bool { return n == Everyone || n == name })
}

// with is the annotation value that also names name, for a message saying what to write.
func with(value, name string) string {
	return strings.Join(append(Names(value), name), ",")
}

// Refusal says why an endpoint may not use a Secret, in words that say what to do.
type Refusal struct {
	// Never is true when no consent can make the Secret usable (a ServiceAccount token, the
	// operator's own objects); otherwise the Secret's owner can add the annotation.
	Never bool
	// Message completes "Secret <namespace>/<name> (<where it is referenced>) ...".
	Message string
}

func (r *Refusal) Error() string { return r.Message }

// Labels that mark the operator's own objects: LabelPartOf=LabelPartOfValue on what the chart
// installs (the operator's NATS Secret among them); names.LabelManagedBy=
// names.LabelManagedByValue on what the controller makes.
const (
	LabelPartOf      = "app.kubernetes.io/part-of"
	LabelPartOfValue = "webhook-operator"
)

// Reserved says whose the Secret s is when it belongs to the operator, as far as the Secret
// itself tells: the mirrors of the NATS and tracing credentials in each dispatcher namespace
// (by name), anything the controller manages or the chart installed (by label). The one
// exception is the signing Secret the controller generates for ep itself (named
// names.SigningSecret of ep, labelled as the controller's and controlled by ep). "" for a
// tenant's Secret. The installation adds its own (its credentials Secret, its namespace): see
// Secret.
func Reserved(s, ep metav1.Object) string {
	switch {
	case s.GetName() == names.NATSSecret:
		return "the operator's NATS credentials (mirrored into dispatcher namespaces)"
	case s.GetName() == names.OTELSecret:
		return "the operator's tracing credentials (mirrored into dispatcher namespaces)"
	case s.GetName() == names.EgressProxySecret:
		return "the operator's egress proxy credentials (mirrored into dispatcher namespaces)"
	case s.GetLabels()[names.LabelManagedBy] == names.LabelManagedByValue && !generatedFor(s, ep):
		return "an object the operator manages (labelled " + names.LabelManagedBy + "=" + names.LabelManagedByValue + ")"
	case s.GetLabels()[LabelPartOf] == LabelPartOfValue:
		return "part of the operator's installation (labelled " + LabelPartOf + "=" + LabelPartOfValue + ")"
	}
	return ""
}

// generatedFor reports whether s is the signing Secret the controller generates for ep.
func generatedFor(s, ep metav1.Object) bool {
	return s.GetName() == names.SigningSecret(ep.GetName()) && metav1.IsControlledBy(s, ep)
}

// Secret decides whether endpoint ep (a WebhookEndpoint of s's namespace) may use the Secret
// whose metadata is s: nil when it may, a *Refusal when not. The reserved Secrets come first,
// before anything that could make a Secret the endpoint's own:
//
//   - A ServiceAccount token Secret (it carries the kubernetes.io/service-account.name
//     annotation, which the API server requires of that type) is never usable.
//   - installation, when not empty, says whose the Secret is by the installation's own
//     settings (its NATS credentials Secret, its namespace); Reserved says it by the Secret's
//     name and labels. Either way the Secret is never usable, whatever its annotations or
//     owner references say: an owner reference is written by whoever may write the Secret.
//   - A Secret ep controls (the signing Secret the controller generates for it) consents to ep
//     by construction.
//   - Any other Secret needs the AllowedEndpoints annotation naming ep (or "*").
func Secret(s, ep metav1.Object, installation string) error {
	if _, ok := s.GetAnnotations()[corev1.ServiceAccountNameKey]; ok {
		return &Refusal{Never: true, Message: "is a ServiceAccount token, which no endpoint may ever use"}
	}
	reserved := installation
	if reserved == "" {
		reserved = Reserved(s, ep)
	}
	if reserved != "" {
		return &Refusal{Never: true, Message: fmt.Sprintf("is %s, which no endpoint may ever use", reserved)}
	}
	if metav1.IsControlledBy(s, ep) {
		return nil
	}
	endpoint := ep.GetName()
	value, ok := s.GetAnnotations()[AllowedEndpoints]
	if ok && Lists(value, endpoint) {
		return nil
	}
	msg := fmt.Sprintf("does not consent to endpoint %s: its owner must annotate it with %s: %q (comma-separated endpoint names, or %q for every endpoint of the namespace)",
		endpoint, AllowedEndpoints, with(value, endpoint), Everyone)
	if ok {
		msg = fmt.Sprintf("does not consent to endpoint %s (%s is %q): its owner must set it to %q (comma-separated endpoint names, or %q for every endpoint of the namespace)",
			endpoint, AllowedEndpoints, value, with(value, endpoint), Everyone)
	}
	return &Refusal{Message: msg}
}

// SecretMetadata is what Secret (and Reserved) read of a Secret's metadata: its name,
// namespace and resourceVersion, the annotations and labels they look at, and its controller
// reference. A reader that keeps many Secrets keeps this of each and decides the same.
func SecretMetadata(m metav1.ObjectMeta) metav1.ObjectMeta {
	out := metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}
	out.Annotations = kept(m.Annotations, corev1.ServiceAccountNameKey, AllowedEndpoints)
	out.Labels = kept(m.Labels, names.LabelManagedBy, LabelPartOf)
	if ref := metav1.GetControllerOfNoCopy(&m); ref != nil {
		out.OwnerReferences = []metav1.OwnerReference{*ref}
	}
	return out
}

// kept is the entries of m under keys; nil when there are none.
func kept(m map[string]string, keys ...string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}

// Source decides whether the endpoints of namespace reader may receive the events of the
// Namespace source (its metadata): nil when source's EventReaders annotation names reader (or
// "*"), else an error that says what source's owner must write. A namespace always reads its
// own events.
func Source(source metav1.Object, reader string) error {
	if source.GetName() == reader {
		return nil
	}
	value, ok := source.GetAnnotations()[EventReaders]
	if ok && Lists(value, reader) {
		return nil
	}
	return fmt.Errorf("namespace %s does not consent to namespace %s reading its events: its owner must annotate Namespace %s with %s: %q (comma-separated namespace names, or %q for all)",
		source.GetName(), reader, source.GetName(), EventReaders, with(value, reader), Everyone)
}
