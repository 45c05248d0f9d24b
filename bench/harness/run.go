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
	o   Options
	rep *report
	// waits counts where in-flight deliveries were found in goroutine profiles.
	waits map[string]int
	// natsVersion is the version of the nats-server measured.
	natsVersion string
}

// ownWorld are the scenarios that start their own installation rather than the shared world.
var ownWorld = []string{"scale-endpoints", "data-api"}

// Run runs the chosen scenarios, writes the report to o.OutDir and prints it.
func Run(ctx context.Context, o Options) error {
	rep := newReport(o)
	b := &bench{o: o, rep: rep, waits: map[string]int{}}
	type scenario func(context.Context) (*section, error)
	all := map[string]scenario{
		"throughput": b.throughput, "tracing": b.tracing, "receiver-auth": b.receiverAuth, "latency": b.latency, "replicas": b.replicas, "isolation": b.isolation,
		"backlog": b.backlog, "recovery": b.recovery, "scale": b.scale, "ingress": b.ingressBench, "scale-endpoints": b.scaleEndpoints, "data-api": b.dataAPI,
	}
	titles := map[string]string{
		"throughput": "Throughput", "tracing": "Tracing cost", "receiver-auth": "Receiver authentication cost", "latency": "Latency", "replicas": "Replicas", "isolation": "Isolation",
		"backlog": "Retry backlog", "recovery": "Recovery", "scale": "Scale (idle endpoints)", "ingress": "Ingress",
		"scale-endpoints": "Scale (endpoints on a NATS cluster)", "data-api": "Data API",
	}
	var failed []string
	var path string
	for _, name := range Scenarios {
		if !o.runs(name) || ctx.Err() != nil {
			continue
		}
		if b.world == nil && !contains(ownWorld, name) {
			w, err := newWorld(ctx, o)
			if err != nil {
				return err
			}
			b.world, b.natsVersion = w, w.nc.ConnectedServerVersion()
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
		if path, err = rep.write(b.natsVersion); err != nil {
			return err
		}
	}
	if b.world != nil {
		b.world.close()
	}
	if path != "" {
		b, _ := os.ReadFile(path)
		fmt.Println(string(b))
		progress("results written to %s", path)
	}
	if len(failed) > 0 {
		if b.world != nil {
			return fmt.Errorf("scenarios failed: %v (logs kept in %s)", failed, b.world.dir)
		}
		return fmt.Errorf("scenarios failed: %v", failed)
	}
	if b.world != nil {
		b.world.removeDir()
	}
	return nil
}
