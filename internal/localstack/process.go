package localstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Restart backoff of a supervised process, as the kubelet's CrashLoopBackOff: it doubles from
// restartBackoffMin up to restartBackoffMax and resets after restartBackoffReset of running.
const (
	restartBackoffMin   = time.Second
	restartBackoffMax   = 30 * time.Second
	restartBackoffReset = time.Minute
)

// launch says how to start one run of a supervised process. It is called before every start
// (ports, tokens and environment are prepared afresh) and may fail, e.g. while a Secret the
// environment refers to is missing; the supervisor then backs off and tries again.
type launch func(ctx context.Context) (*exec.Cmd, error)

// supervisor keeps one process running until stopped, restarting it with backoff when it
// exits, like a container with restartPolicy Always. The process runs in its own process
// group, which is killed as a whole, and dies with this process (PR_SET_PDEATHSIG).
type supervisor struct {
	name  string
	logf  func(format string, args ...any)
	grace time.Duration
	// started is called with each started process's id, exited with its exit error.
	started func(pid int)
	exited  func(err error)

	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	cmd *exec.Cmd
}

// startSupervisor starts the supervision loop; stop ends it.
func startSupervisor(name string, grace time.Duration, logf func(string, ...any), l launch, started func(int), exited func(error)) *supervisor {
	ctx, cancel := context.WithCancel(context.Background())
	s := &supervisor{name: name, logf: logf, grace: grace, started: started, exited: exited, cancel: cancel, done: make(chan struct{})}
	go s.loop(ctx, l)
	return s
}

func (s *supervisor) loop(ctx context.Context, l launch) {
	defer close(s.done)
	backoff := restartBackoffMin
	for ctx.Err() == nil {
		began := time.Now()
		err := s.runOnce(ctx, l)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > restartBackoffReset {
			backoff = restartBackoffMin
		}
		s.logf("%s: %v; restarting in %s", s.name, err, backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, restartBackoffMax)
	}
}

// runOnce prepares, starts and waits for one run of the process. When ctx ends it sends
// SIGTERM to the process group, then SIGKILL after the grace period.
func (s *supervisor) runOnce(ctx context.Context, l launch) error {
	cmd, err := l(ctx)
	if err != nil {
		return fmt.Errorf("cannot start: %w", err)
	}
	setProcessGroup(cmd)
	if cmd.WaitDelay == 0 {
		// Wait returns even if something of the group still holds the output pipe.
		cmd.WaitDelay = 2 * time.Second
	}
	if err := cmd.Start(); err != nil {
		if s.exited != nil {
			s.exited(err)
		}
		return fmt.Errorf("cannot start: %w", err)
	}
	pid := cmd.Process.Pid
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	if s.started != nil {
		s.started(pid)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err = <-waited:
	case <-ctx.Done():
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		select {
		case err = <-waited:
		case <-time.After(s.grace):
			s.logf("%s: still running %s after SIGTERM: killing process group %d", s.name, s.grace, pid)
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			err = <-waited
		}
	}
	// Whatever the process left in its group goes with it.
	killGroup(pid)
	s.mu.Lock()
	s.cmd = nil
	s.mu.Unlock()
	if s.exited != nil {
		s.exited(err)
	}
	if err == nil {
		err = errors.New("exited with status 0")
	}
	return fmt.Errorf("process %d %w", pid, exitDescription(err))
}

// killGroup kills the process group pgid and waits, up to 5 seconds, until no member of it
// runs any more (zombies waiting for their parent to reap them do not count).
func killGroup(pgid int) {
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(-pgid, syscall.SIGKILL) == nil && groupRuns(pgid) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// pid is the running process's id, 0 when none runs.
func (s *supervisor) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// stop terminates the process (SIGTERM, then SIGKILL after the grace period) and waits until
// it and the supervision loop are gone.
func (s *supervisor) stop() {
	s.cancel()
	<-s.done
}

func exitDescription(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Errorf("was killed by %s", ws.Signal())
		}
		return fmt.Errorf("exited with status %d", ee.ExitCode())
	}
	return err
}

// setProcessGroup puts cmd in a new process group and has the kernel kill it when this
// process dies, so that no child outlives the stack even when it is killed.
func setProcessGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

// logFile opens path for appending a process's output.
func logFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}

// outputTo writes the process output to its log file and, when set, to an extra writer
// with a prefix on every line.
func outputTo(f *os.File, extra io.Writer, prefix string) io.Writer {
	if extra == nil {
		return f
	}
	return io.MultiWriter(f, &prefixWriter{w: extra, prefix: prefix})
}

// prefixWriter prefixes every line written to w.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	mid    bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]byte, 0, len(b)+len(p.prefix))
	for _, c := range b {
		if !p.mid {
			out = append(out, p.prefix...)
			p.mid = true
		}
		out = append(out, c)
		if c == '\n' {
			p.mid = false
		}
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}
