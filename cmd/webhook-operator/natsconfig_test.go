package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"sigs.k8s.io/yaml"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// runNATSConfig runs `webhook-operator nats-config` with args.
func runNATSConfig(args ...string) (string, error) {
	cmd := natsConfigCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// What nats-config writes for a 3-node cluster runs it: three servers, each including the one
// auth configuration and a cluster block (the first run's, and two --cluster-only runs with
// its peer credentials, each server listening for routes on its own port, as servers on one
// host must), form their routes over TLS with the route CA; the admin logs in with the
// Secret's password; a leaf site's server, from the leaf-<site>.conf written for it, connects
// to the leaf node listener with its login and a certificate of the leaf nodes' CA.
func TestNATSConfigRendersACluster(t *testing.T) {
	dir := t.TempDir()
	clients, err := testenv.WriteTLS(filepath.Join(dir, "clients"))
	if err != nil {
		t.Fatal(err)
	}
	routesPKI, err := testenv.WriteTLS(filepath.Join(dir, "routes"))
	if err != nil {
		t.Fatal(err)
	}
	leafPKI, err := testenv.WriteTLS(filepath.Join(dir, "leaf"))
	if err != nil {
		t.Fatal(err)
	}
	// The site's files, named as its leaf-<site>.conf expects them.
	siteTLS := filepath.Join(dir, "site-tls")
	if err := os.MkdirAll(siteTLS, 0o700); err != nil {
		t.Fatal(err)
	}
	for from, to := range map[string]string{leafPKI.CA: "ca.crt", leafPKI.PeerCert: "tls.crt", leafPKI.PeerKey: "tls.key"} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(siteTLS, to), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ports, err := testenv.FreePorts(10)
	if err != nil {
		t.Fatal(err)
	}
	common := []string{"--server-cert-file", clients.ServerCert, "--server-key-file", clients.ServerKey, "--server-ca-file", clients.CA,
		"--cluster-name", "webhooks", "--route-cert-file", routesPKI.PeerCert, "--route-key-file", routesPKI.PeerKey, "--route-ca-file", routesPKI.CA,
		"--leaf-cert-file", leafPKI.PeerCert, "--leaf-key-file", leafPKI.PeerKey, "--leaf-ca-file", leafPKI.CA}
	for i := range 3 {
		common = append(common, "--route", fmt.Sprintf("127.0.0.1:%d", ports[3+i]))
	}
	out := make([]string, 3)
	for i := range 3 {
		out[i] = filepath.Join(dir, fmt.Sprintf("n%d", i+1))
		args := append([]string{"--out-dir", out[i], "--cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[3+i]),
			"--leaf-listen", fmt.Sprintf("127.0.0.1:%d", ports[6+i])}, common...)
		if i == 0 {
			args = append(args, "--leaf-site", "branch=shop", "--leaf-hub-url", fmt.Sprintf("127.0.0.1:%d", ports[6]), "--leaf-site-tls-dir", siteTLS)
		} else {
			args = append(args, "--cluster-only", "--peer-credentials", filepath.Join(out[0], peerCredentialsFile))
		}
		if o, err := runNATSConfig(args...); err != nil {
			t.Fatalf("nats-config %v: %v\n%s", args, err, o)
		}
	}
	for i := 1; i < 3; i++ {
		for _, f := range []string{authConfFile, calloutSecretFile, peerCredentialsFile} {
			if _, err := os.Stat(filepath.Join(out[i], f)); err == nil {
				t.Errorf("--cluster-only wrote %s", f)
			}
		}
	}
	var nodes []*server.Server
	for i := range 3 {
		main := filepath.Join(out[i], "nats.conf")
		// Included files are found relative to the including one.
		text := fmt.Sprintf("server_name: n%d\nlisten: \"127.0.0.1:%d\"\ninclude %q\ninclude %q\n", i+1, ports[i],
			"../n1/"+authConfFile, clusterConfFile)
		if err := os.WriteFile(main, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		opts, err := server.ProcessConfigFile(main)
		if err != nil {
			t.Fatalf("n%d's configuration: %v", i+1, err)
		}
		opts.NoLog, opts.NoSigs = true, true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("n%d did not start", i+1)
		}
		nodes = append(nodes, s)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		for i, s := range nodes {
			if n := s.NumRemotes(); n != 2 {
				return fmt.Errorf("n%d has routes to %d servers, want 2", i+1, n)
			}
		}
		return nil
	}, "the three servers' routes")

	var secret struct {
		StringData map[string]string `json:"stringData"`
	}
	b, err := os.ReadFile(filepath.Join(out[0], calloutSecretFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &secret); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(fmt.Sprintf("tls://127.0.0.1:%d", ports[2]), nats.UserInfo(secret.StringData["admin-user"], secret.StringData["admin-password"]),
		nats.RootCAs(clients.CA), nats.ClientCert(clients.ClientCert, clients.ClientKey), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("the admin at n3: %v", err)
	}
	nc.Close()

	// The site's own server, from leaf-branch.conf, connects to n1's leaf node listener.
	siteConf := filepath.Join(out[0], "site.conf")
	if err := os.WriteFile(siteConf, []byte(fmt.Sprintf("server_name: branch\nlisten: \"127.0.0.1:%d\"\ninclude \"leaf-branch.conf\"\n", ports[9])), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(siteConf)
	if err != nil {
		t.Fatalf("the site's configuration: %v", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	site, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go site.Start()
	t.Cleanup(func() { site.Shutdown(); site.WaitForShutdown() })
	testenv.Eventually(t, 30*time.Second, func() bool { return site.NumLeafNodes() == 1 && nodes[0].NumLeafNodes() == 1 }, "the site's leaf node connection to n1")

	conf, err := os.ReadFile(filepath.Join(out[1], clusterConfFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"authorization { user: \"route\"", "ca_file: \"" + routesPKI.CA + "\"", "verify: true"} {
		if !strings.Contains(string(conf), want) {
			t.Errorf("%s lacks %q:\n%s", clusterConfFile, want, conf)
		}
	}
}

// nats-config refuses a cluster, gateways or leaf nodes without their own TLS, or with the
// clients' CA.
func TestNATSConfigRefusesUnprotectedPeers(t *testing.T) {
	dir := t.TempDir()
	client := []string{"--server-cert-file", "/tls/server.crt", "--server-key-file", "/tls/server.key", "--server-ca-file", "/tls/ca.crt"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"routes without TLS", []string{"--cluster-name", "c", "--route", "nats-0:6222"}, "routes carry every account's messages"},
		{"routes with the clients' CA", []string{"--cluster-name", "c", "--route", "nats-0:6222",
			"--route-cert-file", "/r/tls.crt", "--route-key-file", "/r/tls.key", "--route-ca-file", "/tls/ca.crt"}, "their CA is the clients' CA"},
		{"a cluster without routes", []string{"--cluster-name", "c", "--route-cert-file", "/r/tls.crt", "--route-key-file", "/r/tls.key", "--route-ca-file", "/r/ca.crt"}, "needs --route"},
		{"a route with credentials", []string{"--cluster-name", "c", "--route", "nats://u:p@nats-0:6222",
			"--route-cert-file", "/r/tls.crt", "--route-key-file", "/r/tls.key", "--route-ca-file", "/r/ca.crt"}, "credentials are added"},
		{"gateways without TLS", []string{"--cluster-name", "c", "--route", "nats-0:6222",
			"--route-cert-file", "/r/tls.crt", "--route-key-file", "/r/tls.key", "--route-ca-file", "/r/ca.crt", "--gateway", "d=nats.d:7222"}, "gateways carry every account's messages"},
		{"leaf sites without TLS", []string{"--leaf-site", "branch=shop", "--leaf-hub-url", "nats.example:7422"}, "leaf nodes carry every account's messages"},
		{"leaf sites without the hub's address", []string{"--leaf-site", "branch=shop",
			"--leaf-cert-file", "/l/tls.crt", "--leaf-key-file", "/l/tls.key", "--leaf-ca-file", "/l/ca.crt"}, "needs --leaf-hub-url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			o, err := runNATSConfig(append(append([]string{"--out-dir", out}, client...), tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("nats-config %v: %v (want an error with %q)\n%s", tc.args, err, tc.want, o)
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("nats-config wrote files although it refused")
			}
		})
	}
}
