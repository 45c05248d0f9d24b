package harness

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Scenarios are every scenario, in the order they run.
var Scenarios = []string{"throughput", "tracing", "latency", "replicas", "isolation", "backlog", "recovery", "scale", "ingress"}

// Options size the scenarios. Defaults are the full run; -quick shrinks every count so the
// whole bench finishes in about a minute and a half.
type Options struct {
	Run    []string
	Quick  bool
	Repeat int
	OutDir string

	// Throughput: events per measurement and the concurrency of every client (the dispatcher
	// endpoint's maxInFlight, the naive loop's workers, the HTTP client's goroutines).
	Events   int
	InFlight int
	Profile  bool

	// Latency: offered rates and how long each is offered.
	Rates       []int
	LatencyTime time.Duration

	// Isolation: events fanned out to the 99 healthy endpoints (and the bad one).
	IsoEvents int
	// IsoTimeout is the hanging endpoint's spec.timeout.
	IsoTimeout time.Duration
	// IsoRepeat is how many times the three isolation cases are measured.
	IsoRepeat int

	// Backlog: deliveries waiting for a late retry, and new events per measured batch.
	Backlog    int
	BacklogNew int

	// Scale: idle endpoint counts, and how long the idle CPU is measured.
	ScaleCounts []int
	ScaleIdle   time.Duration

	// Recovery: outage length and deliveries queued during it.
	Outage         time.Duration
	RecoveryEvents int
	// RecoveryRuns is how many times the recovery scenario runs (it is the slowest).
	RecoveryRuns int

	// Ingress: events of each closed-loop measurement and its concurrency, the paced rate and
	// how long it is offered.
	IngressEvents      int
	IngressConcurrency int
	IngressRate        int
	IngressTime        time.Duration

	Args []string
}

// ParseFlags reads the command line.
func ParseFlags(args []string) (Options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	run := fs.String("run", strings.Join(Scenarios, ","), "scenarios to run, comma-separated: "+strings.Join(Scenarios, ", "))
	quick := fs.Bool("quick", false, "small counts and short durations (about a minute and a half in all), to check the bench works")
	o := Options{}
	fs.IntVar(&o.Repeat, "repeat", 0, "runs of each measurement (default 3, -quick 1)")
	fs.StringVar(&o.OutDir, "out", "bench/results", "directory for the results file and pictures")
	fs.IntVar(&o.Events, "events", 0, "throughput: events per measurement (default 50000, -quick 5000)")
	fs.IntVar(&o.InFlight, "inflight", 0, "throughput: concurrency of every client, the dispatcher endpoint's maxInFlight (default 256)")
	fs.BoolVar(&o.Profile, "profile", true, "throughput: one extra dispatcher run under the CPU profiler")
	rates := fs.String("rates", "1000,5000", "latency: offered rates, events/s")
	fs.DurationVar(&o.LatencyTime, "latency-time", 0, "latency: how long each rate is offered (default 10s, -quick 3s)")
	fs.IntVar(&o.IsoEvents, "iso-events", 0, "isolation: events, each delivered to every endpoint (default 1000, -quick 100)")
	fs.DurationVar(&o.IsoTimeout, "iso-timeout", 5*time.Second, "isolation: the hanging endpoint's timeout")
	fs.IntVar(&o.IsoRepeat, "iso-repeat", 0, "isolation: runs of the three cases (default 5, -quick 1)")
	fs.IntVar(&o.Backlog, "backlog", 0, "backlog: deliveries waiting for a late retry (default 100000, -quick 5000)")
	fs.IntVar(&o.BacklogNew, "backlog-new", 0, "backlog: new events per measured batch (default 10000, -quick 1000)")
	scale := fs.String("scale", "", "scale: idle endpoint counts (default 1000,10000, -quick 100,1000)")
	fs.DurationVar(&o.ScaleIdle, "scale-idle", 0, "scale: idle CPU measuring window (default 30s, -quick 5s)")
	fs.DurationVar(&o.Outage, "outage", 0, "recovery: outage length (default 60s, -quick 10s)")
	fs.IntVar(&o.RecoveryEvents, "recovery-events", 0, "recovery: deliveries queued during the outage (default 10000, -quick 1000)")
	fs.IntVar(&o.RecoveryRuns, "recovery-runs", 0, "recovery: runs (default 2, -quick 1)")
	fs.IntVar(&o.IngressEvents, "ingress-events", 0, "ingress: events of each closed-loop measurement (default 30000, -quick 5000)")
	fs.IntVar(&o.IngressConcurrency, "ingress-concurrency", 0, "ingress: concurrency of the closed loops (default 64)")
	fs.IntVar(&o.IngressRate, "ingress-rate", 5000, "ingress: the paced rate, events/s")
	fs.DurationVar(&o.IngressTime, "ingress-time", 0, "ingress: how long the paced rate is offered (default 10s, -quick 3s)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.Args = args
	o.Quick = *quick
	for _, s := range strings.Split(*run, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !contains(Scenarios, s) {
			return o, fmt.Errorf("unknown scenario %q (have %s)", s, strings.Join(Scenarios, ", "))
		}
		o.Run = append(o.Run, s)
	}
	var err error
	if o.Rates, err = ints(*rates); err != nil {
		return o, fmt.Errorf("-rates: %w", err)
	}
	if *scale != "" {
		if o.ScaleCounts, err = ints(*scale); err != nil {
			return o, fmt.Errorf("-scale: %w", err)
		}
	}
	o.defaults()
	return o, nil
}

func (o *Options) defaults() {
	pick := func(full, quick int) int {
		if o.Quick {
			return quick
		}
		return full
	}
	pickD := func(full, quick time.Duration) time.Duration {
		if o.Quick {
			return quick
		}
		return full
	}
	setI := func(p *int, full, quick int) {
		if *p <= 0 {
			*p = pick(full, quick)
		}
	}
	setD := func(p *time.Duration, full, quick time.Duration) {
		if *p <= 0 {
			*p = pickD(full, quick)
		}
	}
	setI(&o.Repeat, 3, 1)
	setI(&o.Events, 50000, 5000)
	setI(&o.InFlight, 256, 256)
	setD(&o.LatencyTime, 10*time.Second, 3*time.Second)
	setI(&o.IsoEvents, 1000, 100)
	setI(&o.IsoRepeat, 5, 1)
	setI(&o.Backlog, 100000, 5000)
	setI(&o.BacklogNew, 10000, 1000)
	if len(o.ScaleCounts) == 0 {
		o.ScaleCounts = []int{pick(1000, 100), pick(10000, 1000)}
	}
	setD(&o.ScaleIdle, 30*time.Second, 5*time.Second)
	setD(&o.Outage, 60*time.Second, 10*time.Second)
	setI(&o.RecoveryEvents, 10000, 1000)
	setI(&o.RecoveryRuns, 2, 1)
	setI(&o.IngressEvents, 30000, 5000)
	setI(&o.IngressConcurrency, 64, 64)
	setD(&o.IngressTime, 10*time.Second, 3*time.Second)
	if o.Quick {
		o.Profile = false
	}
}

func (o *Options) runs(s string) bool { return contains(o.Run, s) }

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, v)
	}
	return out, nil
}
