package harness

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// report is the results file: a header describing the machine and the command, then one
// section per scenario.
type report struct {
	o        Options
	stamp    string
	started  time.Time
	header   []string
	sections []*section
	// goals are every goal line of the run, summed up at the top of the report.
	goals []string
}

// section is one scenario's part of the report, in Markdown.
type section struct {
	title string
	lines []string
}

func (s *section) printf(format string, a ...any) {
	s.lines = append(s.lines, fmt.Sprintf(format, a...))
}

// table appends a Markdown table.
func (s *section) table(head []string, rows [][]string) {
	s.lines = append(s.lines, "", "| "+strings.Join(head, " | ")+" |")
	sep := make([]string, len(head))
	for i := range sep {
		sep[i] = "---"
	}
	s.lines = append(s.lines, "|"+strings.Join(sep, "|")+"|")
	for _, r := range rows {
		s.lines = append(s.lines, "| "+strings.Join(r, " | ")+" |")
	}
	s.lines = append(s.lines, "")
}

func newReport(o Options) *report {
	now := time.Now().UTC()
	r := &report{o: o, stamp: now.Format("20060102-150405"), started: now}
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	host, _ := os.Hostname()
	r.header = []string{
		"# webhook-operator bench, " + now.Format("2006-01-02 15:04 MST"),
		"",
		fmt.Sprintf("- command: `make bench` → `bin/bench %s`", strings.Join(o.Args, " ")),
		fmt.Sprintf("- machine: %d cores (%s), %s, host %s", runtime.NumCPU(), cpu, runtime.GOOS+"/"+runtime.GOARCH, host),
		fmt.Sprintf("- Go %s; load average (1, 5, 15 min) at start: %s", runtime.Version(), loadAvg()),
		"- code: " + buildVCS(),
		"- parts (of every scenario but scale-endpoints, which says what it runs): nats-server (embedded server package in its own process, JetStream, file storage), envtest kube-apiserver and etcd,",
		"  receivers on loopback in the harness process; each dispatcher is dispatcher.Run (the code of `webhook-operator dispatcher`,",
		"  production defaults) in its own child process; the baselines are child processes too.",
		"- every figure is measured on a shared 2-core machine: compare ratios taken in the same run, not absolute rates across runs.",
	}
	return r
}

// write writes the report to OutDir/<stamp>.md and returns the path.
func (r *report) write(natsVersion string) (string, error) {
	if err := os.MkdirAll(r.o.OutDir, 0o755); err != nil {
		return "", err
	}
	var b strings.Builder
	for _, l := range r.header {
		b.WriteString(l + "\n")
	}
	if natsVersion != "" {
		b.WriteString("- nats-server " + natsVersion + "\n")
	}
	fmt.Fprintf(&b, "- load average at end: %s; wall time %s\n", loadAvg(), time.Since(r.started).Round(time.Second))
	if len(r.goals) > 0 {
		b.WriteString("\n## Goals\n\n")
		for _, g := range r.goals {
			b.WriteString("- " + g + "\n")
		}
	}
	for _, s := range r.sections {
		b.WriteString("\n## " + s.title + "\n\n")
		for _, l := range s.lines {
			b.WriteString(l + "\n")
		}
	}
	p := filepath.Join(r.o.OutDir, r.stamp+".md")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		return "", err
	}
	return p, nil
}

// file is the path of one of the run's files (a profile, a picture); the directory is created
// on the first call, since profiles are written before the results file.
func (r *report) file(suffix string) string {
	_ = os.MkdirAll(r.o.OutDir, 0o755)
	return filepath.Join(r.o.OutDir, r.stamp+"-"+suffix)
}

// percentile of sorted values (nearest rank).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// num formats a rate with thousands separators.
func num(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, c)
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func nums(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = num(x)
	}
	return strings.Join(parts, ", ")
}

func ratio(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}

func ratios(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = ratio(x)
	}
	return strings.Join(parts, ", ")
}

func ms(d float64) string {
	if math.IsNaN(d) {
		return "–"
	}
	if d < 10 {
		return fmt.Sprintf("%.2f", d)
	}
	return fmt.Sprintf("%.1f", d)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

// goal prints a goal line in s, "Goal (<source>): <what>: met|not met ...", and keeps it for
// the report's summary.
func (r *report) goal(s *section, ok bool, source, format string, a ...any) {
	line := fmt.Sprintf("Goal (%s): %s", source, strings.Replace(fmt.Sprintf(format, a...), "%GOAL%", goal(ok), 1))
	s.printf("%s", line)
	r.goals = append(r.goals, s.title+": "+line)
}

// unmeasured prints a goal line in s that a run stopped before measuring, and keeps it for the
// report's summary: neither met nor not met.
func (r *report) unmeasured(s *section, source, what string, why error) {
	line := fmt.Sprintf("Goal (%s): %s: **not measured** (the run stopped first: %v).", source, what, why)
	s.printf("%s", line)
	r.goals = append(r.goals, s.title+": "+line)
}

func goal(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

// pprofTop runs `go tool pprof -top` on a profile; empty when go is not available.
func pprofTop(path string, extra ...string) string {
	args := append([]string{"tool", "pprof", "-top", "-nodecount=30"}, extra...)
	args = append(args, path)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("(go tool pprof failed: %v)\n%s", err, out)
	}
	// Drop the header lines about the binary and the build ID.
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "File:") || strings.HasPrefix(l, "Build ID:") || strings.HasPrefix(l, "Type:") || strings.HasPrefix(l, "Time:") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.TrimSpace(strings.Join(keep, "\n"))
}

// waitSummary reads the dispatcher's goroutine profile (debug=1, stacks grouped with counts)
// and counts the goroutines working on a delivery (under worker.runMsg) by where they are:
// the innermost dispatcher function and what it called.
func waitSummary(text string, into map[string]int) {
	var count int
	var frames []string
	flush := func() {
		if count == 0 {
			return
		}
		inDelivery := false
		for _, f := range frames {
			if strings.Contains(f, "deliver.(*Worker).runMsg") {
				inDelivery = true
			}
		}
		if inDelivery {
			for i, f := range frames {
				if strings.Contains(f, "webhook-operator/dispatcher/") {
					label := short(f)
					if i > 0 {
						label += " → " + short(frames[i-1])
					}
					into[label] += count
					break
				}
			}
		}
		count, frames = 0, nil
	}
	for _, l := range strings.Split(text, "\n") {
		switch {
		case strings.Contains(l, " @ 0x"):
			flush()
			fmt.Sscanf(l, "%d @", &count)
		case strings.HasPrefix(l, "#\t"):
			f := strings.Fields(l)
			if len(f) >= 3 {
				fn := f[2]
				if i := strings.LastIndex(fn, "+0x"); i > 0 {
					fn = fn[:i]
				}
				frames = append(frames, fn)
			}
		}
	}
	flush()
}

// short drops the module path of a function name.
func short(fn string) string {
	if i := strings.LastIndex(fn, "/"); i >= 0 {
		return fn[i+1:]
	}
	return fn
}

// buildVCS names the commit the bench binary (and so the dispatcher under test) was built
// from, and whether the working tree had uncommitted changes.
func buildVCS() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown build"
	}
	var rev, at, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = " plus uncommitted changes in the working tree"
			}
		}
	}
	if rev == "" {
		return gitDescribe()
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	return "commit " + rev + " (" + at + ")" + dirty
}

// cores formats CPU loads in cores.
func cores(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, ", ")
}

// gitDescribe names the repository's commit when the run starts (make bench builds the binary
// just before), and whether the dispatcher's code had uncommitted changes.
func gitDescribe() string {
	root := testenv.Root()
	out, err := exec.Command("git", "-C", root, "log", "-1", "--format=%h %cI").Output()
	if err != nil {
		return "unknown commit (no version control information)"
	}
	desc := "commit " + strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--", "dispatcher", "internal", "api").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		desc += " plus uncommitted changes in dispatcher/, internal/ or api/"
	}
	return desc + " (the tree the bench binary was built from just before the run)"
}
