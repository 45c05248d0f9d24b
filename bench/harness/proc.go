package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a child process of the harness binary running one role (see child.go). It reports
// on stdout with lines such as "READY ..." and "RESULT {...}", logs to a file, and stops when
// its stdin closes (so a dying harness never leaves it behind).
type proc struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	logPath string

	mu    sync.Mutex
	lines []string
	more  chan struct{}
	done  chan struct{}
	err   error
}

// childExe is the executable children run: a copy of the harness's own binary in the run's
// directory, so that rebuilding bin/bench during a run (another `make bench`) cannot change or
// break the children.
var childExe string

// useOwnCopy copies the running executable into dir and makes children run the copy.
func useOwnCopy(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	b, err := os.ReadFile(self)
	if err != nil {
		return err
	}
	p := filepath.Join(dir, "bench")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		return err
	}
	childExe = p
	return nil
}

// startChild runs `<self> child <role> args...`, logging its stderr to logDir/<name>.log.
func startChild(logDir, name string, env []string, args ...string) (*proc, error) {
	self := childExe
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	return startExe(logDir, name, self, env, append([]string{"child"}, args...)...)
}

// startExe runs the executable exe with args as a child (killed with the harness), logging its
// stderr to logDir/<name>.log.
func startExe(logDir, name, exe string, env []string, args ...string) (*proc, error) {
	p := &proc{name: name, more: make(chan struct{}, 1), done: make(chan struct{}), logPath: filepath.Join(logDir, name+".log")}
	logf, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(exe, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		logf.Close()
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.more <- struct{}{}:
			default:
			}
		}
		p.err = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// line waits for the first output line starting with prefix and returns the rest of it.
func (p *proc) line(prefix string, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	seen := 0
	for {
		p.mu.Lock()
		lines := p.lines[seen:]
		seen = len(p.lines)
		p.mu.Unlock()
		for _, l := range lines {
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return strings.TrimSpace(rest), nil
			}
		}
		select {
		case <-p.more:
		case <-p.done:
			// Read what was printed last, then give up.
			p.mu.Lock()
			lines := p.lines[seen:]
			p.mu.Unlock()
			for _, l := range lines {
				if rest, ok := strings.CutPrefix(l, prefix); ok {
					return strings.TrimSpace(rest), nil
				}
			}
			return "", fmt.Errorf("%s exited (%v) before printing %q; log: %s%s", p.name, p.err, prefix, p.logPath, tail(p.logPath))
		case <-deadline:
			return "", fmt.Errorf("%s printed no %q within %s; log: %s%s", p.name, prefix, timeout, p.logPath, tail(p.logPath))
		}
	}
}

// stop closes the child's stdin (it shuts down cleanly), and kills it after timeout.
func (p *proc) stop(timeout time.Duration) error {
	_ = p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %s and was killed", p.name, timeout)
	}
	var ee *exec.ExitError
	if p.err != nil && !errors.As(p.err, &ee) {
		return p.err
	}
	if p.err != nil {
		return fmt.Errorf("%s: %v; log: %s%s", p.name, p.err, p.logPath, tail(p.logPath))
	}
	return nil
}

// kill ends the child at once.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "\n--- last lines ---\n" + string(b)
}

// parentGone returns a context that ends when stdin closes or SIGTERM arrives.
func parentGone() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	sig := make(chan os.Signal, 1)
	signalNotify(sig)
	go func() {
		select {
		case <-sig:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// procSample is one reading of a process's CPU time and resident memory.
type procSample struct {
	CPU time.Duration
	RSS int64 // bytes
}

// sampleProc reads /proc/<pid>/stat and /proc/<pid>/status.
func sampleProc(pid int) (procSample, error) {
	var s procSample
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	str := string(b)
	i := strings.LastIndexByte(str, ')')
	if i < 0 || i+2 >= len(str) {
		return s, fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	f := strings.Fields(str[i+2:])
	if len(f) < 13 {
		return s, fmt.Errorf("unreadable /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	s.CPU = time.Duration(ut+st) * time.Second / clockTicks
	b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			s.RSS = kb << 10
		}
	}
	return s, nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// loadAvg is the 1, 5 and 15 minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// load1 is the 1-minute load average.
func load1() float64 {
	f := strings.Fields(loadAvg())
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// procStat is one process's /proc/<pid>/stat: its command name and the fields after it
// (state is fields[0], ppid fields[1]).
type procStat struct {
	pid    int
	comm   string
	fields []string
}

// eachProc calls f for every process readable in /proc.
func eachProc(f func(procStat)) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		str := string(b)
		open, close := strings.IndexByte(str, '('), strings.LastIndexByte(str, ')')
		if open < 0 || close < open || close+2 >= len(str) {
			continue
		}
		f(procStat{pid: pid, comm: str[open+1 : close], fields: strings.Fields(str[close+2:])})
	}
}

// childByName finds a child process of this one by its command name (e.g. the envtest
// kube-apiserver); 0 when there is none.
func childByName(comm string) int {
	me, found := os.Getpid(), 0
	eachProc(func(p procStat) {
		if found != 0 || len(p.fields) < 2 || p.comm != comm {
			return
		}
		if ppid, _ := strconv.Atoi(p.fields[1]); ppid == me {
			found = p.pid
		}
	})
	return found
}

// meter measures how much CPU the rest of the machine (processes outside the bench's own
// process tree: other users of a shared machine) used over a window.
type meter struct {
	at         time.Time
	busy, tree time.Duration
}

func startMeter() meter { return meter{at: time.Now(), busy: machineBusy(), tree: treeCPU()} }

// others is the CPU used outside the bench's process tree since the meter started, in cores.
func (m meter) others() float64 {
	wall := time.Since(m.at).Seconds()
	if wall <= 0 {
		return 0
	}
	return max(0, ((machineBusy()-m.busy)-(treeCPU()-m.tree)).Seconds()/wall)
}

// machineBusy is the busy CPU time of all cores since boot, from /proc/stat.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system irq softirq steal
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// treeCPU is the CPU time of this process and every live descendant, each with its reaped
// children's time, so a child that exits between two readings is still counted.
func treeCPU() time.Duration {
	parent := map[int]int{}
	cpu := map[int]int64{}
	eachProc(func(p procStat) {
		if len(p.fields) < 15 {
			return
		}
		ppid, _ := strconv.Atoi(p.fields[1])
		var t int64
		for _, k := range []int{11, 12, 13, 14} { // utime stime cutime cstime
			v, _ := strconv.ParseInt(p.fields[k], 10, 64)
			t += v
		}
		parent[p.pid], cpu[p.pid] = ppid, t
	})
	me := os.Getpid()
	inTree := func(pid int) bool {
		for n := 0; pid > 1 && n < 64; n++ {
			if pid == me {
				return true
			}
			pid = parent[pid]
		}
		return false
	}
	var ticks int64
	for pid, t := range cpu {
		if inTree(pid) {
			ticks += t
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks
}
