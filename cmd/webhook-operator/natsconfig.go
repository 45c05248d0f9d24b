package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/bcrypt"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

func init() { subcommands = append(subcommands, natsConfigCommand) }

// Files nats-config writes into --out-dir.
const (
	authConfFile        = "webhook-operator-auth.conf"
	clusterConfFile     = "webhook-operator-cluster.conf"
	calloutSecretFile   = "callout-secret.yaml"
	peerCredentialsFile = "peer-credentials.yaml"
)

// peerCredentials are the passwords servers present to each other on routes and gateways;
// every cluster of a supercluster needs the same gateway password.
type peerCredentials struct {
	RoutePassword   string `json:"routePassword"`
	GatewayPassword string `json:"gatewayPassword"`
}

// peerFlags are the flags of the connections between servers.
type peerFlags struct {
	clusterName, clusterListen string
	routes                     []string
	noAdvertise                bool
	routeTLS                   natsauth.PeerTLS

	gatewayListen string
	gateways      []string
	gatewayTLS    natsauth.PeerTLS

	leafListen    string
	leafTLS       natsauth.PeerTLS
	leafSites     []string
	leafHubURLs   []string
	leafSiteTLSIn string

	credentialsFile string
	clusterOnly     bool
}

// natsConfigCommand writes what an existing NATS and the chart need for the auth callout: new
// keys and passwords, the server's configuration (passwords as bcrypt hashes) and the
// controller's Secret; and, for a cluster, the routes', gateways' and leaf nodes' blocks, each
// with its own credential and CA.
func natsConfigCommand() *cobra.Command {
	var (
		outDir, namespace, secretName string
		names                         = streams.DefaultNames()
		tls                           natsauth.ServerTLS
		noXKey                        bool
		limits                        natsauth.Limits
		jsMaxStore, jsMaxMemory       int64
		pf                            peerFlags
	)
	cmd := &cobra.Command{
		Use:   "nats-config --out-dir=<dir>",
		Short: "Write a nats-server configuration for the auth callout and the controller's Secret, with new keys",
		Long: `nats-config makes new keys and passwords and writes, into --out-dir:

  webhook-operator-auth.conf     accounts, users and the auth callout; include it in the
                                 nats-server configuration (passwords are bcrypt hashes).
                                 Tenant connections' limits (--nats-user-*) must be the
                                 controller's: pass it the same flags (chart:
                                 nats.auth.callout.userLimits)
  callout-secret.yaml            the Secret the chart's controller reads (nats.auth.callout.existingSecret):
                                 the callout's seeds and the two logins' passwords

For a NATS cluster, a supercluster or leaf nodes it also writes:

  webhook-operator-cluster.conf  the cluster (routes), gateway and leafnodes blocks, each with
                                 its own credential and TLS with a CA of its own, never the
                                 clients' (--server-ca-file): a server that joins a cluster
                                 reads and writes every namespace. Include it next to the
                                 first file, with no cluster, gateway or leafnodes block of
                                 your own. It holds the route password in clear (a server
                                 sends it on the routes it opens): keep it in a Secret.
  peer-credentials.yaml          the route and gateway passwords, for --peer-credentials of
                                 the runs for the other clusters of a supercluster
  leaf-<site>.conf               the leafnodes block of each --leaf-site's own server: its
                                 login and its TLS files

Nothing secret is printed. Keep callout-secret.yaml, peer-credentials.yaml and leaf-*.conf out
of version control.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if outDir == "" {
				return fmt.Errorf("--out-dir is required")
			}
			conf := natsauth.ServerConfig{
				EventsSubjectPrefix: names.EventsSubjectPrefix, InternalSubjectPrefix: names.InternalPrefix,
				TenantLimits: limits, JetStreamMaxStore: jsMaxStore, JetStreamMaxMemory: jsMaxMemory,
			}
			if tls.CertFile != "" {
				tls.Verify = true
				conf.TLS = &tls
			}
			creds, err := pf.credentials()
			if err != nil {
				return err
			}
			sites, err := pf.configure(&conf, creds)
			if err != nil {
				return err
			}
			peers, err := conf.RenderPeers()
			if err != nil {
				return fmt.Errorf("connections between servers: %w", err)
			}
			if err := os.MkdirAll(outDir, 0o700); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			write := func(name, text, what string) error {
				file := filepath.Join(outDir, name)
				if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
					return err
				}
				fmt.Fprintf(out, "wrote %s (%s)\n", file, what)
				return nil
			}
			if !pf.clusterOnly {
				k, err := natsauth.GenerateKeys()
				if err != nil {
					return err
				}
				adminHash, err := bcrypt.GenerateFromPassword([]byte(k.AdminPassword), bcrypt.DefaultCost)
				if err != nil {
					return err
				}
				calloutHash, err := bcrypt.GenerateFromPassword([]byte(k.CalloutPassword), bcrypt.DefaultCost)
				if err != nil {
					return err
				}
				conf.AdminUser, conf.AdminPassword = natsauth.DefaultAdminUser, string(adminHash)
				conf.CalloutUser, conf.CalloutPassword = natsauth.DefaultCalloutUser, string(calloutHash)
				conf.Issuer, conf.XKey = k.Issuer, k.XKey
				data := map[string]string{
					"issuer.seed": string(k.IssuerSeed), "xkey.seed": string(k.XKeySeed),
					"admin-user": natsauth.DefaultAdminUser, "admin-password": k.AdminPassword,
					"callout-user": natsauth.DefaultCalloutUser, "callout-password": k.CalloutPassword,
				}
				if noXKey {
					conf.XKey = ""
					delete(data, "xkey.seed")
				}
				secret := &corev1.Secret{
					TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
					ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: namespace},
					Type:       corev1.SecretTypeOpaque, StringData: data,
				}
				b, err := yaml.Marshal(secret)
				if err != nil {
					return err
				}
				if err := write(authConfFile, conf.Render(), "include it in nats-server's configuration"); err != nil {
					return err
				}
				if err := write(calloutSecretFile, string(b), "kubectl apply -f it, then delete it"); err != nil {
					return err
				}
				fmt.Fprintf(out, "auth callout issuer: %s\n", k.Issuer)
			}
			if conf.Cluster != nil || conf.Gateway != nil || conf.Leafnodes != nil {
				if err := write(clusterConfFile, peers, "include it next to "+authConfFile+"; it holds the route password: keep it in a Secret"); err != nil {
					return err
				}
			}
			if (conf.Cluster != nil || conf.Gateway != nil) && pf.credentialsFile == "" {
				b, err := yaml.Marshal(creds)
				if err != nil {
					return err
				}
				if err := write(peerCredentialsFile, string(b), "--peer-credentials of the other clusters' runs"); err != nil {
					return err
				}
			}
			for _, s := range sites {
				t := natsauth.PeerTLS{CertFile: pf.leafSiteTLSIn + "/tls.crt", KeyFile: pf.leafSiteTLSIn + "/tls.key", CAFile: pf.leafSiteTLSIn + "/ca.crt"}
				if err := write("leaf-"+s.Name+".conf", s.RenderRemote(pf.leafHubURLs, t),
					fmt.Sprintf("site %s's leafnodes block, with its login: a certificate of the leaf nodes' CA in %s", s.Name, pf.leafSiteTLSIn)); err != nil {
					return err
				}
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&outDir, "out-dir", "", "directory to write the files into")
	fs.StringVar(&namespace, "namespace", "webhook-operator-system", "namespace of the chart's release (the Secret's)")
	fs.StringVar(&secretName, "secret-name", "webhook-operator-nats-callout", "name of the Secret (nats.auth.callout.existingSecret)")
	fs.StringVar(&names.EventsSubjectPrefix, "events-subject-prefix", names.EventsSubjectPrefix, "first token of event subjects (streams.eventsSubjectPrefix)")
	fs.StringVar(&names.InternalPrefix, "internal-subject-prefix", names.InternalPrefix, "first token of the operator's subjects (streams.internalSubjectPrefix)")
	fs.StringVar(&tls.CertFile, "server-cert-file", "", "the NATS server's certificate, as a path on the server: turns on TLS with client certificates")
	fs.StringVar(&tls.KeyFile, "server-key-file", "", "the NATS server's key, as a path on the server")
	fs.StringVar(&tls.CAFile, "server-ca-file", "", "the CA the clients' certificates chain to, as a path on the server")
	addLimitFlags(fs, &limits)
	opconfig.BytesVar(fs, &jsMaxStore, "jetstream-max-store", "bound of the file storage of the account holding every namespace's streams (0: the server's own); streams with a size bound reserve it")
	opconfig.BytesVar(fs, &jsMaxMemory, "jetstream-max-memory", "bound of the memory storage of that account (0: the server's own)")
	fs.BoolVar(&noXKey, "no-xkey", false, "do not encrypt authorization requests (they carry Kubernetes tokens; keep encryption unless the server is older than 2.10)")

	fs.StringVar(&pf.clusterName, "cluster-name", "", "name of the NATS cluster: turns on routes (needs --route and the --route-*-file TLS)")
	fs.StringVar(&pf.clusterListen, "cluster-listen", natsauth.DefaultClusterListen, "where each server takes routes")
	fs.StringSliceVar(&pf.routes, "route", nil, "host:port of a server's route listener, one for every server of the cluster (repeat the flag); the route credential is added")
	fs.BoolVar(&pf.noAdvertise, "cluster-no-advertise", false, "do not tell clients the servers' own addresses (clients reach them through a Service or a port-forward)")
	fs.StringVar(&pf.routeTLS.CertFile, "route-cert-file", "", "the certificate each server presents on routes (serverAuth and clientAuth), as a path on the server")
	fs.StringVar(&pf.routeTLS.KeyFile, "route-key-file", "", "its key, as a path on the server")
	fs.StringVar(&pf.routeTLS.CAFile, "route-ca-file", "", "the CA route certificates chain to, as a path on the server: a CA of its own, not --server-ca-file")
	fs.StringSliceVar(&pf.gateways, "gateway", nil, "a cluster of the supercluster, name=host:port[;host:port...] (repeat the flag; this cluster's own may be listed): turns on gateways")
	fs.StringVar(&pf.gatewayListen, "gateway-listen", natsauth.DefaultGatewayListen, "where each server takes gateway connections")
	fs.StringVar(&pf.gatewayTLS.CertFile, "gateway-cert-file", "", "the certificate each server presents on gateways (serverAuth and clientAuth), as a path on the server")
	fs.StringVar(&pf.gatewayTLS.KeyFile, "gateway-key-file", "", "its key, as a path on the server")
	fs.StringVar(&pf.gatewayTLS.CAFile, "gateway-ca-file", "", "the CA gateway certificates chain to, as a path on the server: a CA of its own, not --server-ca-file")
	fs.StringVar(&pf.leafListen, "leaf-listen", natsauth.DefaultLeafnodeListen, "where each server takes leaf node connections")
	fs.StringVar(&pf.leafTLS.CertFile, "leaf-cert-file", "", "the certificate the servers present to leaf nodes, as a path on the server: turns on the leaf node listener")
	fs.StringVar(&pf.leafTLS.KeyFile, "leaf-key-file", "", "its key, as a path on the server")
	fs.StringVar(&pf.leafTLS.CAFile, "leaf-ca-file", "", "the CA leaf nodes' certificates chain to, as a path on the server: a CA of its own, not --server-ca-file")
	fs.StringSliceVar(&pf.leafSites, "leaf-site", nil, "a remote site whose leaf node publishes one namespace's events, name=namespace (repeat the flag); its login is made and written to leaf-<name>.conf")
	fs.StringSliceVar(&pf.leafHubURLs, "leaf-hub-url", nil, "host:port where sites reach the servers' leaf node listener (repeat the flag), for leaf-<name>.conf")
	fs.StringVar(&pf.leafSiteTLSIn, "leaf-site-tls-dir", "/etc/nats/leaf-tls", "directory of the site's server holding its ca.crt, tls.crt and tls.key (a certificate of the leaf nodes' CA), for leaf-<name>.conf")
	fs.StringVar(&pf.credentialsFile, "peer-credentials", "", "read the route and gateway passwords from this file (peer-credentials.yaml of an earlier run) instead of making new ones: every cluster of a supercluster has the same gateway password")
	fs.BoolVar(&pf.clusterOnly, "cluster-only", false, "write only webhook-operator-cluster.conf (another cluster of a supercluster, which includes the first run's webhook-operator-auth.conf)")
	return cmd
}

// credentials reads the peer credentials file, or makes new passwords.
func (pf *peerFlags) credentials() (*peerCredentials, error) {
	c := &peerCredentials{}
	if pf.credentialsFile != "" {
		b, err := os.ReadFile(pf.credentialsFile)
		if err != nil {
			return nil, err
		}
		if err := yaml.UnmarshalStrict(b, c); err != nil {
			return nil, fmt.Errorf("%s: %w", pf.credentialsFile, err)
		}
		if c.RoutePassword == "" || c.GatewayPassword == "" {
			return nil, fmt.Errorf("%s holds no routePassword or no gatewayPassword", pf.credentialsFile)
		}
		return c, nil
	}
	var err error
	if c.RoutePassword, err = natsauth.NewPassword(); err != nil {
		return nil, err
	}
	if c.GatewayPassword, err = natsauth.NewPassword(); err != nil {
		return nil, err
	}
	return c, nil
}

// configure sets conf's cluster, gateway, leaf node listener and leaf sites from the flags. It
// returns the sites with their passwords in clear (conf holds their bcrypt hashes).
func (pf *peerFlags) configure(conf *natsauth.ServerConfig, creds *peerCredentials) ([]natsauth.LeafSite, error) {
	var errs []error
	if pf.clusterName != "" {
		if len(pf.routes) == 0 {
			errs = append(errs, errors.New("--cluster-name needs --route for every server of the cluster"))
		}
		for _, r := range pf.routes {
			if err := natsauth.ParseHostPort(r); err != nil {
				errs = append(errs, fmt.Errorf("--route: %w", err))
			}
		}
		conf.Cluster = &natsauth.Cluster{Name: pf.clusterName, Listen: pf.clusterListen, Routes: pf.routes, NoAdvertise: pf.noAdvertise,
			User: natsauth.DefaultRouteUser, Password: creds.RoutePassword, TLS: &pf.routeTLS}
	} else if len(pf.routes) > 0 {
		errs = append(errs, errors.New("--route needs --cluster-name"))
	}
	if len(pf.gateways) > 0 {
		if pf.clusterName == "" {
			errs = append(errs, errors.New("--gateway needs --cluster-name (the cluster's name in the supercluster)"))
		}
		g := &natsauth.Gateway{Name: pf.clusterName, Listen: pf.gatewayListen,
			User: natsauth.DefaultGatewayUser, Password: creds.GatewayPassword, TLS: &pf.gatewayTLS}
		for _, spec := range pf.gateways {
			name, urls, ok := strings.Cut(spec, "=")
			if !ok || name == "" || urls == "" {
				errs = append(errs, fmt.Errorf("--gateway %q: want name=host:port[;host:port...]", spec))
				continue
			}
			r := natsauth.RemoteGateway{Name: name}
			for _, u := range strings.Split(urls, ";") {
				if err := natsauth.ParseHostPort(u); err != nil {
					errs = append(errs, fmt.Errorf("--gateway %s: %w", name, err))
				}
				r.URLs = append(r.URLs, u)
			}
			g.Remotes = append(g.Remotes, r)
		}
		conf.Gateway = g
	}
	var sites []natsauth.LeafSite
	if pf.leafTLS != (natsauth.PeerTLS{}) || len(pf.leafSites) > 0 {
		conf.Leafnodes = &natsauth.Leafnodes{Listen: pf.leafListen, TLS: &pf.leafTLS}
	}
	if len(pf.leafSites) > 0 {
		if pf.clusterOnly {
			errs = append(errs, errors.New("--leaf-site adds a login to webhook-operator-auth.conf, which --cluster-only does not write: run it with the first cluster"))
		}
		if len(pf.leafHubURLs) == 0 {
			errs = append(errs, errors.New("--leaf-site needs --leaf-hub-url, where the sites reach the leaf node listener"))
		}
		for _, u := range pf.leafHubURLs {
			if err := natsauth.ParseHostPort(u); err != nil {
				errs = append(errs, fmt.Errorf("--leaf-hub-url: %w", err))
			}
		}
		for _, spec := range pf.leafSites {
			name, ns, ok := strings.Cut(spec, "=")
			if !ok || len(validation.IsDNS1123Label(name)) > 0 || len(validation.IsDNS1123Label(ns)) > 0 {
				errs = append(errs, fmt.Errorf("--leaf-site %q: want name=namespace, both DNS labels", spec))
				continue
			}
			password, err := natsauth.NewPassword()
			if err != nil {
				return nil, err
			}
			hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
			if err != nil {
				return nil, err
			}
			site := natsauth.LeafSite{Name: name, Namespace: ns, User: "leaf-" + name}
			site.Password = string(hash)
			conf.LeafSites = append(conf.LeafSites, site)
			site.Password = password
			sites = append(sites, site)
		}
	} else if len(pf.leafHubURLs) > 0 {
		errs = append(errs, errors.New("--leaf-hub-url needs --leaf-site"))
	}
	return sites, errors.Join(errs...)
}
