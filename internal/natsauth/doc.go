// Package natsauth gives every NATS connection of a tenant an identity derived from
// Kubernetes. `webhook-operator callout` (a Deployment of its own, apart from the controller)
// serves nats-server's auth callout: a dispatcher connects with its
// projected ServiceAccount token (audience DefaultAudience), a producer or a `kubectl webhooks`
// user with any Kubernetes bearer token and the namespace it wants as the NATS user; the
// callout verifies the token with a TokenReview, decides the connection's roles (the
// namespace's dispatcher, the operator's HTTP ingress (RoleIngress: every namespace's event
// subjects and nothing else), or what SubjectAccessReviews on the virtual resources
// webhookevents and webhookdeliveries allow, asked through internal/kubeauth), and answers with
// a user JWT whose allow-lists name only that namespace's streams, subjects, consumers and
// bucket, and the connection's own inbox. That inbox is bound to the connection: the client
// makes a new user nkey (ClientOptions) and signs the nonce the server sends it; the callout
// verifies the signature and grants the inbox of that key (InboxOf) and nothing else, so no
// connection can subscribe to another's replies.
//
// The server configuration (ServerConfig) has four accounts: AccountJetStream holds the
// streams and only the controller logs in to it; AccountTenants, where every callout user is
// placed, imports the JetStream API and the operator's subjects from it as services. Tenants
// never share an account with a stream: a reply subject is not checked against a publisher's
// permissions, so in a shared account a request (or a pull) whose reply names another
// namespace's subject would make the server write there. Through an import, the reply stays
// in AccountTenants.
//
// The connections between servers (routes, gateways, leaf nodes) are outside what the callout
// decides, and a server that joins a cluster gets every account: ServerConfig.RenderPeers
// writes them, each with its own credential and TLS with a CA of its own (never the clients'
// CA, whose client certificate every dispatcher namespace holds), and refuses them without.
package natsauth
