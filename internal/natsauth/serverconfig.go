package natsauth

import (
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// Accounts of the nats-server configuration webhook-operator runs with.
const (
	// AccountJetStream holds every stream and bucket; only the controller logs in to it.
	AccountJetStream = "WEBHOOKS"
	// AccountTenants is where the auth callout places every dispatcher, producer and user. It
	// has no JetStream of its own: it imports the JetStream API, acknowledgements and the
	// operator's subjects from AccountJetStream as services, so that a reply subject a tenant
	// chooses is always one of AccountTenants and never a stream's subject.
	AccountTenants = "TENANTS"
	// AccountAuth is where the callout service listens for authorization requests.
	AccountAuth = "AUTH"
	// AccountSystem is the server's system account.
	AccountSystem = "SYS"
)

// Default user names of the two static users that bypass the callout.
const (
	DefaultAdminUser   = "webhook-operator"
	DefaultCalloutUser = "webhook-operator-callout"
)

// ServerConfig is the part of a nats-server configuration that webhook-operator needs: the
// accounts, the two static users, the exports and imports between the JetStream and tenants'
// accounts, the auth callout and, optionally, TLS with client certificates (Render); and the
// connections between servers, routes, gateways and leaf nodes, each with its own credential
// and CA (RenderPeers). Both write nats-server's configuration syntax; tests and the local stack parse that same text
// (server.Options.ProcessConfigString), so what runs is what docs/multi-tenancy.md and docs/install.md show.
type ServerConfig struct {
	// AdminUser and AdminPassword log the controller in to AccountJetStream. The password may
	// be a bcrypt hash ("$2a$...").
	AdminUser, AdminPassword string
	// CalloutUser and CalloutPassword log the controller's callout service in to AccountAuth.
	CalloutUser, CalloutPassword string
	// Issuer is the public account nkey (A...) whose seed the controller signs users with.
	Issuer string
	// XKey, when set, is the public curve key (X...) the server encrypts authorization requests
	// to; the controller holds its seed.
	XKey string
	// EventsSubjectPrefix and InternalSubjectPrefix are the first tokens of the events' and the
	// operator's subjects (webhooks, whk).
	EventsSubjectPrefix, InternalSubjectPrefix string
	// AuthTimeout bounds a client's authentication, the callout's answer included (default 5s).
	AuthTimeout time.Duration
	// TLS, when set, makes the server require TLS.
	TLS *ServerTLS
	// LeafSites are remote sites whose leaf node connections publish one namespace's events.
	// They arrive at the Leafnodes listener.
	LeafSites []LeafSite
	// Cluster, Gateway and Leafnodes, when set, are the connections between servers (routes,
	// gateways, leaf nodes), each with its credential and a CA of its own: RenderPeers writes
	// them (see peers.go).
	Cluster   *Cluster
	Gateway   *Gateway
	Leafnodes *Leafnodes
	// TenantLimits bound every connection of AccountTenants (zero fields: DefaultLimits).
	// They are the callout's own Limits: nats-server does not enforce the limits of a user
	// JWT an auth callout issues in a configuration without an operator, so the account
	// carries the two it can enforce per connection, payload and subscriptions.
	TenantLimits Limits
	// JetStreamMaxStore and JetStreamMaxMemory, when set, bound the file and memory storage
	// of AccountJetStream, which holds every namespace's streams: what tenants write there
	// cannot take more of the server than this, and a stream with a size bound reserves it
	// (so a namespace whose streams do not fit is refused when the controller creates them,
	// rather than filling the store later).
	JetStreamMaxStore, JetStreamMaxMemory int64
}

// LeafSite is a remote site's leaf node connection that produces one namespace's events. Its
// connection is bound to an account of its own (LEAF_<Name>) that imports that namespace's
// event subjects and nothing else, and its login may not publish the operator's operational
// events among them (webhook_operator.*, the namespace's dispatcher's alone), so whatever runs
// behind the leaf node may publish the namespace's events and do nothing more. Leaf
// connections carry no Kubernetes identity: the site's login is static, like the controller's.
type LeafSite struct {
	Name, Namespace, User, Password string
}

// account is the site's account.
func (l LeafSite) account() string { return "LEAF_" + l.Name }

// ServerTLS is the server's certificate and the CA its clients' certificates must chain to.
type ServerTLS struct {
	CertFile, KeyFile string
	// CAFile verifies client certificates (and is what clients trust).
	CAFile string
	// Verify requires every client to present a certificate signed by CAFile.
	Verify bool
}

// NonceUser is the public user nkey of a user that exists only so that the server sends every
// client a nonce to sign: nats-server does so only when some nkey user is configured
// (AlwaysEnableNonce has no configuration key), and without a nonce a connection cannot prove
// the nkey its inbox is derived from (see InboxOf). No seed exists for this key, so no one can
// log in as it: its 32 bytes are the SHA-256 digest of a fixed sentence, not the public half of
// a key pair (finding a seed whose Ed25519 public key is a given digest is breaking Ed25519),
// and anyone can check that it is (nonceUserKey). It has no permissions either, and a login as
// it would still go through the callout (it is not one of the auth_users). Making the
// callout's own login an nkey user would do the same, but would put one more seed in the
// controller's Secret for nothing.
var NonceUser = nonceUserKey()

func nonceUserKey() string {
	sum := sha256.Sum256([]byte("webhook-operator: an nkey user that makes nats-server send nonces; it has no seed"))
	b, err := nkeys.Encode(nkeys.PrefixByteUser, sum[:])
	if err != nil {
		panic(err)
	}
	return string(b)
}

// exports are what AccountJetStream offers AccountTenants; permissions narrow them per user.
func (c ServerConfig) exports() []string {
	return []string{"$JS.API.>", "$JS.ACK.>", "$KV.>", c.EventsSubjectPrefix + ".>", c.InternalSubjectPrefix + ".>"}
}

// Render writes the configuration. It holds the passwords as given: put bcrypt hashes in a
// file others can read.
func (c ServerConfig) Render() string {
	var b strings.Builder
	w := func(indent int, format string, a ...any) {
		b.WriteString(strings.Repeat("  ", indent))
		fmt.Fprintf(&b, format, a...)
		b.WriteByte('\n')
	}
	timeout := c.AuthTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	w(0, "# webhook-operator: accounts, users and the auth callout (internal/natsauth).")
	w(0, "system_account: %s", AccountSystem)
	// A CONNECT carries the client's Kubernetes token, which can be several KiB (OIDC groups).
	w(0, "max_control_line: %d", MaxTokenBytes*2)
	w(0, "accounts {")
	w(1, "%s {", AccountJetStream)
	if c.JetStreamMaxStore > 0 || c.JetStreamMaxMemory > 0 {
		limits := []string{}
		if c.JetStreamMaxStore > 0 {
			limits = append(limits, fmt.Sprintf("max_file: %d", c.JetStreamMaxStore))
		}
		if c.JetStreamMaxMemory > 0 {
			limits = append(limits, fmt.Sprintf("max_mem: %d", c.JetStreamMaxMemory))
		}
		w(2, "jetstream: { %s }", strings.Join(limits, ", "))
	} else {
		w(2, "jetstream: enabled")
	}
	w(2, "users: [ { user: %s, password: %s } ]", quote(c.AdminUser), quote(c.AdminPassword))
	w(2, "exports: [")
	for i, s := range c.exports() {
		if i == 0 {
			// The JetStream API answers some requests (pulls, batched gets) with many messages.
			w(3, "{ service: %s, response_type: stream }", quote(s))
			continue
		}
		w(3, "{ service: %s }", quote(s))
	}
	w(2, "]")
	w(1, "}")
	w(1, "%s {", AccountTenants)
	// The limits of every tenant connection (the callout's user JWTs say the same, but the
	// server enforces those of a callout's users only with an operator).
	var lim jwt.Limits
	c.TenantLimits.apply(&lim)
	w(2, "limits: { max_payload: %d, max_subscriptions: %d }", lim.Payload, lim.Subs)
	w(2, "imports: [")
	for _, s := range c.exports() {
		w(3, "{ service: { account: %s, subject: %s } }", AccountJetStream, quote(s))
	}
	w(2, "]")
	w(1, "}")
	for _, l := range c.LeafSites {
		w(1, "%s {", l.account())
		// The site's login, for leaf node connections only. Its publish permissions are what
		// the site may send into this server: the namespace's events, not the operator's
		// operational events among them.
		w(2, "users: [ { user: %s, password: %s, allowed_connection_types: [ \"LEAFNODE\" ], permissions: { publish: { deny: [ %s ] } } } ]",
			quote(l.User), quote(l.Password), quote(c.EventsSubjectPrefix+"."+l.Namespace+"."+records.OpsTypePrefix+".>"))
		w(2, "imports: [ { service: { account: %s, subject: %s } } ]", AccountJetStream, quote(c.EventsSubjectPrefix+"."+l.Namespace+".>"))
		w(1, "}")
	}
	w(1, "%s {", AccountAuth)
	w(2, "users: [")
	w(3, "{ user: %s, password: %s }", quote(c.CalloutUser), quote(c.CalloutPassword))
	w(3, "# No seed exists for this nkey and it may do nothing: it makes the server send every")
	w(3, "# client a nonce, which a tenant's connection signs with the nkey its inbox is bound to.")
	w(3, "{ nkey: %s, permissions: { publish: { deny: \">\" }, subscribe: { deny: \">\" } } }", NonceUser)
	w(2, "]")
	w(1, "}")
	w(1, "%s {}", AccountSystem)
	w(0, "}")
	w(0, "authorization {")
	w(1, "timeout: %s", strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64))
	w(1, "auth_callout {")
	w(2, "issuer: %s", quote(c.Issuer))
	w(2, "account: %s", AccountAuth)
	users := []string{quote(c.AdminUser), quote(c.CalloutUser)}
	for _, l := range c.LeafSites {
		users = append(users, quote(l.User))
	}
	w(2, "auth_users: [ %s ]", strings.Join(users, ", "))
	if c.XKey != "" {
		w(2, "xkey: %s", quote(c.XKey))
	}
	w(1, "}")
	w(0, "}")
	if t := c.TLS; t != nil {
		w(0, "tls {")
		w(1, "cert_file: %s", quote(t.CertFile))
		w(1, "key_file: %s", quote(t.KeyFile))
		w(1, "ca_file: %s", quote(t.CAFile))
		w(1, "verify: %t", t.Verify)
		w(1, "timeout: 5")
		w(0, "}")
	}
	return b.String()
}

// quote is a double-quoted string of the configuration syntax.
func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}
