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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/kube"
	"github.com/webhook-operator/webhook-operator/internal/plugin"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// Installation names the stack uses, those of config/ and the Helm chart.
const (
	// OperatorNamespace holds the controller's ServiceAccount and the plugin's NATS Secret.
	OperatorNamespace = plugin.DefaultOperatorNamespace
	// ControllerServiceAccount is the controller's identity (config/rbac).
	ControllerServiceAccount = "webhook-operator-controller"
	// DispatcherImage is the image the controller writes into dispatcher Deployments. The
	// PodRunner ignores it and runs the local binary.
	DispatcherImage = "webhook-operator:local"
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
}

// Stack is a running local installation.
type Stack struct {
	// Dir is Options.Dir.
	Dir string
	// Kubeconfig is a cluster-admin kubeconfig (Dir/kubeconfig).
	Kubeconfig string
	// NATSURL is the NATS client URL: the embedded server's, or Options.NATSURL.
	NATSURL string
	// ControlPlane is the kube-apiserver and etcd.
	ControlPlane *testenv.ControlPlane
	// NATS is the embedded JetStream server (nil with Options.NATSURL).
	NATS *testenv.NATS
	// Client is a cluster-admin client.
	Client client.Client
	// Runner runs the dispatcher Deployments.
	Runner *PodRunner

	logf        func(string, ...any)
	controller  *supervisor
	ctrlID      *identity
	ctrlMu      sync.Mutex // guards ctrlProbe and ctrlMetrics, set at each (re)start
	ctrlProbe   string
	ctrlMetrics string
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
	if s.ControlPlane, err = testenv.StartControlPlane(); err != nil {
		return nil, err
	}
	if s.Kubeconfig, err = s.ControlPlane.WriteKubeconfig(dir); err != nil {
		return nil, err
	}
	s.Client = s.ControlPlane.Client
	s.logf("control plane ready at %s (%s); CRDs installed; kubeconfig %s", s.ControlPlane.Config.Host, time.Since(began).Round(time.Millisecond), s.Kubeconfig)

	if o.NATSURL != "" {
		s.NATSURL = o.NATSURL
		s.logf("NATS: the existing servers at %s", s.NATSURL)
	} else {
		if s.NATS, err = testenv.StartNATS(filepath.Join(dir, "nats")); err != nil {
			return nil, err
		}
		s.NATSURL = s.NATS.URL()
		s.logf("NATS JetStream ready at %s (file storage in %s)", s.NATSURL, s.NATS.StoreDir)
	}

	if err := s.install(ctx); err != nil {
		return nil, fmt.Errorf("installing the operator's objects: %w", err)
	}

	if s.Runner, err = NewPodRunner(s.ControlPlane.Config, RunnerOptions{
		Binary: o.Binary, Dir: dir, Grace: o.Grace, Logf: o.Logf, Output: o.Output,
	}); err != nil {
		return nil, err
	}
	s.Runner.Start(context.Background())
	s.logf("pod runner watching Deployments labelled app.kubernetes.io/managed-by=webhook-operator: their replicas run %s", o.Binary)

	if err := s.startController(ctx, o); err != nil {
		return nil, err
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
// ServiceAccount, ClusterRole, Role and bindings from config/rbac, the admission policy that
// keeps the controller to objects labelled as its own (config/admission), and the Secret that
// tells `kubectl webhooks` where NATS is.
func (s *Stack) install(ctx context.Context) error {
	c := s.Client
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OperatorNamespace}}
	if err := c.Create(ctx, ns); client.IgnoreAlreadyExists(err) != nil {
		return err
	}
	for _, f := range []string{"rbac/service_account.yaml", "rbac/role.yaml", "rbac/role_binding.yaml", "rbac/metrics.yaml", "admission/policy.yaml"} {
		path := filepath.Join(testenv.Root(), "config", f)
		b, err := os.ReadFile(path)
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
			obj, _, err := kube.Decoder().Decode(doc, nil, nil)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if err := c.Create(ctx, obj.(client.Object)); client.IgnoreAlreadyExists(err) != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: plugin.NATSSecretName, Namespace: OperatorNamespace,
			Labels: map[string]string{"app.kubernetes.io/name": "webhook-operator"}},
		StringData: map[string]string{"url": s.NATSURL},
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
		}, o.ControllerArgs...)
		cmd := exec.Command(o.Binary, args...)
		cmd.Dir = idDir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + idDir, "KUBECONFIG=" + s.ctrlID.kubeconfig, "POD_NAMESPACE=" + OperatorNamespace}
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

	deadline := time.Now().Add(2 * time.Minute)
	hc := &http.Client{Timeout: time.Second}
	for {
		s.ctrlMu.Lock()
		url := s.ctrlProbe
		s.ctrlMu.Unlock()
		if url != "" {
			if resp, err := hc.Get(url); err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					s.logf("controller ready")
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the controller was not ready within 2 minutes: see %s", filepath.Join(s.Dir, "logs", "controller.log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop stops the dispatchers, the controller, NATS and the control plane, in that order, and
// waits until every process is gone. It may be called more than once.
func (s *Stack) Stop() error {
	s.stopOnce.Do(func() {
		close(s.watchDone)
		if s.Runner != nil {
			s.logf("stopping the dispatchers")
			s.Runner.Stop()
		}
		if s.controller != nil {
			s.logf("stopping the controller")
			s.controller.stop()
		}
		if s.ctrlID != nil {
			s.ctrlID.close()
		}
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
