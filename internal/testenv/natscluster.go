package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
)

// NATSClusterOptions say what StartNATSCluster starts.
type NATSClusterOptions struct {
	// Binary is nats-server (GoBuild builds the module's version).
	Binary string
	// Dir holds the configurations and storage (Dir/attempt-<n>/n<i>) and the logs
	// (Dir/logs/nats-n<i>.log).
	Dir string
	// Size is the number of servers, named n1..; with 1 the server runs alone (no cluster
	// block: JetStream is not clustered).
	Size int
	// Auth is the auth-callout configuration every server runs with (required).
	Auth *NATSAuth
	// Name is the cluster's name, Tag the server tag of every server (for stream placement).
	Name, Tag string
	// Profile opens each server's /debug/pprof on a port of its own (ProfilePorts).
	Profile bool
	// StopGrace is how long a server may take to stop after SIGTERM (default 15s).
	StopGrace time.Duration
	// MaxFileStore is each server's JetStream file storage (max_file_store, default 8 GiB).
	// JetStream reserves every stream's byte bound in it when the stream is made, so an
	// installation of many namespaces needs room for all their bounds (not the disk).
	MaxFileStore int64
	// Logf logs what the servers do (default: nothing).
	Logf func(string, ...any)
}

// NATSCluster is nats-server processes clustered on loopback, each with its own JetStream
// file storage, client, cluster-route, leaf-node and monitoring port, and routes and leaf nodes
// as webhook-operator nats-config renders them (a credential, a CA of their own). Each server
// keeps its ports and storage across restarts, so every URL handed out stays valid.
type NATSCluster struct {
	Nodes []*NATSProcess
	// LeafPorts are the servers' leaf-node listeners, MonitorPorts their HTTP monitoring
	// ports, ProfilePorts their /debug/pprof ports (with Options.Profile).
	LeafPorts, MonitorPorts, ProfilePorts []int
	// Auth is the auth-callout configuration the servers run with.
	Auth *NATSAuth
	// PeerTLS is what servers and the leaf node present to each other (a CA of its own).
	PeerTLS *natsauth.PeerTLS
	o       NATSClusterOptions
	dir     string
}

// StartNATSCluster starts o.Size servers and waits until JetStream answers at every one (the
// meta group has a leader and every server joined it). Another process may take a port
// between its choice and the server's start: then it tries again with other ports, three
// times at most.
func StartNATSCluster(o NATSClusterOptions) (*NATSCluster, error) {
	if o.Auth == nil || o.Binary == "" || o.Dir == "" || o.Size < 1 {
		return nil, errors.New("testenv: a NATS cluster needs a binary, a directory, at least one server and its auth configuration")
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	var errs []error
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := tryNATSCluster(o, filepath.Join(o.Dir, fmt.Sprintf("attempt-%d", attempt)))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		o.Logf("NATS cluster: attempt %d failed: %v", attempt, err)
	}
	return nil, errors.Join(errs...)
}

// tryNATSCluster starts the cluster once, with its configurations and storage in dir.
func tryNATSCluster(o NATSClusterOptions, dir string) (*NATSCluster, error) {
	c := &NATSCluster{o: o, dir: dir, Auth: o.Auth}
	all, err := FreePorts(5 * o.Size)
	if err != nil {
		return nil, err
	}
	ports := make([][5]int, o.Size) // client, cluster, leaf node, monitoring, profiling
	for i := range ports {
		copy(ports[i][:], all[5*i:])
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("127.0.0.1:%d", p[1]))
	}
	// Routes and leaf nodes have a CA of their own (not the clients'), and routes a
	// credential, as webhook-operator nats-config renders them.
	peers, err := WriteTLS(filepath.Join(dir, "peers-tls"))
	if err != nil {
		return nil, err
	}
	c.PeerTLS = &natsauth.PeerTLS{CertFile: peers.PeerCert, KeyFile: peers.PeerKey, CAFile: peers.CA}
	routePassword := o.Auth.Keys.AdminPassword + "-route"
	if err := os.MkdirAll(filepath.Join(o.Dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	maxFileStore := o.MaxFileStore
	if maxFileStore <= 0 {
		maxFileStore = 8 << 30
	}
	for i, p := range ports {
		name := fmt.Sprintf("n%d", i+1)
		store := filepath.Join(dir, name)
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, err
		}
		// The limits of the embedded server (StartNATS).
		text := fmt.Sprintf(`server_name: %q
server_tags: [%q]
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
max_payload: 8MB
jetstream {
  store_dir: %q
  max_memory_store: 1GB
  max_file_store: %d
}
`, name, o.Tag, p[0], p[3], store, maxFileStore)
		if o.Profile {
			text += fmt.Sprintf("prof_port: %d\n", p[4])
			c.ProfilePorts = append(c.ProfilePorts, p[4])
		}
		// The installation's accounts and auth callout, the same on every server, and the
		// server's routes (one to every server: nats-server skips its own; none for a server
		// alone) and leaf node listener.
		cfg := o.Auth.Config
		if o.Size > 1 {
			cfg.Cluster = &natsauth.Cluster{Name: o.Name, Listen: fmt.Sprintf("127.0.0.1:%d", p[1]), Routes: routes,
				User: natsauth.DefaultRouteUser, Password: routePassword, TLS: c.PeerTLS}
		}
		cfg.Leafnodes = &natsauth.Leafnodes{Listen: fmt.Sprintf("127.0.0.1:%d", p[2]), TLS: c.PeerTLS}
		peerConf, err := cfg.RenderPeers()
		if err != nil {
			return nil, err
		}
		text += cfg.Render() + peerConf
		conf := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, &NATSProcess{Name: name, Binary: o.Binary, Config: conf, StoreDir: store,
			LogPath: filepath.Join(o.Dir, "logs", "nats-"+name+".log"), Port: p[0], MonitorPort: p[3], Logf: o.Logf,
			Admin: NATSAdminOptions(o.Auth), StopGrace: o.StopGrace})
		c.LeafPorts = append(c.LeafPorts, p[2])
		c.MonitorPorts = append(c.MonitorPorts, p[3])
	}
	// A server alone in a cluster has no JetStream meta leader: start every server, then
	// wait for each.
	for _, n := range c.Nodes {
		if err := n.Launch(); err != nil {
			c.Stop()
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		if err := n.WaitReady(time.Minute); err != nil {
			c.Stop()
			return nil, err
		}
	}
	o.Logf("NATS cluster %q ready: %s", o.Name, c.URLs())
	return c, nil
}

// NATSAdminOptions log in as the JetStream account's admin of auth (over TLS when it has it).
func NATSAdminOptions(auth *NATSAuth) []nats.Option {
	return append([]nats.Option{nats.UserInfo(auth.Config.AdminUser, auth.Config.AdminPassword)}, auth.ClientOptions()...)
}

// URLs are every server's client URL, comma-separated, as --nats-url takes them.
func (c *NATSCluster) URLs() string {
	var u []string
	for _, n := range c.Nodes {
		u = append(u, n.URL())
	}
	return strings.Join(u, ",")
}

// LeafAddrs are the addresses a leaf node's remote lists to reach the cluster.
func (c *NATSCluster) LeafAddrs() []string {
	var u []string
	for _, p := range c.LeafPorts {
		u = append(u, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return u
}

// StartLeaf starts a leaf node (server "leaf", without JetStream) whose one remote lists every
// server of the cluster, with the first leaf site's login and a certificate of the leaf nodes'
// CA, and waits until a server of the cluster has its connection.
func (c *NATSCluster) StartLeaf() (*NATSProcess, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	text := fmt.Sprintf(`server_name: "leaf"
listen: "127.0.0.1:%d"
max_payload: 8MB
`, port) + c.Auth.Config.LeafSites[0].RenderRemote(c.LeafAddrs(), *c.PeerTLS)
	conf := filepath.Join(c.dir, "leaf.conf")
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return nil, err
	}
	leaf := &NATSProcess{Name: "leaf", Binary: c.o.Binary, Config: conf,
		LogPath: filepath.Join(c.o.Dir, "logs", "nats-leaf.log"), Port: port, Logf: c.o.Logf}
	if err := leaf.Launch(); err != nil {
		return nil, err
	}
	err = Poll(30*time.Second, func() error {
		for _, p := range c.MonitorPorts {
			var lz server.Leafz
			if err := NATSMonitor(p, "leafz", &lz); err == nil && lz.NumLeafs > 0 {
				return nil
			}
		}
		return errors.New("no server of the cluster has a leaf node connection")
	})
	if err != nil {
		leaf.Stop()
		return nil, err
	}
	c.o.Logf("leaf node connected to the cluster")
	return leaf, nil
}

// Node returns the server named name.
func (c *NATSCluster) Node(name string) (*NATSProcess, error) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no server named %q in the cluster", name)
}

// Other returns a server other than those named.
func (c *NATSCluster) Other(names ...string) *NATSProcess {
	for _, n := range c.Nodes {
		if !slices.Contains(names, n.Name) {
			return n
		}
	}
	return nil
}

// Stop stops every server.
func (c *NATSCluster) Stop() {
	for _, n := range c.Nodes {
		n.Stop()
	}
}

// Connect connects to the cluster (any server) as the JetStream account's admin.
func (c *NATSCluster) Connect(extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	opts := append(NATSAdminOptions(c.Auth), nats.Timeout(2*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	nc, err := nats.Connect(c.URLs(), append(opts, extra...)...)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// StreamLeader is the server name of the stream's Raft leader, from the JetStream API's
// stream info.
func (c *NATSCluster) StreamLeader(ctx context.Context, stream string) (string, error) {
	nc, js, err := c.Connect()
	if err != nil {
		return "", err
	}
	defer nc.Close()
	var leader string
	err = Poll(30*time.Second, func() error {
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		s, err := js.Stream(ictx, stream)
		if err != nil {
			return err
		}
		info, err := s.Info(ictx)
		if err != nil {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return fmt.Errorf("stream %s has no leader", stream)
		}
		leader = info.Cluster.Leader
		return nil
	})
	return leader, err
}

// MetaLeader is the server name of the JetStream meta group's leader, from the monitoring
// endpoint of any running server.
func (c *NATSCluster) MetaLeader() (string, error) {
	var errs []error
	for i, n := range c.Nodes {
		info, err := NATSJSZ(c.MonitorPorts[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			continue
		}
		if info.Meta != nil && info.Meta.Leader != "" {
			return info.Meta.Leader, nil
		}
	}
	return "", errors.Join(append(errs, errors.New("no server knows a meta leader"))...)
}

// WaitCurrent waits until the cluster is whole again: the meta group's leader sees every
// other server current, and every stream of the account and each of its durable consumers
// has a leader and every other replica current (caught up, not offline).
func (c *NATSCluster) WaitCurrent(ctx context.Context, timeout time.Duration) error {
	nc, js, err := c.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	return Poll(timeout, func() error {
		if err := c.metaCurrent(); err != nil {
			return err
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		names := js.StreamNames(ictx)
		var streamNames []string
		for name := range names.Name() {
			streamNames = append(streamNames, name)
		}
		if err := names.Err(); err != nil {
			return err
		}
		for _, name := range streamNames {
			s, err := js.Stream(ictx, name)
			if err != nil {
				return err
			}
			info, err := s.Info(ictx)
			if err != nil {
				return err
			}
			if err := replicasCurrent("stream "+name, info.Config.Replicas, info.Cluster); err != nil {
				return err
			}
			consumers := s.ListConsumers(ictx)
			for ci := range consumers.Info() {
				if ci.Config.Durable == "" {
					continue // the clients' ordered consumers (watchers) come and go
				}
				replicas := ci.Config.Replicas
				if replicas == 0 {
					replicas = info.Config.Replicas // a consumer inherits its stream's
				}
				if err := replicasCurrent("consumer "+name+"/"+ci.Name, replicas, ci.Cluster); err != nil {
					return err
				}
			}
			if err := consumers.Err(); err != nil {
				return err
			}
		}
		return nil
	})
}

// metaCurrent checks, at the meta leader, that every other server is current.
func (c *NATSCluster) metaCurrent() error {
	leader, err := c.MetaLeader()
	if err != nil {
		return err
	}
	for i, n := range c.Nodes {
		if n.Name != leader {
			continue
		}
		info, err := NATSJSZ(c.MonitorPorts[i])
		if err != nil {
			return err
		}
		if info.Meta == nil || info.Meta.Leader != leader {
			return fmt.Errorf("meta leader %s moved", leader)
		}
		if got := len(info.Meta.Replicas); got != len(c.Nodes)-1 {
			return fmt.Errorf("meta leader %s knows %d other servers, want %d", leader, got, len(c.Nodes)-1)
		}
		for _, r := range info.Meta.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("meta group: %s is not current (offline %v, lag %d)", r.Name, r.Offline, r.Lag)
			}
		}
		return nil
	}
	return fmt.Errorf("meta leader %s is not a server of the cluster", leader)
}

// replicasCurrent checks one stream's or consumer's Raft group: a leader, and every other
// replica current.
func replicasCurrent(what string, replicas int, ci *jetstream.ClusterInfo) error {
	if ci == nil || ci.Leader == "" {
		return fmt.Errorf("%s has no leader", what)
	}
	if got := len(ci.Replicas); got != replicas-1 {
		return fmt.Errorf("%s: leader %s and %d other replicas, want %d", what, ci.Leader, got, replicas-1)
	}
	for _, r := range ci.Replicas {
		if !r.Current || r.Offline {
			return fmt.Errorf("%s: replica %s is not current (offline %v, lag %d)", what, r.Name, r.Offline, r.Lag)
		}
	}
	return nil
}

// NATSJSZ reads a server's JetStream monitoring page (/jsz).
func NATSJSZ(port int) (*server.JSInfo, error) {
	info := &server.JSInfo{}
	return info, NATSMonitor(port, "jsz", info)
}

// NATSMonitor reads a page of a server's monitoring endpoint (e.g. "jsz?accounts=true") into
// v.
func NATSMonitor(port int, page string, v any) error {
	hc := &http.Client{Timeout: time.Minute}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/%s", port, page))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/%s: %s", page, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// GoBuild builds the main package pkg (an import path, or a ./-relative path of the module)
// into the file out, from the repository's root, so that the module's own versions are built
// (github.com/nats-io/nats-server/v2 is the nats-server go.mod pins), with the flags of `make
// build` that decide the build cache (-trimpath, no cgo).
func GoBuild(out, pkg string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = Root()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return nil
}
