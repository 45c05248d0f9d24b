package localstack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// startConsole runs `webhook-operator console` (as the chart's console.enabled) on
// 127.0.0.1, plain HTTP: browsers keep its Secure cookies on localhost. Its kubeconfig only
// gives it the API server's address and CA: every call carries the signed-in user's token.
func (s *Stack) startConsole(ctx context.Context, o Options) error {
	dir := filepath.Join(s.Dir, "console")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	port, err := testenv.FreePort()
	if err != nil {
		return err
	}
	s.ConsoleURL = fmt.Sprintf("http://127.0.0.1:%d", port)
	var mu sync.Mutex
	var out *os.File
	launch := func(context.Context) (*exec.Cmd, error) {
		args := []string{"console", fmt.Sprintf("--listen=127.0.0.1:%d", port), "--namespace=default"}
		cmd := exec.Command(o.Binary, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "KUBECONFIG=" + s.Kubeconfig}
		f, err := logFile(filepath.Join(s.Dir, "logs", "console.log"))
		if err != nil {
			return nil, err
		}
		w := outputTo(f, o.Output, "console | ")
		cmd.Stdout, cmd.Stderr = w, w
		mu.Lock()
		out = f
		mu.Unlock()
		s.logf("console: %s at %s; log %s", strings.Join(append([]string{"webhook-operator"}, args...), " "), s.ConsoleURL, f.Name())
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
	s.console = startSupervisor("console", o.Grace, s.logf, launch, nil, exited)
	return s.waitReady(ctx, "console", func() string { return s.ConsoleURL + "/healthz" })
}
