package natsauth

import (
	"context"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/webhook-operator/webhook-operator/internal/kubeauth"
)

// DefaultAudience is the audience of the projected ServiceAccount tokens dispatchers (and,
// preferably, producers) connect with. A token of this audience is useless against the API
// server, so whoever sees it on its way to NATS cannot use it there.
const DefaultAudience = "nats.webhook-operator.io"

// Virtual resources of the API group: nothing stores them; Kubernetes RBAC on them decides what
// an identity may do on the bus, through SubjectAccessReviews.
const (
	// ResourceEvents: create publishes events of the namespace.
	ResourceEvents = kubeauth.ResourceEvents
	// ResourceDeliveries: get or list reads the delivery log, dead letters, pending counts and
	// health; create replays dead letters; delete purges them (on a connection that asks,
	// PurgeUser).
	ResourceDeliveries = kubeauth.ResourceDeliveries
)

// DispatcherLookup says whether name is the ServiceAccount of a dispatcher the controller made
// in namespace, and if so the endpoint it is dedicated to (empty for the shared one).
type DispatcherLookup func(ctx context.Context, namespace, name string) (endpoint string, ok bool, err error)

// SourceConsumerLookup says what a dispatcher of namespace reads on other namespaces' events
// streams: the consumers of the endpoints it serves (dedicated empty: the shared dispatcher's)
// that read source namespaces, and the events streams of the source namespaces that consent.
// Consumer names are the same on every events stream (streams.EndpointConsumerOf) and name
// the reading namespace.
type SourceConsumerLookup func(ctx context.Context, namespace, dedicated string) (consumers, sourceStreams []string, err error)

// MaxSourceConsumers bounds the consumers a dispatcher is granted on other namespaces' events
// streams (one per endpoint that reads source namespaces).
const MaxSourceConsumers = 512

// Identity is who a token belongs to, as the API server says.
type Identity struct {
	User authenticationv1.UserInfo
	// NATSAudience is true when the token was issued for the NATS audience.
	NATSAudience bool
}

// ServiceAccount returns the namespace and name of a ServiceAccount identity.
func (id Identity) ServiceAccount() (namespace, name string, ok bool) {
	rest, found := strings.CutPrefix(id.User.Username, "system:serviceaccount:")
	if !found {
		return "", "", false
	}
	namespace, name, ok = strings.Cut(rest, ":")
	return namespace, name, ok && namespace != "" && name != ""
}

// Kube asks the API server who a token is and what it may do.
type Kube struct {
	Client kubernetes.Interface
	// Audience of dispatcher tokens (DefaultAudience).
	Audience string
	// Dispatchers recognises the controller's dispatcher ServiceAccounts.
	Dispatchers DispatcherLookup
	// SourceConsumers lists a dispatcher's consumers on source namespaces' events streams; nil
	// grants none.
	SourceConsumers SourceConsumerLookup
	// Ingress is the ServiceAccount ("namespace/name") of the operator's HTTP ingress: with a
	// token of the NATS audience it gets RoleIngress. Empty: no connection does.
	Ingress string
}

// errNotAuthenticated says the API server does not accept the token.
var errNotAuthenticated = kubeauth.ErrNotAuthenticated

// Authenticate reviews token, first for the NATS audience, then for the API server's own.
func (k *Kube) Authenticate(ctx context.Context, token string) (Identity, error) {
	user, i, err := kubeauth.Reviewer{Client: k.Client}.Authenticate(ctx, token, []string{k.Audience}, nil)
	if err != nil {
		return Identity{}, err
	}
	return Identity{User: user, NATSAudience: i == 0}, nil
}

// Allowed asks whether user may verb resource (a virtual resource of the API group) in namespace.
func (k *Kube) Allowed(ctx context.Context, user authenticationv1.UserInfo, namespace, resource, verb string) (bool, error) {
	return kubeauth.Reviewer{Client: k.Client}.Allowed(ctx, user, namespace, resource, verb)
}
