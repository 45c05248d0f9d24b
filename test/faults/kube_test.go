package faults

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// tenant is one scenario's namespace on a stack, with a signing secret its endpoints share.
type tenant struct {
	t      *testing.T
	st     *localstack.Stack
	ns     string
	secret string // whsec_...
}

// newTenant creates the namespace ns and the Secret "signing" (key "secret") on the suite's
// stack.
func newTenant(t *testing.T, ns string) *tenant { return newTenantOn(t, stack, ns) }

// newTenantOn is newTenant on the stack st.
func newTenantOn(t *testing.T, st *localstack.Stack, ns string) *tenant {
	t.Helper()
	key := make([]byte, 24)
	_, _ = rand.Read(key)
	tn := &tenant{t: t, st: st, ns: ns, secret: "whsec_" + base64.StdEncoding.EncodeToString(key)}
	tn.apply(fmt.Sprintf(`
apiVersion: v1
kind: Namespace
metadata: {name: %s}
---
apiVersion: v1
kind: Secret
metadata: {name: signing, namespace: %s, annotations: {webhook-operator.io/allowed-endpoints: "*"}}
stringData: {secret: %s}
`, ns, ns, tn.secret))
	return tn
}

// apply creates the objects of a YAML stream in the tenant's namespace.
func (tn *tenant) apply(yaml string) {
	tn.t.Helper()
	for _, doc := range strings.Split(yaml, "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj, _, err := scheme.Decoder().Decode([]byte(doc), nil, nil)
		if err != nil {
			tn.t.Fatalf("decoding %s: %v", doc, err)
		}
		o := obj.(client.Object)
		if _, isNS := o.(*corev1.Namespace); !isNS && o.GetNamespace() == "" {
			o.SetNamespace(tn.ns)
		}
		if err := tn.st.Client.Create(context.Background(), o); err != nil {
			tn.t.Fatalf("creating %s %s: %v", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
	}
}

// endpoint reads an endpoint.
func (tn *tenant) endpoint(name string) (*v1alpha1.WebhookEndpoint, error) {
	ep := &v1alpha1.WebhookEndpoint{}
	return ep, tn.st.Client.Get(context.Background(), types.NamespacedName{Namespace: tn.ns, Name: name}, ep)
}

// waitCondition waits until the endpoint's condition has status.
func (tn *tenant) waitCondition(name, condition string, status metav1.ConditionStatus, timeout time.Duration) {
	tn.t.Helper()
	err := testenv.Poll(timeout, func() error {
		ep, err := tn.endpoint(name)
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(ep.Status.Conditions, condition)
		if c == nil || c.Status != status {
			return fmt.Errorf("endpoint %s/%s: condition %s is %+v, want %s", tn.ns, name, condition, c, status)
		}
		return nil
	})
	if err != nil {
		tn.t.Fatal(err)
	}
}

// plugin runs `kubectl-webhooks args...` in the tenant's namespace and returns its output.
func (tn *tenant) plugin(args ...string) string {
	tn.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binDir+"/kubectl-webhooks", append(args, "-n", tn.ns)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + tn.t.TempDir(), "KUBECONFIG=" + tn.st.Kubeconfig}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		tn.t.Fatalf("kubectl webhooks %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// dispatcherPIDs are the running processes of the replicas of the tenant's Deployment (0:
// restarting).
func (tn *tenant) dispatcherPIDs(deployment string) []int {
	var pids []int
	for _, pid := range tn.st.Runner.Pods(tn.ns, deployment) {
		pids = append(pids, pid)
	}
	return pids
}

// controllerPID finds the process running `webhook-operator controller`.
func controllerPID() (int, error) {
	procs, err := localstack.Descendants(os.Getpid())
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && strings.HasSuffix(args[0], "/webhook-operator") && args[1] == "controller" {
			return p.PID, nil
		}
	}
	return 0, fmt.Errorf("no controller process among %v", procs)
}

// kill sends SIGKILL to one process.
func kill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
