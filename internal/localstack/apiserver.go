package localstack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/client-go/kubernetes"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/satoken"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// APIServerServiceAccount is the data API server's identity (config/rbac/apiserver.yaml).
const APIServerServiceAccount = "webhook-operator-apiserver"

// startAPIServer runs `webhook-operator apiserver` as the chart's Deployment would: as
// ServiceAccount APIServerServiceAccount (config/rbac/apiserver.yaml), reaching NATS through the
// auth callout with a projected token of the NATS audience, which the callout's
// --nats-apiserver-service-account makes RoleDataAPI. It serves on loopback with a certificate
// for its Service, and the stack registers it with the control plane's aggregation layer (an
// APIService) and waits until the API server says it is available.
func (s *Stack) startAPIServer(ctx context.Context, o Options) error {
	cs, err := kubernetes.NewForConfig(s.ControlPlane.Config)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.Dir, "apiserver")
	if s.apiserverID, err = newIdentity(ctx, cs, s.ControlPlane.Config, OperatorNamespace, APIServerServiceAccount, dir, s.logf); err != nil {
		return err
	}
	natsToken := filepath.Join(dir, "nats", "token")
	t, err := satoken.Start(ctx, cs, OperatorNamespace, APIServerServiceAccount, []string{natsauth.DefaultAudience}, tokenLifetime, natsToken, s.logf)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.tokens = append(s.tokens, t)
	s.mu.Unlock()
	serving, err := testenv.WriteTLSFor(filepath.Join(dir, "serving"), testenv.APIServiceHost(APIServerServiceAccount))
	if err != nil {
		return err
	}
	port, err := testenv.FreePort()
	if err != nil {
		return err
	}
	tlsFiles := s.Auth.TLS
	var mu sync.Mutex
	var out *os.File
	launch := func(context.Context) (*exec.Cmd, error) {
		args := append([]string{"apiserver",
			"--nats-url=" + s.NATSURL,
			"--nats-ca-file=" + tlsFiles.CA,
			"--nats-cert-file=" + tlsFiles.ClientCert,
			"--nats-key-file=" + tlsFiles.ClientKey,
			"--nats-token-file=" + natsToken,
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", port),
			"--tls-cert-file=" + serving.ServerCert,
			"--tls-private-key-file=" + serving.ServerKey,
			"--kubeconfig=" + s.apiserverID.kubeconfig,
		}, o.APIServerArgs...)
		cmd := exec.Command(o.Binary, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "POD_NAMESPACE=" + OperatorNamespace}
		f, err := logFile(filepath.Join(s.Dir, "logs", "apiserver.log"))
		if err != nil {
			return nil, err
		}
		w := outputTo(f, o.Output, "apiserver | ")
		cmd.Stdout, cmd.Stderr = w, w
		mu.Lock()
		out = f
		mu.Unlock()
		s.logf("data API server: %s (ServiceAccount %s/%s, config/rbac/apiserver.yaml) at https://127.0.0.1:%d; log %s",
			strings.Join(append([]string{"webhook-operator"}, args...), " "), OperatorNamespace, APIServerServiceAccount, port, f.Name())
		return cmd, nil
	}
	exited := func(error) {
		mu.Lock()
		defer mu.Unlock()
		if out != nil {
			_ = out.Close()
			out = nil
		}
	}
	s.apiserver = startSupervisor("apiserver", o.Grace, s.logf, launch, nil, exited)
	ca, err := os.ReadFile(serving.CA)
	if err != nil {
		return err
	}
	if err := s.ControlPlane.RegisterAPIService(ctx, APIServerServiceAccount, datav1alpha1.GroupName, datav1alpha1.SchemeGroupVersion.Version, port, ca); err != nil {
		return fmt.Errorf("registering the data API (%s): %w; its log: %s", datav1alpha1.SchemeGroupVersion, err, filepath.Join(s.Dir, "logs", "apiserver.log"))
	}
	s.logf("data API %s available through the control plane's aggregation layer (APIService v1alpha1.%s)", datav1alpha1.SchemeGroupVersion, datav1alpha1.GroupName)
	return nil
}
