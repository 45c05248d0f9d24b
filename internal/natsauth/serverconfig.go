package natsauth

import (
	"fmt"
	"strconv"
	"strings"
	"time"
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
// accounts, the auth callout and, optionally, TLS with client certificates. Render writes it in
// nats-server's configuration syntax; tests and the local stack parse that same text
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
	LeafSites []LeafSite
}

// LeafSite is a remote site's leaf node connection that produces one namespace's events. Its
// connection is bound to an account of its own (LEAF_<Name>) that imports that namespace's
// event subjects and nothing else, so whatever runs behind the leaf node may publish the
// namespace's events and do nothing more. Leaf connections carry no Kubernetes identity: the
// site's login is static, like the controller's.
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
	w(2, "jetstream: enabled")
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
	w(2, "imports: [")
	for _, s := range c.exports() {
		w(3, "{ service: { account: %s, subject: %s } }", AccountJetStream, quote(s))
	}
	w(2, "]")
	w(1, "}")
	for _, l := range c.LeafSites {
		w(1, "%s {", l.account())
		w(2, "imports: [ { service: { account: %s, subject: %s } } ]", AccountJetStream, quote(c.EventsSubjectPrefix+"."+l.Namespace+".>"))
		w(1, "}")
	}
	w(1, "%s {", AccountAuth)
	w(2, "users: [ { user: %s, password: %s } ]", quote(c.CalloutUser), quote(c.CalloutPassword))
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

// LeafAuthorization is the authorization block of the server's leafnodes block: the sites'
// logins, each bound to its account. Empty without sites.
func (c ServerConfig) LeafAuthorization() string {
	if len(c.LeafSites) == 0 {
		return ""
	}
	var users []string
	for _, l := range c.LeafSites {
		users = append(users, fmt.Sprintf("{ user: %s, password: %s, account: %s }", quote(l.User), quote(l.Password), l.account()))
	}
	return "authorization { users: [ " + strings.Join(users, ", ") + " ] }"
}

// quote is a double-quoted string of the configuration syntax.
func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}
