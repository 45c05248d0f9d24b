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

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/satoken"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// startIngress runs `webhook-operator ingress` as the chart's ingress Deployment would: as
// ServiceAccount IngressServiceAccount (ClusterRole of config/rbac/ingress.yaml: TokenReviews
// and SubjectAccessReviews), reaching NATS through the auth callout with a projected token of
// the NATS audience, which the controller's --nats-ingress-service-account makes RoleIngress.
// It listens on loopback (Stack.IngressURL) and the stack waits for its /readyz.
func (s *Stack) startIngress(ctx context.Context, o Options) error {
	cs, err := kubernetes.NewForConfig(s.ControlPlane.Config)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.Dir, "ingress")
	if s.ingressID, err = newIdentity(ctx, cs, s.ControlPlane.Config, OperatorNamespace, IngressServiceAccount, dir, s.logf); err != nil {
		return err
	}
	natsToken := filepath.Join(dir, "nats", "token")
	t, err := satoken.Start(ctx, cs, OperatorNamespace, IngressServiceAccount, []string{natsauth.DefaultAudience}, tokenLifetime, natsToken, s.logf)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.tokens = append(s.tokens, t)
	s.mu.Unlock()
	ports, err := testenv.FreePorts(3)
	if err != nil {
		return err
	}
	// The API port stays the same across restarts, as a Service's would.
	s.IngressURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	tlsFiles := s.Auth.TLS
	var mu sync.Mutex
	probe := ""
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
		args := append([]string{"ingress",
			"--nats-url=" + s.NATSURL,
			"--nats-ca-file=" + tlsFiles.CA,
			"--nats-cert-file=" + tlsFiles.ClientCert,
			"--nats-key-file=" + tlsFiles.ClientKey,
			"--nats-token-file=" + natsToken,
			fmt.Sprintf("--bind-address=127.0.0.1:%d", ports[0]),
			"--metrics-secure=false",
			fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", metrics),
			fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probes),
		}, o.IngressArgs...)
		cmd := exec.Command(o.Binary, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "KUBECONFIG=" + s.ingressID.kubeconfig,
			"POD_NAMESPACE=" + OperatorNamespace, "POD_NAME=webhook-operator-ingress-local"}
		f, err := logFile(filepath.Join(s.Dir, "logs", "ingress.log"))
		if err != nil {
			return nil, err
		}
		w := outputTo(f, o.Output, "ingress | ")
		cmd.Stdout, cmd.Stderr = w, w
		mu.Lock()
		probe, out = fmt.Sprintf("http://127.0.0.1:%d/readyz", probes), f
		mu.Unlock()
		s.logf("ingress: %s (ServiceAccount %s/%s, ClusterRole of config/rbac/ingress.yaml) at %s; log %s",
			strings.Join(append([]string{"webhook-operator"}, args...), " "), OperatorNamespace, IngressServiceAccount, s.IngressURL, f.Name())
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
	s.ingress = startSupervisor("ingress", o.Grace, s.logf, launch, nil, exited)
	return s.waitReady(ctx, "ingress", func() string {
		mu.Lock()
		defer mu.Unlock()
		return probe
	})
}
