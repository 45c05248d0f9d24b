package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

const (
	operatorNS = "webhook-operator-system"
	release    = "webhook-operator"
	natsNS     = "nats"
	// The operator's image: the chart's default repository with tags of this run.
	imageRepo = "ghcr.io/webhook-operator/webhook-operator"
	tagA      = "cluster-a"
	tagB      = "cluster-b"
	// What receivers and producers run.
	receiverImage = "localhost/cluster/receiver:test"
	producerImage = "localhost/cluster/producer:test"
	// The node's pod network, which receivers' addresses are in.
	podCIDR = "10.244.0.0/24"
	// Tenants: the walk-through's and the faults' namespace.
	shop = "shop"
)

// install is what setUp made.
type install struct {
	tls *testenv.TLSFiles
	// routeTLS is the routes' own CA and the servers' route certificate (peer.crt).
	routeTLS *testenv.TLSFiles
	conf     string // the directory webhook-operator nats-config wrote
	// token is the dispatcher whose projected token is followed across its renewal.
	token *tokenWatch
	// flaky is the walk-through's endpoint whose receiver fails on demand.
	flaky string
	// oldChart is the earlier version's chart the installation started at (-cluster.upgrade-from;
	// "" when it started at this checkout's): the upgrade step upgrades it.
	oldChart string
}

// setUp builds and loads the images, runs NATS and installs the chart.
func setUp(t *testing.T) *install {
	s := &install{}
	logf(t, "packing the operator's image (make image) twice, for a rolling update later")
	for _, tag := range []string{tagB, tagA} {
		if *reuse && command("", filepath.Join(world.root, "hack", "cluster", "cluster.sh"), "exec", "ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "ls", "-q", "name=="+imageRepo+":"+tag).stdout != "" && os.Getenv("CLUSTER_REBUILD") == "" {
			continue // developing: the images of the last run are loaded
		}
		sh(t, "make", "--no-print-directory", "image", "IMAGE_TAG="+tag)
	}
	s.buildTestImages(t)
	loadImage(t, filepath.Join(world.root, "bin", "images", "nats-server.tar"))

	var err error
	hosts := []string{"nats", "nats.nats", "nats.nats.svc", "nats.nats.svc.cluster.local",
		"*.nats-headless.nats.svc", "*.nats-headless.nats.svc.cluster.local"}
	for _, ns := range []string{shop, "ledger", legacy, pooled} {
		hosts = append(hosts, "*."+ns+".svc", "*."+ns+".svc.cluster.local")
	}
	if s.tls, err = testenv.WriteTLSFor(filepath.Join(world.dir, "tls"), hosts...); err != nil {
		t.Fatal(err)
	}
	// Routes have a CA of their own: the clients' signed the certificate every dispatcher
	// namespace holds.
	if s.routeTLS, err = testenv.WriteTLSFor(filepath.Join(world.dir, "route-tls"), "*.nats-headless.nats.svc.cluster.local"); err != nil {
		t.Fatal(err)
	}
	s.conf = filepath.Join(world.dir, "nats-auth")
	// What an installer runs: the auth callout's configuration and the controller's Secret,
	// and the cluster's routes with their credential and CA. Clients reach the servers through
	// the Service (or kubectl port-forward): they are never told the pods' addresses, which
	// only the cluster's network routes (--cluster-no-advertise).
	args := []string{"nats-config", "--out-dir", s.conf,
		"--server-cert-file", "/etc/nats/tls/server.crt", "--server-key-file", "/etc/nats/tls/server.key",
		"--server-ca-file", "/etc/nats/tls/ca.crt",
		"--cluster-name", "nats", "--cluster-no-advertise",
		"--route-cert-file", "/etc/nats/route-tls/tls.crt", "--route-key-file", "/etc/nats/route-tls/tls.key",
		"--route-ca-file", "/etc/nats/route-tls/ca.crt"}
	for i := range 3 {
		args = append(args, "--route", fmt.Sprintf("nats-%d.nats-headless.nats.svc.cluster.local:6222", i))
	}
	sh(t, filepath.Join(world.dir, "bin", "webhook-operator"), args...)
	s.startNATS(t)
	if *upgradeFrom != "" {
		s.oldChart = s.packOld(t)
		s.helmInstall(t, s.oldChart, tagOld)
	} else {
		s.helmInstall(t, "charts/webhook-operator", tagA)
	}
	return s
}

// installed is the installation an earlier run (-cluster.reuse) left.
func installed(t *testing.T) *install {
	logf(t, "using the installation of the last run")
	d := filepath.Join(world.dir, "tls")
	files := func(d string) *testenv.TLSFiles {
		return &testenv.TLSFiles{
			CA: filepath.Join(d, "ca.crt"), ServerCert: filepath.Join(d, "server.crt"), ServerKey: filepath.Join(d, "server.key"),
			ClientCert: filepath.Join(d, "client.crt"), ClientKey: filepath.Join(d, "client.key"),
			PeerCert: filepath.Join(d, "peer.crt"), PeerKey: filepath.Join(d, "peer.key")}
	}
	return &install{conf: filepath.Join(world.dir, "nats-auth"), tls: files(d), routeTLS: files(filepath.Join(world.dir, "route-tls"))}
}

// buildTestImages builds the host's webhook-operator and kubectl-webhooks (into the test's
// bin/, first on PATH) and packs the receiver and producer images.
func (s *install) buildTestImages(t *testing.T) {
	bin := filepath.Join(world.dir, "bin")
	for name, pkg := range map[string]string{
		"webhook-operator": "./cmd/webhook-operator", "kubectl-webhooks": "./cmd/kubectl-webhooks",
		"receiver": "./test/cluster/cmd/receiver", "producer": "./test/cluster/cmd/producer",
	} {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", filepath.Join(bin, name), pkg)
		cmd.Dir = world.root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	for name, ref := range map[string]string{"receiver": receiverImage, "producer": producerImage, "prometheus": prometheusImage} {
		file, at := filepath.Join(bin, name), "/"+name
		if name == "prometheus" {
			// hack/build-tools.sh prometheus. In /bin, as Prometheus' own image has it: its
			// data volume is mounted at /prometheus, and runc cannot mount a directory over a
			// file there (the container never started, and the pod crash-looped).
			file, at = filepath.Join(world.root, "bin", name), "/bin/"+name
		}
		tar := filepath.Join(world.dir, name+".tar")
		sh(t, filepath.Join(world.root, "bin", "pack-image"), "-o", tar, "-tag", ref, "-file", at+"="+file, "-entrypoint", at)
		loadImage(t, tar)
	}
}

// natsConf is the servers' configuration: a 3-node JetStream cluster whose accounts, users,
// auth callout, TLS and routes (their credential, their own CA) are what `webhook-operator
// nats-config` wrote (included as it is).
const natsConf = `
server_name: $POD_NAME
listen: 0.0.0.0:4222
http: 0.0.0.0:8222
jetstream {
  store_dir: /data
  max_file_store: 2G
  max_memory_store: 128M
}
include ./webhook-operator-auth.conf
include ./webhook-operator-cluster.conf
`

func (s *install) startNATS(t *testing.T) {
	logf(t, "NATS: a 3-node JetStream StatefulSet in namespace %s, with the operator's auth callout configuration and TLS", natsNS)
	kubectl(t, "create", "namespace", natsNS)
	kubectl(t, "-n", natsNS, "create", "secret", "generic", "nats-tls",
		"--from-file=ca.crt="+s.tls.CA, "--from-file=server.crt="+s.tls.ServerCert, "--from-file=server.key="+s.tls.ServerKey)
	kubectl(t, "-n", natsNS, "create", "secret", "generic", "nats-route-tls",
		"--from-file=ca.crt="+s.routeTLS.CA, "--from-file=tls.crt="+s.routeTLS.PeerCert, "--from-file=tls.key="+s.routeTLS.PeerKey)
	if err := os.WriteFile(filepath.Join(s.conf, "nats.conf"), []byte(natsConf), 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "-n", natsNS, "create", "secret", "generic", "nats-config",
		"--from-file=nats.conf="+filepath.Join(s.conf, "nats.conf"),
		"--from-file=webhook-operator-auth.conf="+filepath.Join(s.conf, "webhook-operator-auth.conf"),
		"--from-file=webhook-operator-cluster.conf="+filepath.Join(s.conf, "webhook-operator-cluster.conf"))
	// Each server's JetStream storage survives its pod (a hostPath per pod name stands in for
	// the PersistentVolume a provisioner would give).
	data := filepath.Join(filepath.Dir(world.kubeconfig), "nats-data")
	if err := os.MkdirAll(data, 0o777); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		d := filepath.Join(data, fmt.Sprintf("nats-%d", i))
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, 65532, 65532); err != nil {
			t.Fatal(err)
		}
	}
	natsImage := "localhost/cluster/nats-server:" + strings.TrimSpace(readFile(t, filepath.Join(world.root, "bin", "nats-server.version")))
	apply(t, fmt.Sprintf(`
apiVersion: v1
kind: Service
metadata: {name: nats-headless, namespace: nats}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {app: nats}
  ports:
  - {name: client, port: 4222}
  - {name: cluster, port: 6222}
  - {name: monitor, port: 8222}
---
apiVersion: v1
kind: Service
metadata: {name: nats, namespace: nats}
spec:
  selector: {app: nats}
  ports:
  - {name: client, port: 4222}
  - {name: monitor, port: 8222}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: nats, namespace: nats}
spec:
  serviceName: nats-headless
  replicas: 3
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: nats}}
  template:
    metadata: {labels: {app: nats}}
    spec:
      terminationGracePeriodSeconds: 30
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: nats
        image: %s
        imagePullPolicy: Never
        args: [-c, /etc/nats/config/nats.conf]
        env:
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        ports:
        - {name: client, containerPort: 4222}
        - {name: cluster, containerPort: 6222}
        - {name: monitor, containerPort: 8222}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
        readinessProbe:
          httpGet: {path: "/healthz?js-enabled-only=true", port: monitor}
          periodSeconds: 2
        resources:
          requests: {cpu: 50m, memory: 64Mi}
          limits: {memory: 512Mi}
        volumeMounts:
        - {name: config, mountPath: /etc/nats/config, readOnly: true}
        - {name: tls, mountPath: /etc/nats/tls, readOnly: true}
        - {name: route-tls, mountPath: /etc/nats/route-tls, readOnly: true}
        - {name: data, mountPath: /data, subPathExpr: $(POD_NAME)}
      volumes:
      - name: config
        secret: {secretName: nats-config}
      - name: tls
        secret: {secretName: nats-tls}
      - name: route-tls
        secret: {secretName: nats-route-tls}
      - name: data
        hostPath: {path: %s, type: Directory}
`, natsImage, data))
	kubectl(t, "-n", natsNS, "rollout", "status", "statefulset/nats", "--timeout=5m")
	// JetStream's meta group has a leader once the three routes are up.
	eventually(t, 3*time.Minute, "NATS JetStream's meta leader", func() error {
		b, err := rawGet("/api/v1/namespaces/nats/services/http:nats:8222/proxy/jsz")
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), `"leader"`) {
			return fmt.Errorf("no meta leader yet: %.300s", b)
		}
		return nil
	})
}

// helmInstall installs chart with its defaults plus what an installer of this cluster sets:
// the in-cluster NATS URL, the TLS material, R3 streams, the receivers' pod network.
func (s *install) helmInstall(t *testing.T, chart, tag string) {
	kubectl(t, "create", "namespace", operatorNS)
	kubectl(t, "apply", "-f", filepath.Join(s.conf, "callout-secret.yaml"))
	kubectl(t, "-n", operatorNS, "create", "secret", "generic", "webhook-operator-nats-tls",
		"--from-file=ca.crt="+s.tls.CA, "--from-file=tls.crt="+s.tls.ClientCert, "--from-file=tls.key="+s.tls.ClientKey)
	logf(t, "helm install %s %s (image %s:%s)", release, chart, imageRepo, tag)
	sh(t, "helm", append([]string{"install", release, chart, "--namespace", operatorNS, "--wait", "--timeout", "5m"}, s.values(tag)...)...)
	kubectl(t, "-n", operatorNS, "wait", "--for=condition=Available", "deployment", "-l", "app.kubernetes.io/name=webhook-operator", "--timeout=3m")
	logf(t, "the controller is Available")
}

// helmTest runs the chart's test: a pod of the release checks NATS with the controller's
// settings.
func (s *install) helmTest(t *testing.T) {
	r := command("", "helm", "test", release, "--namespace", operatorNS, "--timeout", "3m")
	if r.err != nil || !regexp.MustCompile(`Phase:\s+Succeeded`).MatchString(r.stdout) || !strings.Contains(r.stderr, "ok   tls://nats.nats.svc:4222") {
		t.Fatalf("helm test: %v\n%s%s", r.err, r.stdout, r.stderr)
	}
	logf(t, "helm test: %s", strings.TrimSpace(r.stderr[strings.Index(r.stderr, "ok   "):]))
}

// values are the installer's settings.
func (s *install) values(tag string) []string {
	return []string{
		"--set", "image.tag=" + tag,
		"--set", "nats.url=tls://nats.nats.svc:4222",
		"--set", "nats.tls.enabled=true", "--set", "nats.tls.existingSecret=webhook-operator-nats-tls",
		"--set", "streams.replicas=3",
		"--set", "outbound.allowedCIDRs={" + podCIDR + "}",
		// The web console, which the console step drives in a browser.
		"--set", "console.enabled=true",
		// The kubelet's shortest token lifetime, so that the test sees it renewed (after 480s).
		"--set", "nats.auth.callout.tokenExpirationSeconds=600",
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
