// Package names holds the names, labels and annotations of the Kubernetes objects the operator
// creates, in the one place every part reads them from: the controller (which creates the
// objects), the dispatcher (which reads the signing Secret), the local stack (whose pod
// runner picks the dispatchers' Deployments by label) and the tests. JetStream's names are in
// internal/streams.
package names

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// Objects the controller creates for dispatchers.
const (
	// SharedDispatcher is the Deployment (and ServiceAccount, Role, RoleBinding) serving the
	// non-dedicated endpoints of a namespace.
	SharedDispatcher = "webhook-dispatcher"
	// SharedPool is the installation's shared dispatcher, in the controller's namespace: its
	// Deployment, ServiceAccount, Role, RoleBinding and the ConfigMap that lists the
	// namespaces it serves (the controller's --shared-dispatcher). Each served namespace
	// lets its ServiceAccount create tokens of the namespace's SharedDispatcher ServiceAccount
	// (a Role and RoleBinding of this name there).
	SharedPool = "webhook-shared-dispatcher"
	// NATSSecret is the mirror of --nats-credentials-secret in each dispatcher namespace.
	NATSSecret = "webhook-dispatcher-nats"
	// OTELSecret is the mirror of --dispatcher-otel-env-secret (the dispatchers' tracing
	// credentials) in each dispatcher namespace.
	OTELSecret = "webhook-dispatcher-otel"
	// EgressProxySecret is the mirror of --egress-proxy-credentials-secret (the installation's
	// egress proxy's username and password) in each dispatcher namespace.
	EgressProxySecret = "webhook-dispatcher-egress-proxy"
	// MetricsCASecret is the mirror of --dispatcher-metrics-ca-secret's ca.crt (the scraper
	// CA's certificate, whose client certificates may read a dispatcher's secure /metrics) in
	// each dispatcher namespace.
	MetricsCASecret = "webhook-dispatcher-metrics-ca"
	// StreamsConfigMap stands, in each namespace with endpoints, for the namespace's JetStream
	// streams and bucket: it lists their names, and its finalizer removes them when the
	// namespace is deleted.
	StreamsConfigMap = "webhook-operator-streams"
)

// Labels of the objects the controller creates for dispatchers.
const (
	LabelName       = "app.kubernetes.io/name"
	LabelManagedBy  = "app.kubernetes.io/managed-by"
	LabelDispatcher = "webhook-operator.io/dispatcher"
	LabelEndpoint   = "webhook-operator.io/endpoint"
	// LabelOwnDispatcher "true" on a Namespace asks for a dispatcher Deployment of the
	// namespace's own where the installation serves namespaces with its shared dispatcher
	// (the controller's --shared-dispatcher).
	LabelOwnDispatcher = "webhook-operator.io/own-dispatcher"

	// LabelNameValue and LabelManagedByValue mark every object the controller creates for
	// dispatchers; the controller caches only objects carrying them, and the local stack runs
	// the Deployments carrying them.
	LabelNameValue      = "webhook-dispatcher"
	LabelManagedByValue = "webhook-operator"
	// LabelNameStreams marks the streams ConfigMap of each namespace (StreamsConfigMap).
	LabelNameStreams = "webhook-operator-streams"
)

// Annotations of the objects the controller creates for dispatchers.
const (
	// AnnotationEndpoint names the endpoint of a dedicated dispatcher in full (a label value
	// is limited to 63 characters).
	AnnotationEndpoint = "webhook-operator.io/endpoint"
	// AnnotationNATSChecksum on the pod template changes when the mirrored NATS credentials do,
	// so dispatchers restart with the new ones; nothing else about Secrets is in the template.
	AnnotationNATSChecksum = "webhook-operator.io/nats-credentials-checksum"
	// AnnotationOTELChecksum on the pod template changes when the mirrored tracing credentials
	// do.
	AnnotationOTELChecksum = "webhook-operator.io/otel-checksum"
	// AnnotationSharedLane on the pod template says its dispatchers deliver shared-lane
	// endpoints from status.sharedSince on (AnnotationSharedLaneValue). An endpoint that
	// leaves consumers of its own joins the shared lane only once none of its dispatcher's
	// pods lacks it: a dispatcher of an earlier version still running would deliver from them
	// what the shared lane delivers too.
	AnnotationSharedLane = "webhook-operator.io/shared-lane"
	// AnnotationSharedLaneValue is AnnotationSharedLane's value.
	AnnotationSharedLaneValue = "from-shared-since"
	// AnnotationSourceVersion on a mirror (NATS, tracing) is the source Secret's
	// resourceVersion.
	AnnotationSourceVersion = "webhook-operator.io/source-resource-version"
)

// maxLabelValue keeps dispatcher names usable as label values.
const maxLabelValue = 63

// maxObjectName is the longest name of a Secret (a DNS subdomain).
const maxObjectName = 253

// Dispatcher is the Deployment delivering ep: the namespace's shared dispatcher, or its own
// `webhook-dispatcher-<endpoint>` when dedicated.
func Dispatcher(ep *v1alpha1.WebhookEndpoint) string {
	if Dedicated(ep) {
		return DedicatedDispatcher(ep.Name)
	}
	return SharedDispatcher
}

// Dedicated reports whether ep asks for its own dispatcher.
func Dedicated(ep *v1alpha1.WebhookEndpoint) bool {
	return ep.Spec.Dispatcher != nil && ep.Spec.Dispatcher.Dedicated
}

// DedicatedDispatcher is `webhook-dispatcher-<endpoint>`, shortened with a hash of the
// endpoint's name when longer than 63 characters.
func DedicatedDispatcher(endpoint string) string {
	return shorten(SharedDispatcher+"-"+endpoint, maxLabelValue)
}

// SigningSecret is the Secret the controller generates when spec.signing is absent, and the
// one the dispatcher then signs with: `<endpoint>-signing`, shortened with a hash when it would
// exceed 253 characters. Its key is SigningSecretKey.
func SigningSecret(endpoint string) string {
	return shorten(endpoint+"-signing", maxObjectName)
}

// SigningSecretKey is the key of the generated signing Secret holding the whsec_ secret.
const SigningSecretKey = "secret"

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
