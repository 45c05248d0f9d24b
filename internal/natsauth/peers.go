package natsauth

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// The connections between servers (routes within a cluster, gateways between clusters, leaf
// nodes from remote sites) carry every account's messages: a server that joins a cluster as a
// route sees and may write every namespace's streams, whatever the auth callout decides for
// clients. So each kind has a credential of its own and TLS with a CA of its own, which both
// sides verify (mutual TLS): never the CA that signed the clients' certificates, since a
// client certificate is handed to every namespace with a dispatcher (the mirrored NATS
// Secret), and a tenant holding it must not be able to join the cluster.

// Default listeners of the servers' peer connections.
const (
	DefaultClusterListen  = "0.0.0.0:6222"
	DefaultGatewayListen  = "0.0.0.0:7222"
	DefaultLeafnodeListen = "0.0.0.0:7422"
	// DefaultRouteUser and DefaultGatewayUser are the logins servers present to each other.
	DefaultRouteUser   = "route"
	DefaultGatewayUser = "gateway"
)

// PeerTLS is the TLS of one kind of connection between servers: this server's certificate and
// key, and the CA the other side's certificate must chain to. Both sides present a certificate
// and verify the other's (the server forces it for routes and gateways; the leafnodes block
// says verify).
type PeerTLS struct {
	CertFile, KeyFile string
	// CAFile verifies the other side: a CA of its own, not the clients' (ServerTLS.CAFile).
	CAFile string
}

// Cluster is the server's cluster block: the routes between the servers of one cluster.
type Cluster struct {
	// Name of the cluster (also its gateway name in a supercluster).
	Name string
	// Listen is where the server takes routes (DefaultClusterListen).
	Listen string
	// Routes are the route listeners of the cluster's servers, host:port (a scheme is
	// dropped): the server skips its own. Each is rendered with the route credential, which a
	// server presents on the routes it opens.
	Routes []string
	// NoAdvertise keeps the servers' own addresses out of what clients are told (clients
	// reaching the cluster through a Service or a port-forward).
	NoAdvertise bool
	// User and Password are the route credential. The password is held in clear: a server
	// sends it on the routes it opens, and nats-server cannot send a bcrypt hash.
	User, Password string
	TLS            *PeerTLS
}

// Gateway is the server's gateway block: the connections between the clusters of a
// supercluster.
type Gateway struct {
	// Name is the cluster's name in the supercluster (the Cluster's name when both are set).
	Name string
	// Listen is where the server takes gateway connections (DefaultGatewayListen).
	Listen string
	// User and Password are the gateway credential, the same in every cluster of the
	// supercluster: a server presents its own on the gateways it opens.
	User, Password string
	// Remotes are the clusters to connect to (the cluster's own may be listed: it is skipped).
	Remotes []RemoteGateway
	TLS     *PeerTLS
}

// RemoteGateway is one cluster of a supercluster and its gateway URLs.
type RemoteGateway struct {
	Name string
	URLs []string
}

// Leafnodes is the server's leafnodes block: where remote sites' leaf node connections
// arrive. Each site logs in as its LeafSite (a user of its own account, for leaf node
// connections only); a leaf connection without such a login goes to the auth callout, which
// refuses it (it carries no Kubernetes token).
type Leafnodes struct {
	// Listen is where the server takes leaf node connections (DefaultLeafnodeListen).
	Listen string
	TLS    *PeerTLS
}

// RenderPeers writes the cluster, gateway and leafnodes blocks of the configuration, those
// that are set, for a file the server's configuration includes next to Render's. Each needs
// its TLS and (routes and gateways) its credential: a connection between servers without them
// is refused here, not rendered.
func (c ServerConfig) RenderPeers() (string, error) {
	if err := c.checkPeers(); err != nil {
		return "", err
	}
	var b strings.Builder
	w := func(indent int, format string, a ...any) {
		b.WriteString(strings.Repeat("  ", indent))
		fmt.Fprintf(&b, format, a...)
		b.WriteByte('\n')
	}
	// verify: the other side presents a certificate of CAFile (nats-server forces it on
	// routes and gateways anyway).
	tlsBlock := func(t *PeerTLS) {
		w(1, "tls {")
		w(2, "cert_file: %s", quote(t.CertFile))
		w(2, "key_file: %s", quote(t.KeyFile))
		w(2, "ca_file: %s", quote(t.CAFile))
		w(2, "verify: true")
		w(2, "timeout: 5")
		w(1, "}")
	}
	w(0, "# webhook-operator: the connections between servers (internal/natsauth), each with its own")
	w(0, "# credential and a CA of its own, which is not the clients' CA.")
	if cl := c.Cluster; cl != nil {
		w(0, "cluster {")
		w(1, "name: %s", quote(cl.Name))
		w(1, "listen: %s", quote(orDefault(cl.Listen, DefaultClusterListen)))
		if cl.NoAdvertise {
			w(1, "no_advertise: true")
		}
		w(1, "authorization { user: %s, password: %s, timeout: 5 }", quote(cl.User), quote(cl.Password))
		tlsBlock(cl.TLS)
		var routes []string
		for _, r := range cl.Routes {
			routes = append(routes, quote(peerURL("nats-route", r, cl.User, cl.Password)))
		}
		w(1, "routes: [ %s ]", strings.Join(routes, ", "))
		w(0, "}")
	}
	if g := c.Gateway; g != nil {
		w(0, "gateway {")
		w(1, "name: %s", quote(g.Name))
		w(1, "listen: %s", quote(orDefault(g.Listen, DefaultGatewayListen)))
		// A server presents this login on the gateways it opens (their URLs carry none).
		w(1, "authorization { user: %s, password: %s, timeout: 5 }", quote(g.User), quote(g.Password))
		tlsBlock(g.TLS)
		if len(g.Remotes) > 0 {
			w(1, "gateways: [")
			for _, r := range g.Remotes {
				var urls []string
				for _, u := range r.URLs {
					urls = append(urls, quote(peerURL("nats", u, "", "")))
				}
				w(2, "{ name: %s, urls: [ %s ] }", quote(r.Name), strings.Join(urls, ", "))
			}
			w(1, "]")
		}
		w(0, "}")
	}
	if l := c.Leafnodes; l != nil {
		w(0, "leafnodes {")
		w(1, "listen: %s", quote(orDefault(l.Listen, DefaultLeafnodeListen)))
		// The sites' logins are users of their accounts (LEAF_<site>, in Render's file),
		// limited to leaf node connections: only there can a login carry permissions.
		tlsBlock(l.TLS)
		w(0, "}")
	}
	return b.String(), nil
}

// checkPeers refuses connections between servers that lack their credential or TLS.
func (c ServerConfig) checkPeers() error {
	var errs []error
	checkTLS := func(what string, t *PeerTLS) {
		switch {
		case t == nil || t.CertFile == "" || t.KeyFile == "" || t.CAFile == "":
			errs = append(errs, fmt.Errorf("%s carry every account's messages: give them a certificate, a key and a CA of their own", what))
		case c.TLS != nil && t.CAFile == c.TLS.CAFile:
			errs = append(errs, fmt.Errorf("%s: their CA is the clients' CA (%s), which signed the client certificate every dispatcher namespace holds: give them a CA of their own", what, t.CAFile))
		}
	}
	if cl := c.Cluster; cl != nil {
		if cl.Name == "" {
			errs = append(errs, errors.New("the cluster needs a name"))
		}
		if cl.User == "" || cl.Password == "" {
			errs = append(errs, errors.New("routes need a credential (a user and a password)"))
		}
		checkTLS("routes", cl.TLS)
	}
	if g := c.Gateway; g != nil {
		if g.Name == "" {
			errs = append(errs, errors.New("the gateway needs a name (the cluster's)"))
		}
		if c.Cluster != nil && g.Name != c.Cluster.Name {
			errs = append(errs, fmt.Errorf("the gateway's name %q is not the cluster's %q", g.Name, c.Cluster.Name))
		}
		if g.User == "" || g.Password == "" {
			errs = append(errs, errors.New("gateways need a credential (a user and a password)"))
		}
		checkTLS("gateways", g.TLS)
	}
	if l := c.Leafnodes; l != nil {
		checkTLS("leaf nodes", l.TLS)
	}
	if len(c.LeafSites) > 0 && c.Leafnodes == nil {
		errs = append(errs, errors.New("leaf sites need the leafnodes listener (Leafnodes) with its TLS"))
	}
	return errors.Join(errs...)
}

// RenderRemote writes the leafnodes block of the site's own server: one remote to the hub's
// leaf node listeners (hubURLs, host:port or URLs) with the site's login and its TLS (a
// certificate of the leaf nodes' CA).
func (l LeafSite) RenderRemote(hubURLs []string, t PeerTLS) string {
	var urls []string
	for _, u := range hubURLs {
		urls = append(urls, quote(peerURL("nats-leaf", u, l.User, l.Password)))
	}
	return fmt.Sprintf(`# webhook-operator: the leaf node connection of site %s (namespace %s) to the hub.
leafnodes {
  remotes: [
    {
      urls: [ %s ]
      tls {
        cert_file: %s
        key_file: %s
        ca_file: %s
        timeout: 5
      }
    }
  ]
}
`, l.Name, l.Namespace, strings.Join(urls, ", "), quote(t.CertFile), quote(t.KeyFile), quote(t.CAFile))
}

// peerURL is scheme://[user:password@]host:port from a host:port or a URL of any scheme.
func peerURL(scheme, hostPort, user, password string) string {
	if i := strings.Index(hostPort, "://"); i >= 0 {
		hostPort = hostPort[i+3:]
	}
	if i := strings.LastIndex(hostPort, "@"); i >= 0 {
		hostPort = hostPort[i+1:]
	}
	u := url.URL{Scheme: scheme, Host: strings.TrimSuffix(hostPort, "/")}
	if user != "" {
		u.User = url.UserPassword(user, password)
	}
	return u.String()
}

// ParseHostPort checks a peer address (host:port, or a URL of any scheme).
func ParseHostPort(s string) error {
	hp := s
	if i := strings.Index(hp, "://"); i >= 0 {
		hp = hp[i+3:]
	}
	if _, _, err := net.SplitHostPort(strings.TrimSuffix(hp, "/")); err != nil || strings.Contains(hp, "@") {
		return fmt.Errorf("%q is not host:port (credentials are added, not given)", s)
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
