package harness

import (
	"context"
	"fmt"
	"os"
	"time"
)

// bench is one run: its world and its report.
type bench struct {
	*world
	rep *report
	// waits counts where in-flight deliveries were found in goroutine profiles.
	waits map[string]int
}

// Run runs the chosen scenarios, writes the report to o.OutDir and prints it.
func Run(ctx context.Context, o Options) error {
	rep := newReport(o)
	w, err := newWorld(ctx, o)
	if err != nil {
		return err
	}
	b := &bench{world: w, rep: rep, waits: map[string]int{}}
	natsVersion := w.nc.ConnectedServerVersion()
	type scenario func(context.Context) (*section, error)
	all := map[string]scenario{
		"throughput": b.throughput, "tracing": b.tracing, "latency": b.latency, "replicas": b.replicas, "isolation": b.isolation,
		"backlog": b.backlog, "recovery": b.recovery, "scale": b.scale, "ingress": b.ingressBench,
	}
	titles := map[string]string{
		"throughput": "Throughput", "tracing": "Tracing cost", "latency": "Latency", "replicas": "Replicas", "isolation": "Isolation",
		"backlog": "Retry backlog", "recovery": "Recovery", "scale": "Scale (idle endpoints)", "ingress": "Ingress",
	}
	var failed []string
	var path string
	for _, name := range Scenarios {
		if !o.runs(name) || ctx.Err() != nil {
			continue
		}
		start, l0 := time.Now(), loadAvg()
		progress("=== %s", name)
		s, err := all[name](ctx)
		if err != nil {
			failed = append(failed, name)
			progress("%s failed: %v", name, err)
			if s == nil {
				s = &section{}
			}
			s.printf("")
			s.printf("**The scenario failed**: %v", err)
		}
		s.title = titles[name]
		s.printf("")
		s.printf("_%s took %s; load average before %s, after %s._", name, time.Since(start).Round(time.Second), l0, loadAvg())
		rep.sections = append(rep.sections, s)
		if path, err = rep.write(natsVersion); err != nil {
			return err
		}
	}
	w.close()
	if path != "" {
		b, _ := os.ReadFile(path)
		fmt.Println(string(b))
		progress("results written to %s", path)
	}
	if len(failed) > 0 {
		return fmt.Errorf("scenarios failed: %v (logs kept in %s)", failed, w.dir)
	}
	w.removeDir()
	return nil
}
