package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// natsCluster is nats-server processes clustered on loopback, each with its own JetStream
// file storage, client, cluster-route, leaf-node and monitoring port, and routes and leaf nodes
// as webhook-operator nats-config renders them (a credential, a CA of their own). Each node keeps its
// ports and storage across restarts, so every URL handed out stays valid.
type natsCluster struct {
	nodes []*natsProcess
	// leafPorts are the nodes' leaf-node listeners, monitorPorts their HTTP monitoring ports.
	leafPorts, monitorPorts []int
	// dir holds the configurations and storage, logDir/logs the logs.
	dir, logDir string
	logf        func(string, ...any)
	// auth is the auth-callout configuration every node runs with, and its sites' logins.
	auth *testenv.NATSAuth
	// peerTLS is what nodes and the leaf node present to each other (a CA of its own).
	peerTLS *natsauth.PeerTLS
}

// clusterName is the name of the fault suite's NATS cluster; every node has the tag clusterTag.
const (
	clusterName = "faults"
	clusterTag  = "webhook-operator"
)

// startNATSCluster starts size nodes named n1.. under dir and waits until JetStream answers
// at every one (the meta group has a leader and every node joined it). Another process may
// take a port between its choice and the node's start: then it tries again with other ports,
// three times at most.
func startNATSCluster(binary, dir string, size int, auth *testenv.NATSAuth, logf func(string, ...any)) (*natsCluster, error) {
	var errs []error
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := tryNATSCluster(binary, filepath.Join(dir, fmt.Sprintf("attempt-%d", attempt)), dir, size, auth, logf)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		logf("NATS cluster: attempt %d failed: %v", attempt, err)
	}
	return nil, errors.Join(errs...)
}

// tryNATSCluster starts the cluster once, with its configurations and storage in dir and its
// logs in logDir.
func tryNATSCluster(binary, dir, logDir string, size int, auth *testenv.NATSAuth, logf func(string, ...any)) (*natsCluster, error) {
	c := &natsCluster{logf: logf, dir: dir, logDir: logDir, auth: auth}
	all, err := testenv.FreePorts(4 * size)
	if err != nil {
		return nil, err
	}
	ports := make([][4]int, size) // client, cluster, leaf node, monitoring
	for i := range ports {
		copy(ports[i][:], all[4*i:])
	}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("127.0.0.1:%d", p[1]))
	}
	// Routes and leaf nodes have a CA of their own (not the clients'), and routes a
	// credential, as webhook-operator nats-config renders them.
	peers, err := testenv.WriteTLS(filepath.Join(dir, "peers-tls"))
	if err != nil {
		return nil, err
	}
	c.peerTLS = &natsauth.PeerTLS{CertFile: peers.PeerCert, KeyFile: peers.PeerKey, CAFile: peers.CA}
	routePassword := auth.Keys.AdminPassword + "-route"
	if err := os.MkdirAll(filepath.Join(logDir, "logs"), 0o755); err != nil {
		return nil, err
	}
	for i, p := range ports {
		name := fmt.Sprintf("n%d", i+1)
		store := filepath.Join(dir, name)
		if err := os.MkdirAll(store, 0o755); err != nil {
			return nil, err
		}
		// The limits of the embedded server (internal/testenv).
		text := fmt.Sprintf(`server_name: %q
server_tags: [%q]
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
max_payload: 8MB
jetstream {
  store_dir: %q
  max_memory_store: 1GB
  max_file_store: 8GB
}
`, name, clusterTag, p[0], p[3], store)
		// The installation's accounts and auth callout, the same on every node, and the
		// node's routes (one to every node: nats-server skips its own) and leaf node listener.
		cfg := auth.Config
		cfg.Cluster = &natsauth.Cluster{Name: clusterName, Listen: fmt.Sprintf("127.0.0.1:%d", p[1]), Routes: routes,
			User: natsauth.DefaultRouteUser, Password: routePassword, TLS: c.peerTLS}
		cfg.Leafnodes = &natsauth.Leafnodes{Listen: fmt.Sprintf("127.0.0.1:%d", p[2]), TLS: c.peerTLS}
		peerConf, err := cfg.RenderPeers()
		if err != nil {
			return nil, err
		}
		text += cfg.Render() + peerConf
		conf := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, &natsProcess{name: name, binary: binary, config: conf,
			logPath: filepath.Join(logDir, "logs", "nats-"+name+".log"), port: p[0], logf: logf, admin: adminOptions(auth)})
		c.leafPorts = append(c.leafPorts, p[2])
		c.monitorPorts = append(c.monitorPorts, p[3])
	}
	// A node alone has no JetStream meta leader: start every node, then wait for each.
	for _, n := range c.nodes {
		if err := n.launch(); err != nil {
			c.stop()
			return nil, err
		}
	}
	for _, n := range c.nodes {
		if err := n.waitReady(time.Minute); err != nil {
			c.stop()
			return nil, err
		}
	}
	logf("NATS cluster %q ready: %s", clusterName, c.urls())
	return c, nil
}

// urls are every node's client URL, comma-separated, as --nats-url takes them.
func (c *natsCluster) urls() string {
	var u []string
	for _, n := range c.nodes {
		u = append(u, n.url())
	}
	return strings.Join(u, ",")
}

// leafAddrs are the addresses a leaf node's remote lists to reach the cluster.
func (c *natsCluster) leafAddrs() []string {
	var u []string
	for _, p := range c.leafPorts {
		u = append(u, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return u
}

// startLeaf starts a leaf node (server "leaf", without JetStream) whose one remote lists every
// node of the cluster, and waits until a node of the cluster has its connection.
func (c *natsCluster) startLeaf() (*natsProcess, error) {
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	// The site's login and a certificate of the leaf nodes' CA.
	text := fmt.Sprintf(`server_name: "leaf"
listen: "127.0.0.1:%d"
max_payload: 8MB
`, port) + c.auth.Config.LeafSites[0].RenderRemote(c.leafAddrs(), *c.peerTLS)
	conf := filepath.Join(c.dir, "leaf.conf")
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return nil, err
	}
	leaf := &natsProcess{name: "leaf", binary: c.nodes[0].binary, config: conf,
		logPath: filepath.Join(c.logDir, "logs", "nats-leaf.log"), port: port, logf: c.logf}
	if err := leaf.launch(); err != nil {
		return nil, err
	}
	err = testenv.Poll(30*time.Second, func() error {
		for _, p := range c.monitorPorts {
			var lz server.Leafz
			if err := monitor(p, "leafz", &lz); err == nil && lz.NumLeafs > 0 {
				return nil
			}
		}
		return errors.New("no node of the cluster has a leaf node connection")
	})
	if err != nil {
		leaf.stop()
		return nil, err
	}
	c.logf("leaf node connected to the cluster")
	return leaf, nil
}

// node returns the node named name.
func (c *natsCluster) node(name string) (*natsProcess, error) {
	for _, n := range c.nodes {
		if n.name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no node named %q in the cluster", name)
}

// other returns a node other than those named.
func (c *natsCluster) other(names ...string) *natsProcess {
	for _, n := range c.nodes {
		if !slices.Contains(names, n.name) {
			return n
		}
	}
	return nil
}

// stop stops every node.
func (c *natsCluster) stop() {
	for _, n := range c.nodes {
		n.stop()
	}
}

// connect connects to the cluster (any node) for the test's own reads.
func (c *natsCluster) connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(c.urls(), append(adminOptions(c.auth), nats.Timeout(2*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)
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

// streamLeader is the server name of the stream's Raft leader, from the JetStream API's
// stream info.
func (c *natsCluster) streamLeader(ctx context.Context, stream string) (string, error) {
	nc, js, err := c.connect()
	if err != nil {
		return "", err
	}
	defer nc.Close()
	var leader string
	err = testenv.Poll(30*time.Second, func() error {
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

// metaLeader is the server name of the JetStream meta group's leader, from the monitoring
// endpoint of any running node.
func (c *natsCluster) metaLeader() (string, error) {
	var errs []error
	for i, n := range c.nodes {
		info, err := jsz(c.monitorPorts[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.name, err))
			continue
		}
		if info.Meta != nil && info.Meta.Leader != "" {
			return info.Meta.Leader, nil
		}
	}
	return "", errors.Join(append(errs, errors.New("no node knows a meta leader"))...)
}

// waitCurrent waits until the cluster is whole again: the meta group's leader sees every
// other node current, and every stream of the account and each of its durable consumers has
// a leader and every other replica current (caught up, not offline).
func (c *natsCluster) waitCurrent(ctx context.Context, timeout time.Duration) error {
	nc, js, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	return testenv.Poll(timeout, func() error {
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

// metaCurrent checks, at the meta leader, that every other node is current.
func (c *natsCluster) metaCurrent() error {
	leader, err := c.metaLeader()
	if err != nil {
		return err
	}
	for i, n := range c.nodes {
		if n.name != leader {
			continue
		}
		info, err := jsz(c.monitorPorts[i])
		if err != nil {
			return err
		}
		if info.Meta == nil || info.Meta.Leader != leader {
			return fmt.Errorf("meta leader %s moved", leader)
		}
		if got := len(info.Meta.Replicas); got != len(c.nodes)-1 {
			return fmt.Errorf("meta leader %s knows %d other nodes, want %d", leader, got, len(c.nodes)-1)
		}
		for _, r := range info.Meta.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("meta group: %s is not current (offline %v, lag %d)", r.Name, r.Offline, r.Lag)
			}
		}
		return nil
	}
	return fmt.Errorf("meta leader %s is not a node of the cluster", leader)
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

// jsz reads a node's JetStream monitoring page.
func jsz(port int) (*server.JSInfo, error) {
	info := &server.JSInfo{}
	return info, monitor(port, "jsz", info)
}

// monitor reads a page of a node's monitoring endpoint into v.
func monitor(port int, page string, v any) error {
	hc := &http.Client{Timeout: 2 * time.Second}
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
