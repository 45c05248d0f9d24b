package dataapi

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// world is what every test of the package shares: a control plane that aggregates, a NATS
// server, and this package's API server in the test process, registered as an APIService.
// Clients reach the server through kube-apiserver, as users do.
var world struct {
	cp     *testenv.ControlPlane
	nats   *testenv.NATS
	nc     *nats.Conn
	js     jetstream.JetStream
	cfg    streams.Config
	dir    string
	cancel context.CancelFunc
	done   chan error
	ns     atomic.Int64
}

// testMaxScan is the server's bound on body filters here, small enough to reach: seed writes
// 160 delivery-log messages for orders and 200 in all.
const testMaxScan = 180

func TestMain(m *testing.M) {
	// The API server's own log is not the test's.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	var err error
	if world.dir, err = os.MkdirTemp("", "dataapi-"); err != nil {
		return 1, err
	}
	defer os.RemoveAll(world.dir)
	if world.cp, err = testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{Aggregation: true}); err != nil {
		return 1, err
	}
	defer func() { _ = world.cp.Stop() }()
	if world.nats, err = testenv.StartNATS(""); err != nil {
		return 1, err
	}
	defer world.nats.Cleanup()
	if world.nc, world.js, err = world.nats.Connect(); err != nil {
		return 1, err
	}
	defer world.nc.Close()
	world.cfg = streams.DefaultConfig()
	if err := startServer(); err != nil {
		return 1, err
	}
	defer func() {
		world.cancel()
		<-world.done
	}()
	return m.Run(), nil
}

const serviceName = "webhook-operator-apiserver"

// startServer runs the API server in this process and registers it with the aggregator.
func startServer() error {
	admin, err := world.cp.WriteKubeconfig(world.dir)
	if err != nil {
		return err
	}
	serving, err := testenv.WriteTLSFor(filepath.Join(world.dir, "serving"), testenv.APIServiceHost(serviceName))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	o := NewOptions()
	o.SecureServing.Listener, o.SecureServing.BindPort = ln, port
	o.SecureServing.ServerCert.CertKey.CertFile, o.SecureServing.ServerCert.CertKey.KeyFile = serving.ServerCert, serving.ServerKey
	o.Kubeconfig = admin
	s, err := newServer(o, &Bus{NC: world.nc, JS: world.js, Streams: world.cfg}, limits{maxScan: testMaxScan})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	world.cancel, world.done = cancel, make(chan error, 1)
	go func() { world.done <- s.Run(ctx) }()
	ca, err := os.ReadFile(serving.CA)
	if err != nil {
		return err
	}
	return world.cp.RegisterAPIService(ctx, serviceName, datav1alpha1.GroupName, datav1alpha1.SchemeGroupVersion.Version, port, ca)
}

// tenant is one test's namespace with its streams, and the users that read it.
type tenant struct {
	t  *testing.T
	ns string
}

func newTenant(t *testing.T) *tenant {
	t.Helper()
	tn := &tenant{t: t, ns: fmt.Sprintf("tenant-%d", world.ns.Add(1))}
	ctx := context.Background()
	if err := world.cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tn.ns}}); err != nil {
		t.Fatal(err)
	}
	if err := world.cfg.For(tn.ns).Ensure(ctx, world.js); err != nil {
		t.Fatal(err)
	}
	return tn
}

func (tn *tenant) stored() testenv.Stored {
	return testenv.Stored{T: tn.t, JS: world.js, Set: world.cfg.For(tn.ns)}
}

// user is a user of the control plane allowed verbs on resources (of the data API) in the
// tenant's namespace, through a Role of its own.
func (tn *tenant) user(name string, verbs []string, resources ...string) rest.Interface {
	tn.t.Helper()
	ctx := context.Background()
	if len(verbs) > 0 {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: tn.ns, Name: name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{datav1alpha1.GroupName}, Resources: resources, Verbs: verbs}}}
		binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: tn.ns, Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}}}
		if err := world.cp.Client.Create(ctx, role); err != nil {
			tn.t.Fatal(err)
		}
		if err := world.cp.Client.Create(ctx, binding); err != nil {
			tn.t.Fatal(err)
		}
	}
	return dataClient(tn.t, name)
}

// dataClient is a REST client of the data API for user, through kube-apiserver.
func dataClient(t *testing.T, user string) rest.Interface {
	t.Helper()
	u, err := world.cp.Env.AddUser(envtest.User{Name: user}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(u.Config())
	cfg.GroupVersion = &datav1alpha1.SchemeGroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = Codecs.WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}
