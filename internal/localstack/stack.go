// Package localstack runs the whole product on one machine, without a cluster: the local
// control plane the tests use (kube-apiserver and etcd, with the CRDs), an embedded NATS
// JetStream server (or existing NATS servers, Options.NATSURL), the controller, and a
// PodRunner that runs every dispatcher Deployment's replicas as local processes in place of a
// kubelet. `make demo` and the end-to-end tests (test/e2e) run on it; Receiver is a sample
// webhook receiver for both.
//
// The controller runs as its own process, the real `webhook-operator controller` binary,
// rather than in-process: it parses its real flags, runs with its ServiceAccount's token and
// the ClusterRole of config/rbac (so missing permissions fail here as in a cluster), its logs
// are its own, a crash shows and is restarted as a Deployment would, and, as in a cluster, the
// controller and the dispatchers share nothing but the API server and NATS.
//
// NATS runs in auth-callout mode (internal/natsauth), as an installation should: the
// controller logs in as the JetStream account's admin, `webhook-operator callout` serves the
// callout as a process of its own (its ServiceAccount, its keys: the controller, which runs
// tenants' erasure expressions, has none), every dispatcher connects with its projected
// ServiceAccount token, and a user (the admin kubeconfig's token, through `kubectl webhooks`)
// or a producer (Producer) gets what RBAC grants in one namespace.
package localstack

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/satoken"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Installation names the stack uses, those of config/ and the Helm chart.
const (
	// OperatorNamespace holds the controller's ServiceAccount and the plugin's NATS Secret.
	OperatorNamespace = plugin.DefaultOperatorNamespace
	// ControllerServiceAccount is the controller's identity (config/rbac).
	ControllerServiceAccount = "webhook-operator-controller"
	// AdminServiceAccount is the identity of the stack's cluster-admin kubeconfig.
	AdminServiceAccount = "local-admin"
	// ProducerServiceAccount publishes events in a namespace (Producer).
	ProducerServiceAccount = "webhook-producer"
	// DispatcherImage is the image the controller writes into dispatcher Deployments. The
	// PodRunner ignores it and runs the local binary.
	DispatcherImage = "webhook-operator:local"
	// IngressServiceAccount is the ingress's identity (config/rbac/ingress.yaml).
	IngressServiceAccount = "webhook-operator-ingress"
	// CalloutServiceAccount is the auth callout's identity (config/rbac/callout.yaml).
	CalloutServiceAccount = "webhook-operator-callout"
)

// Options configure a Stack.
type Options struct {
	// Dir holds everything the stack writes: kubeconfig, nats/ (JetStream storage), logs/,
	// controller/ and pods/. Required.
	Dir string
	// Binary is the locally built webhook-operator (make build). Required.
	Binary string
	// ControllerArgs are added to the controller's command line, e.g. --allow-http.
	ControllerArgs []string
	// CalloutArgs are added to the auth callout's command line.
	CalloutArgs []string
	// Logf logs what the stack does (default: standard error with the time).
	Logf func(format string, args ...any)
	// Output, when set, also receives the controller's and every dispatcher's output, each
	// line prefixed with its process; they are always written to Dir/logs.
	Output io.Writer
	// Grace is how long a process may take to stop after SIGTERM before it is killed (10s).
	Grace time.Duration
	// NATSURL, when set, is an existing NATS (comma-separated server URLs, e.g. every server
	// of a cluster) that the controller, the dispatchers and the plugin's Secret use instead
	// of an embedded server; the stack neither starts nor stops it.
	NATSURL string
	// NATSAuth is the auth-callout material the existing NATS runs with (its configuration
	// rendered from it); required with NATSURL.
	NATSAuth *testenv.NATSAuth
	// Ingress runs `webhook-operator ingress` too (as the chart's ingress.enabled), as
	// ServiceAccount IngressServiceAccount; Stack.IngressURL is where it listens.
	Ingress bool
	// Console runs `webhook-operator console` too (as the chart's console.enabled);
	// Stack.ConsoleURL is where it listens.
	Console bool
	// IngressArgs are added to the ingress's command line.
	IngressArgs []string
	// APIServer runs `webhook-operator apiserver` too (as the chart's apiserver.enabled), as
	// ServiceAccount APIServerServiceAccount, registered with the control plane's aggregation
	// layer: deliveries, dead letters and events as resources of data.webhook-operator.io.
	APIServer bool
	// APIServerArgs are added to the data API server's command line.
	APIServerArgs []string
}

// Stack is a running local installation.
type Stack struct {
	// Dir is Options.Dir.
	Dir string
	// Kubeconfig is a cluster-admin kubeconfig (Dir/kubeconfig) whose user authenticates with
	// a token (of the ServiceAccount AdminServiceAccount, bound to cluster-admin, refreshed in
	// Dir/admin/token), so that `kubectl webhooks` can hand it to NATS.
	Kubeconfig string
	// NATSURL is the NATS client URL: the embedded server's, or Options.NATSURL.
	NATSURL string
	// ControlPlane is the kube-apiserver and etcd.
	ControlPlane *testenv.ControlPlane
	// NATS is the embedded JetStream server (nil with Options.NATSURL).
	NATS *testenv.NATS
	// Auth is what NATS's auth callout runs with: keys, passwords, TLS files.
	Auth *testenv.NATSAuth
	// Client is a cluster-admin client.
	Client client.Client
	// Runner runs the dispatcher Deployments.
	Runner *PodRunner
	// IngressURL is the ingress's base URL (http://127.0.0.1:<port>) with Options.Ingress.
	IngressURL string
	// ConsoleURL is the web console's URL (http://127.0.0.1:<port>) with Options.Console.
	ConsoleURL string

	logf        func(string, ...any)
	controller  *supervisor
	callout     *supervisor
	calloutID   *identity
	ingress     *supervisor
	console     *supervisor
	ingressID   *identity
	apiserver   *supervisor
	apiserverID *identity
	ctrlID      *identity
	adminID     *identity
	ctrlMu      sync.Mutex // guards ctrlProbe and ctrlMetrics, set at each (re)start
	ctrlProbe   string
	ctrlMetrics string
	mu          sync.Mutex // guards tokens
	tokens      []*satoken.File
	stopOnce    sync.Once
	stopErr     error
	watchDone   chan struct{}
}

// Start starts the stack and returns once the controller is ready. The stack stops when ctx
// ends or Stop is called; either way no process it started is left behind.
func Start(ctx context.Context, o Options) (_ *Stack, err error) {
	if o.Dir == "" || o.Binary == "" {
		return nil, errors.New("localstack: Dir and Binary are required")
	}
	if _, err := os.Stat(o.Binary); err != nil {
		return nil, fmt.Errorf("localstack: the webhook-operator binary: %w (run `make build`)", err)
	}
	if o.Logf == nil {
		o.Logf = stderrLogf
	}
	if o.Grace <= 0 {
		o.Grace = 10 * time.Second
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	s := &Stack{Dir: dir, logf: o.Logf, watchDone: make(chan struct{})}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	for _, d := range []string{"logs", "nats"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}

	began := time.Now()
	s.logf("starting the control plane (kube-apiserver and etcd from %s)", testenv.Assets())
	// The aggregation layer's front proxy too, for the data API server (Options.APIServer).
	if s.ControlPlane, err = testenv.StartControlPlaneWith(testenv.ControlPlaneOptions{Aggregation: true}); err != nil {
		return nil, err
	}
	s.Client = s.ControlPlane.Client
	s.logf("control plane ready at %s (%s); CRDs installed", s.ControlPlane.Config.Host, time.Since(began).Round(time.Millisecond))

	if o.NATSURL != "" {
		if o.NATSAuth == nil {
			return nil, errors.New("localstack: an existing NATS (Options.NATSURL) needs its auth-callout material (Options.NATSAuth)")
		}
		s.NATSURL, s.Auth = o.NATSURL, o.NATSAuth
		s.logf("NATS: the existing servers at %s, in auth-callout mode", s.NATSURL)
	} else {
		auth, err := testenv.NewNATSAuth(streams.DefaultNames())
		if err != nil {
			return nil, err
		}
		// TLS with client certificates, as an installation should run it.
		if err := auth.WithTLS(filepath.Join(dir, "tls")); err != nil {
			return nil, err
		}
		if s.NATS, err = testenv.StartNATSWith(filepath.Join(dir, "nats"), auth); err != nil {
			return nil, err
		}
		s.NATSURL, s.Auth = s.NATS.URL(), auth
		s.logf("NATS JetStream ready at %s (file storage in %s), over TLS with client certificates (%s), in auth-callout mode: accounts %s (streams), %s (tenants), %s (callout)",
			s.NATSURL, s.NATS.StoreDir, filepath.Dir(auth.TLS.CA), natsauth.AccountJetStream, natsauth.AccountTenants, natsauth.AccountAuth)
	}

	if err := s.install(ctx); err != nil {
		return nil, fmt.Errorf("installing the operator's objects: %w", err)
	}
	cs, err := kubernetes.NewForConfig(s.ControlPlane.Config)
	if err != nil {
		return nil, err
	}
	if s.adminID, err = newIdentity(ctx, cs, s.ControlPlane.Config, OperatorNamespace, AdminServiceAccount, filepath.Join(dir, "admin"), s.logf); err != nil {
		return nil, err
	}
	// The admin works in namespace default, as with a fresh cluster's kubeconfig.
	s.Kubeconfig = filepath.Join(dir, "kubeconfig")
	kc, err := clientcmd.LoadFromFile(s.adminID.kubeconfig)
	if err != nil {
		return nil, err
	}
	kc.Contexts[kc.CurrentContext].Namespace = metav1.NamespaceDefault
	if err := clientcmd.WriteToFile(*kc, s.Kubeconfig); err != nil {
		return nil, err
	}
	s.logf("kubeconfig %s: cluster-admin as ServiceAccount %s/%s (a token, which kubectl webhooks also hands to NATS)", s.Kubeconfig, OperatorNamespace, AdminServiceAccount)

	if s.Runner, err = NewPodRunner(s.ControlPlane.Config, RunnerOptions{
		Binary: o.Binary, Dir: dir, Grace: o.Grace, Logf: o.Logf, Output: o.Output,
	}); err != nil {
		return nil, err
	}
	s.Runner.Start(context.Background())
	s.logf("pod runner watching Deployments labelled app.kubernetes.io/managed-by=webhook-operator: their replicas run %s", o.Binary)

	if err := s.startCallout(ctx, o); err != nil {
		return nil, err
	}
	if err := s.startController(ctx, o); err != nil {
		return nil, err
	}
	if o.Ingress {
		if err := s.startIngress(ctx, o); err != nil {
			return nil, err
		}
	}
	if o.APIServer {
		if err := s.startAPIServer(ctx, o); err != nil {
			return nil, err
		}
	}
	if o.Console {
		if err := s.startConsole(ctx, o); err != nil {
			return nil, err
		}
	}
	go func() {
		select {
		case <-ctx.Done():
			_ = s.Stop()
		case <-s.watchDone:
		}
	}()
	s.logf("local stack ready in %s", time.Since(began).Round(time.Millisecond))
	return s, nil
}

// install creates what `helm install` would: the operator's namespace, the controller's
// ServiceAccount, ClusterRole, Role and bindings and the tenants' ClusterRoles from config/rbac,
// the admission policy that keeps the controller to objects labelled as its own
// (config/admission), the Secret that tells `kubectl webhooks` where NATS is, and the stack's
// admin identity.
func (s *Stack) install(ctx context.Context) error {
	c := s.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OperatorNamespace}}
	if err := c.Create(ctx, ns); client.IgnoreAlreadyExists(err) != nil {
		return err
	}
	for _, f := range []string{"rbac/service_account.yaml", "rbac/role.yaml", "rbac/role_binding.yaml", "rbac/metrics.yaml", "rbac/tenant_roles.yaml", "rbac/ingress.yaml", "rbac/callout.yaml", "rbac/apiserver.yaml", "admission/policy.yaml"} {
		path := filepath.Join(testenv.Root(), "config", f)
		b, err := os.ReadFile(path)
		if f == "admission/policy.yaml" {
			// The controller's dispatchers run the stack's image.
			b, err = testenv.AdmissionPolicy(testenv.AdmissionPolicyUser, DispatcherImage)
		}
		if err != nil {
			return err
		}
		docs := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := docs.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			obj, _, err := scheme.Decoder().Decode(doc, nil, nil)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if err := c.Create(ctx, obj.(client.Object)); client.IgnoreAlreadyExists(err) != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	for _, o := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: AdminServiceAccount, Namespace: OperatorNamespace}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: AdminServiceAccount},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: AdminServiceAccount, Namespace: OperatorNamespace}}},
	} {
		if err := c.Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			return err
		}
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: plugin.NATSSecretName, Namespace: OperatorNamespace,
			Labels: map[string]string{"app.kubernetes.io/name": "webhook-operator"}},
		// No credential: clients connect as themselves, with Kubernetes tokens. The TLS
		// material lets them reach the server; the controller mirrors it (only it) to
		// dispatcher namespaces.
		Data: map[string][]byte{"url": []byte(s.NATSURL), "auth": []byte(plugin.SecretAuthKubernetes)},
	}
	tlsFiles := s.Auth.TLS
	for key, file := range map[string]string{"ca.crt": tlsFiles.CA, "tls.crt": tlsFiles.ClientCert, "tls.key": tlsFiles.ClientKey} {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		sec.Data[key] = b
	}
	if err := c.Create(ctx, sec); client.IgnoreAlreadyExists(err) != nil {
		return err
	}
	return nil
}

// ControllerMetricsURL is the controller's /metrics (its --metrics-bind-address on loopback).
func (s *Stack) ControllerMetricsURL() string {
	s.ctrlMu.Lock()
	defer s.ctrlMu.Unlock()
	return s.ctrlMetrics
}

// startController runs `webhook-operator controller` with its ServiceAccount's token and
// waits for its /readyz.
func (s *Stack) startController(ctx context.Context, o Options) error {
	cs, err := kubernetes.NewForConfig(s.ControlPlane.Config)
	if err != nil {
		return err
	}
	idDir := filepath.Join(s.Dir, "controller")
	if s.ctrlID, err = newIdentity(ctx, cs, s.ControlPlane.Config, OperatorNamespace, ControllerServiceAccount, idDir, s.logf); err != nil {
		return err
	}
	natsConf := s.Auth.Config
	tlsFiles := s.Auth.TLS
	var out *os.File
	launch := func(context.Context) (*exec.Cmd, error) {
		metrics, err := testenv.FreePort()
		if err != nil {
			return nil, err
		}
		probes, err := testenv.FreePort()
		if err != nil {
			return nil, err
		}
		args := append([]string{"controller",
			"--nats-url=" + s.NATSURL,
			"--dispatcher-image=" + DispatcherImage,
			// Plain-HTTP /metrics for the local stack's readers (the demo prints them, e2e
			// scrapes them); its dispatchers follow.
			"--metrics-secure=false",
			fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics),
			fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probes),
			"--nats-auth-callout",
			"--nats-ca-file=" + tlsFiles.CA,
			"--nats-cert-file=" + tlsFiles.ClientCert,
			"--nats-key-file=" + tlsFiles.ClientKey,
			"--nats-credentials-secret=" + OperatorNamespace + "/" + plugin.NATSSecretName,
		}, o.ControllerArgs...)
		cmd := exec.Command(o.Binary, args...)
		cmd.Dir = idDir
		// The JetStream admin's login in the environment, as the chart passes it from its
		// Secret: never in arguments.
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + idDir, "KUBECONFIG=" + s.ctrlID.kubeconfig, "POD_NAMESPACE=" + OperatorNamespace,
			"NATS_USER=" + natsConf.AdminUser, "NATS_PASSWORD=" + natsConf.AdminPassword}
		f, err := logFile(filepath.Join(s.Dir, "logs", "controller.log"))
		if err != nil {
			return nil, err
		}
		w := outputTo(f, o.Output, "controller | ")
		cmd.Stdout, cmd.Stderr = w, w
		s.ctrlMu.Lock()
		s.ctrlProbe, s.ctrlMetrics, out = fmt.Sprintf("http://127.0.0.1:%d/readyz", probes), fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics), f
		s.ctrlMu.Unlock()
		s.logf("controller: %s (ServiceAccount %s/%s, ClusterRole from config/rbac); metrics 127.0.0.1:%d, probes 127.0.0.1:%d; log %s",
			strings.Join(append([]string{"webhook-operator"}, args...), " "), OperatorNamespace, ControllerServiceAccount, metrics, probes, f.Name())
		return cmd, nil
	}
	exited := func(error) {
		s.ctrlMu.Lock()
		defer s.ctrlMu.Unlock()
		if out != nil {
			_ = out.Close()
			out = nil
		}
	}
	s.controller = startSupervisor("controller", o.Grace, s.logf, launch, nil, exited)
	return s.waitReady(ctx, "controller", func() string {
		s.ctrlMu.Lock()
		defer s.ctrlMu.Unlock()
		return s.ctrlProbe
	})
}

// waitReady polls a process's /readyz (probe gives its URL, "" while it is starting) until it
// answers 200, for at most 2 minutes.
func (s *Stack) waitReady(ctx context.Context, what string, probe func() string) error {
	deadline := time.Now().Add(2 * time.Minute)
	hc := &http.Client{Timeout: time.Second}
	for {
		if url := probe(); url != "" {
			if resp, err := hc.Get(url); err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					s.logf("%s ready", what)
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s was not ready within 2 minutes: see %s", what, filepath.Join(s.Dir, "logs", what+".log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ConnectAdmin connects as the JetStream account's admin (the controller's login), to look at
// streams and consumers from outside the product.
func (s *Stack) ConnectAdmin(extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	opts := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond),
		nats.UserInfo(s.Auth.Config.AdminUser, s.Auth.Config.AdminPassword)}, s.Auth.ClientOptions()...)
	nc, err := nats.Connect(s.NATSURL, append(opts, extra...)...)
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

// Producer returns the options of a producer's connection to namespace ns, as a Pod would
// make it: the ServiceAccount ProducerServiceAccount of ns, bound to the ClusterRole
// webhook-operator-producer, with a projected token of the NATS audience (kept fresh in
// Dir/producers/<ns>/token) through the auth callout.
func (s *Stack) Producer(ctx context.Context, ns string) ([]nats.Option, error) {
	c := s.Client
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ProducerServiceAccount, Namespace: ns}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ProducerServiceAccount, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "webhook-operator-producer"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ProducerServiceAccount, Namespace: ns}}},
	} {
		if err := c.Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			return nil, err
		}
	}
	cs, err := kubernetes.NewForConfig(s.ControlPlane.Config)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(s.Dir, "producers", ns, "token")
	t, err := satoken.Start(ctx, cs, ns, ProducerServiceAccount, []string{natsauth.DefaultAudience}, tokenLifetime, path, s.logf)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.tokens = append(s.tokens, t)
	s.mu.Unlock()
	opts := natsauth.ClientOptions(func() string {
		b, _ := os.ReadFile(path)
		return strings.TrimSpace(string(b))
	}, ns)
	opts = append(opts, s.Auth.ClientOptions()...)
	return append(opts, nats.IgnoreAuthErrorAbort()), nil
}

// Stop stops the dispatchers, the ingress, the controller, the callout, NATS and the control
// plane, in that order, and waits until every process is gone. It may be called more than
// once.
func (s *Stack) Stop() error {
	s.stopOnce.Do(func() {
		close(s.watchDone)
		if s.Runner != nil {
			s.logf("stopping the dispatchers")
			s.Runner.Stop()
		}
		if s.console != nil {
			s.logf("stopping the console")
			s.console.stop()
		}
		if s.ingress != nil {
			s.logf("stopping the ingress")
			s.ingress.stop()
		}
		if s.ingressID != nil {
			s.ingressID.close()
		}
		if s.apiserver != nil {
			s.logf("stopping the data API server")
			s.apiserver.stop()
		}
		if s.apiserverID != nil {
			s.apiserverID.close()
		}
		if s.controller != nil {
			s.logf("stopping the controller")
			s.controller.stop()
		}
		if s.ctrlID != nil {
			s.ctrlID.close()
		}
		if s.callout != nil {
			s.logf("stopping the callout")
			s.callout.stop()
		}
		if s.calloutID != nil {
			s.calloutID.close()
		}
		if s.adminID != nil {
			s.adminID.close()
		}
		s.mu.Lock()
		for _, t := range s.tokens {
			t.Close()
		}
		s.tokens = nil
		s.mu.Unlock()
		if s.NATS != nil {
			s.logf("stopping NATS")
			s.NATS.Stop()
		}
		if s.ControlPlane != nil {
			s.logf("stopping the control plane")
			s.stopErr = s.ControlPlane.Stop()
		}
	})
	return s.stopErr
}
