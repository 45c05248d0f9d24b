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
	// ResourceDeliveries: create writes deliveries (test deliveries, replays); delete lets the
	// data API server purge dead letters (on a connection that asks, PurgeUser). Reading is
	// no grant on the bus: deliveries and dead letters are read through the data API.
	ResourceDeliveries = kubeauth.ResourceDeliveries
)

// DispatcherAccount is a dispatcher's ServiceAccount as the controller made it.
type DispatcherAccount struct {
	// Endpoint is the endpoint the dispatcher is dedicated to (empty for the shared one).
	Endpoint string
	// UID is the ServiceAccount's: a token is the dispatcher's only if its identity has this
	// UID, not merely the name (a ServiceAccount deleted and made again by someone else has
	// another).
	UID string
}

// DispatcherLookup says whether name is the ServiceAccount of a dispatcher the controller made
// in namespace, and if so which.
type DispatcherLookup func(ctx context.Context, namespace, name string) (account DispatcherAccount, ok bool, err error)

// SourceConsumer is one durable consumer a dispatcher reads on another namespace's events
// stream: one endpoint's (its name names the reading namespace, streams.EndpointConsumerOf) on
// one source namespace's stream.
type SourceConsumer struct {
	Stream, Consumer string
}

// SourceConsumerLookup says what a dispatcher of namespace reads on other namespaces' events
// streams now: for each endpoint it serves (dedicated empty: the shared dispatcher's) that
// reads source namespaces, its consumer on the events stream of each of them that consents,
// oldest endpoint first. Each is granted as that pair, so a withdrawn consent is out of the
// next grant whether or not the consumer is gone yet.
type SourceConsumerLookup func(ctx context.Context, namespace, dedicated string) ([]SourceConsumer, error)

// EventPublishingLookup says whether producers of namespace may publish its events, and
// replayers write its deliveries, to the bus directly: false while its WebhookQuota sets a
// publish rate, which NATS cannot enforce (the ingress and the controller do).
type EventPublishingLookup func(ctx context.Context, namespace string) (allowed bool, err error)

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
	// Audience of the tokens connections bring (DefaultAudience).
	Audience string
	// AllowAPIAudience also accepts tokens of the API server's own audience (a kubeconfig
	// user's), which are good against the API server too: whoever sees one on its way to NATS
	// can use it there. Off by default (--nats-allow-api-audience-tokens).
	AllowAPIAudience bool
	// Dispatchers recognises the controller's dispatcher ServiceAccounts.
	Dispatchers DispatcherLookup
	// SourceConsumers lists a dispatcher's consumers on source namespaces' events streams; nil
	// grants none.
	SourceConsumers SourceConsumerLookup
	// EventPublishing, when set, may withhold producers' and replayers' direct publishing in a
	// namespace (Grant.RateLimited).
	EventPublishing EventPublishingLookup
	// Ingress is the ServiceAccount ("namespace/name") of the operator's HTTP ingress: with a
	// token of the NATS audience it gets RoleIngress. Empty: no connection does.
	Ingress string
	// DataAPI is the ServiceAccount ("namespace/name") of the data API server (webhook-operator
	// apiserver): with a token of the NATS audience it gets RoleDataAPI. Empty: no connection
	// does.
	DataAPI string
}

// errNotAuthenticated says the API server does not accept the token.
var errNotAuthenticated = kubeauth.ErrNotAuthenticated

// Authenticate reviews token for the NATS audience and, when AllowAPIAudience, then for the API
// server's own. A review counts only if the API server says the token is of the audience it
// was asked about (status.audiences).
func (k *Kube) Authenticate(ctx context.Context, token string) (Identity, error) {
	sets := [][]string{{k.Audience}}
	if k.AllowAPIAudience {
		sets = append(sets, nil)
	}
	user, i, err := kubeauth.Reviewer{Client: k.Client}.Authenticate(ctx, token, sets...)
	if err != nil {
		return Identity{}, err
	}
	return Identity{User: user, NATSAudience: i == 0}, nil
}

// Allowed asks whether user may verb resource (a virtual resource of the API group) in namespace.
func (k *Kube) Allowed(ctx context.Context, user authenticationv1.UserInfo, namespace, resource, verb string) (bool, error) {
	return kubeauth.Reviewer{Client: k.Client}.Allowed(ctx, user, namespace, resource, verb)
}
