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

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// startCallout runs `webhook-operator callout` as the chart's callout Deployment would: as
// ServiceAccount CalloutServiceAccount (ClusterRole of config/rbac/callout.yaml), logged in to
// NATS's auth account as the callout's user, with the issuer and xkey seeds only it holds
// (the controller has neither). The stack waits for its /readyz (connected to NATS).
func (s *Stack) startCallout(ctx context.Context, o Options) error {
	cs, err := kubernetes.NewForConfig(s.ControlPlane.Config)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.Dir, "callout")
	if s.calloutID, err = newIdentity(ctx, cs, s.ControlPlane.Config, OperatorNamespace, CalloutServiceAccount, dir, s.logf); err != nil {
		return err
	}
	// The callout's keys, as the chart mounts them from a Secret into its pods only.
	keys := s.Auth.Keys
	issuerFile, xkeyFile := filepath.Join(dir, "nats", "issuer.seed"), filepath.Join(dir, "nats", "xkey.seed")
	if err := os.MkdirAll(filepath.Dir(issuerFile), 0o700); err != nil {
		return err
	}
	for f, seed := range map[string][]byte{issuerFile: keys.IssuerSeed, xkeyFile: keys.XKeySeed} {
		if err := os.WriteFile(f, seed, 0o600); err != nil {
			return err
		}
	}
	natsConf := s.Auth.Config
	tlsFiles := s.Auth.TLS
	var mu sync.Mutex
	probe := ""
	var out *os.File
	launch := func(context.Context) (*exec.Cmd, error) {
		ports, err := testenv.FreePorts(2)
		if err != nil {
			return nil, err
		}
		args := append([]string{"callout",
			"--nats-url=" + s.NATSURL,
			"--nats-ca-file=" + tlsFiles.CA,
			"--nats-cert-file=" + tlsFiles.ClientCert,
			"--nats-key-file=" + tlsFiles.ClientKey,
			"--nats-callout-issuer-seed-file=" + issuerFile,
			"--nats-callout-xkey-seed-file=" + xkeyFile,
			// Every process of the stack connects from 127.0.0.1: one host to the callout's
			// per-host bound, where a cluster has one per pod.
			"--nats-callout-rate-per-host=200", "--nats-callout-burst-per-host=400",
			"--nats-ingress-service-account=" + OperatorNamespace + "/" + IngressServiceAccount,
			"--nats-apiserver-service-account=" + OperatorNamespace + "/" + APIServerServiceAccount,
			"--metrics-secure=false",
			fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[0]),
			fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", ports[1]),
		}, o.CalloutArgs...)
		cmd := exec.Command(o.Binary, args...)
		cmd.Dir = dir
		// The callout's NATS login in the environment, as the chart passes it from its Secret.
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "KUBECONFIG=" + s.calloutID.kubeconfig, "POD_NAMESPACE=" + OperatorNamespace,
			"NATS_CALLOUT_USER=" + natsConf.CalloutUser, "NATS_CALLOUT_PASSWORD=" + natsConf.CalloutPassword}
		f, err := logFile(filepath.Join(s.Dir, "logs", "callout.log"))
		if err != nil {
			return nil, err
		}
		w := outputTo(f, o.Output, "callout | ")
		cmd.Stdout, cmd.Stderr = w, w
		mu.Lock()
		probe, out = fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), f
		mu.Unlock()
		s.logf("callout: %s (ServiceAccount %s/%s, ClusterRole of config/rbac/callout.yaml); log %s",
			strings.Join(append([]string{"webhook-operator"}, args...), " "), OperatorNamespace, CalloutServiceAccount, f.Name())
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
	s.callout = startSupervisor("callout", o.Grace, s.logf, launch, nil, exited)
	return s.waitReady(ctx, "callout", func() string {
		mu.Lock()
		defer mu.Unlock()
		return probe
	})
}
