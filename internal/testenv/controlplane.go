// Package testenv starts the real parts integration tests run against: a kube-apiserver and
// etcd (controller-runtime's envtest, from the binaries hack/build-tools.sh builds into
// bin/k8s) with the project's CRDs installed, and an embedded nats-server with JetStream.
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/webhook-operator/webhook-operator/internal/scheme"
)

// Root is the repository's root directory.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Assets is the directory holding kube-apiserver, etcd and kubectl: KUBEBUILDER_ASSETS when
// set, else bin/k8s.
func Assets() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	return filepath.Join(Root(), "bin", "k8s")
}

// ControlPlane is a running kube-apiserver and etcd with the CRDs installed.
type ControlPlane struct {
	Env    *envtest.Environment
	Config *rest.Config
	Client client.Client
	// FrontProxy holds the aggregation layer's certificates when it was started with
	// Aggregation: its CA signs the client certificate kube-apiserver proxies with.
	FrontProxy *TLSFiles
	dir        string
}

// ControlPlaneOptions say how to start a control plane.
type ControlPlaneOptions struct {
	// Aggregation starts kube-apiserver as the aggregation layer's front proxy: a
	// request-header CA and the client certificate it signs (--requestheader-*,
	// --proxy-client-cert-file), so a test serves an APIService from its own process
	// (RegisterAPIService).
	Aggregation bool
	// APIServerFlags are more kube-apiserver flags, name to value (e.g.
	// "authentication-config": a file with an AuthenticationConfiguration that trusts a test's
	// OIDC issuer).
	APIServerFlags map[string]string
}

// StartControlPlane starts a control plane from Assets() and installs config/crd/bases. Its
// kube-apiserver and etcd die with this process, even when it is killed (see wrapAssets).
func StartControlPlane() (*ControlPlane, error) { return StartControlPlaneWith(ControlPlaneOptions{}) }

// StartControlPlaneWith is StartControlPlane with options.
func StartControlPlaneWith(o ControlPlaneOptions) (*ControlPlane, error) {
	assets := Assets()
	wrapped, err := os.MkdirTemp("", "control-plane-")
	if err != nil {
		return nil, err
	}
	if err := wrapAssets(wrapped, assets); err != nil {
		_ = os.RemoveAll(wrapped)
		return nil, fmt.Errorf("preparing the control plane's binaries: %w", err)
	}
	// The links are needed only to start the processes.
	defer func() { _ = os.RemoveAll(wrapped) }()
	return startControlPlaneFrom(wrapped, o)
}

// startControlPlaneFrom starts a control plane from the binaries in assets and installs
// config/crd/bases.
func startControlPlaneFrom(assets string, o ControlPlaneOptions) (*ControlPlane, error) {
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: `make test` and `make demo` build them (hack/build-tools.sh etcd kube)", b, assets)
		}
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(Root(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme.New(),
	}
	// Explicit paths: envtest would otherwise prefer $KUBEBUILDER_ASSETS to assets.
	env.ControlPlane.GetAPIServer().Path = filepath.Join(assets, "kube-apiserver")
	env.ControlPlane.Etcd = &envtest.Etcd{Path: filepath.Join(assets, "etcd")}
	env.ControlPlane.KubectlPath = Kubectl()
	// TESTENV_APISERVER_LOG=<file> keeps the kube-apiserver's log, to see what it did.
	if path := os.Getenv("TESTENV_APISERVER_LOG"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, err
		}
		api := env.ControlPlane.GetAPIServer()
		api.Out, api.Err = f, f
		api.Configure().Append("v", "2")
	}
	for name, value := range o.APIServerFlags {
		env.ControlPlane.GetAPIServer().Configure().Set(name, value)
	}
	var proxy *TLSFiles
	var dir string
	if o.Aggregation {
		var err error
		if dir, err = os.MkdirTemp("", "front-proxy-"); err != nil {
			return nil, err
		}
		if proxy, err = frontProxy(env, dir); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	cfg, err := env.Start()
	if err != nil {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		_ = env.Stop()
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
		return nil, err
	}
	return &ControlPlane{Env: env, Config: cfg, Client: c, FrontProxy: proxy, dir: dir}, nil
}

// Stop stops the control plane.
func (cp *ControlPlane) Stop() error {
	err := cp.Env.Stop()
	if cp.dir != "" {
		_ = os.RemoveAll(cp.dir)
	}
	return err
}

// WriteKubeconfig writes a cluster-admin kubeconfig for this control plane into dir and
// returns its path, for kubectl, helm and the plugin.
func (cp *ControlPlane) WriteKubeconfig(dir string) (string, error) {
	u, err := cp.Env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", err
	}
	b, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "kubeconfig")
	return p, os.WriteFile(p, b, 0o600)
}

// Kubectl is the kubectl built next to the control plane.
func Kubectl() string { return filepath.Join(Assets(), "kubectl") }
