package harness

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Scenarios are every scenario, in the order they run.
var Scenarios = []string{"throughput", "tracing", "receiver-auth", "latency", "replicas", "isolation", "backlog", "recovery", "scale", "ingress", "scale-endpoints", "data-api"}

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

	// Scale-endpoints: endpoint counts (each a fresh installation), namespaces (one value for
	// every count, or one per count), NATS servers and replicas; the fractions of endpoints
	// that receive events, and of those that fail and that answer after SEslowAnswer; the
	// quiet window; how many servers are restarted; the traffic phases' length, offered rates
	// and the hot endpoint's rate; the bound on the wait for every endpoint to be Ready.
	SEEndpoints    []int
	SENamespaces   []int
	SEServers      int
	SEReplicas     int
	SEActive       float64
	SEDead         float64
	SESlow         float64
	SESlowAnswer   time.Duration
	SEIdle         time.Duration
	SERestarts     int
	SEPhase        time.Duration
	SERates        []int
	SEHotRate      int
	SEReadyTimeout time.Duration
	// SEShared runs the controller with --shared-dispatcher: one shared dispatcher serves every
	// namespace instead of a Deployment each.
	SEShared bool
	// SEIdleAfter is the shared dispatcher's idle time before a namespace sleeps (0: never).
	SEIdleAfter time.Duration

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
	fs.BoolVar(&o.Profile, "profile", true, "throughput: one extra dispatcher run under the CPU profiler; scale-endpoints: the controller's heap profile after the quiet window")
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
	seEndpoints := fs.String("se-endpoints", "", "scale-endpoints: endpoint counts, each a fresh installation (default 1000, -quick 100)")
	seNamespaces := fs.String("se-namespaces", "", "scale-endpoints: namespaces, one for every count or one per count (default 10, -quick 2)")
	fs.IntVar(&o.SEServers, "se-servers", 3, "scale-endpoints: nats-servers in the cluster")
	fs.IntVar(&o.SEReplicas, "se-replicas", 0, "scale-endpoints: replicas of every stream and consumer (default: 3, at most the servers)")
	fs.Float64Var(&o.SEActive, "se-active", 0.1, "scale-endpoints: fraction of the endpoints that receive events")
	fs.Float64Var(&o.SEDead, "se-dead", 0.01, "scale-endpoints: fraction of the active endpoints that answer 500 (at least one when not 0)")
	fs.Float64Var(&o.SESlow, "se-slow", 0.01, "scale-endpoints: fraction of the active endpoints that answer after -se-slow-answer (at least one when not 0)")
	fs.DurationVar(&o.SESlowAnswer, "se-slow-answer", 10*time.Second, "scale-endpoints: how long the slow endpoints take to answer")
	fs.DurationVar(&o.SEIdle, "se-idle", 0, "scale-endpoints: quiet window for idle CPU and status writes (default 60s, -quick 10s)")
	fs.IntVar(&o.SERestarts, "se-restarts", -1, "scale-endpoints: servers stopped and started again, one after the other (default every server, -quick 1)")
	fs.DurationVar(&o.SEPhase, "se-phase", 0, "scale-endpoints: length of each traffic phase (default 20s, -quick 5s)")
	seRates := fs.String("se-rates", "1000,5000", "scale-endpoints: offered rates over the healthy active endpoints, events/s; the first is the isolation phases' baseline ('' skips the traffic)")
	fs.IntVar(&o.SEHotRate, "se-hot-rate", -1, "scale-endpoints: the hot endpoint's rate, events/s; 0 skips the hot phase (default 10000, -quick 2000)")
	fs.DurationVar(&o.SEIdleAfter, "se-idle-after", time.Minute, "scale-endpoints with -se-shared: the controller's --shared-dispatcher-idle-after; the quiet window starts once every namespace sleeps, and the first event after sleeping is timed (0: namespaces never sleep)")
	fs.BoolVar(&o.SEShared, "se-shared", false, "scale-endpoints: the controller's --shared-dispatcher (one shared dispatcher for every namespace instead of a Deployment each)")
	fs.DurationVar(&o.SEReadyTimeout, "se-ready-timeout", 0, "scale-endpoints: bound on the wait for every endpoint to be Ready (default 30m, -quick 5m)")
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
	if *seEndpoints != "" {
		if o.SEEndpoints, err = counts(*seEndpoints); err != nil {
			return o, fmt.Errorf("-se-endpoints: %w", err)
		}
	}
	if *seNamespaces != "" {
		if o.SENamespaces, err = ints(*seNamespaces); err != nil {
			return o, fmt.Errorf("-se-namespaces: %w", err)
		}
	}
	if o.SERates, err = ints(*seRates); err != nil {
		return o, fmt.Errorf("-se-rates: %w", err)
	}
	if len(o.SENamespaces) > 1 && len(o.SENamespaces) != len(o.SEEndpoints) {
		return o, fmt.Errorf("-se-namespaces: one value, or one per count of -se-endpoints")
	}
	if o.SEServers < 1 || o.SEReplicas < 0 || o.SEReplicas > o.SEServers && o.SEReplicas != 0 {
		return o, fmt.Errorf("-se-servers must be at least 1 and -se-replicas at most -se-servers")
	}
	for name, f := range map[string]float64{"-se-active": o.SEActive, "-se-dead": o.SEDead, "-se-slow": o.SESlow} {
		if f < 0 || f > 1 {
			return o, fmt.Errorf("%s must be a fraction from 0 to 1, not %g", name, f)
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
	if len(o.SEEndpoints) == 0 {
		o.SEEndpoints = []int{pick(1000, 100)}
	}
	if len(o.SENamespaces) == 0 {
		o.SENamespaces = []int{pick(10, 2)}
	}
	if o.SEReplicas == 0 {
		o.SEReplicas = min(3, o.SEServers)
	}
	setD(&o.SEIdle, 60*time.Second, 10*time.Second)
	if o.SERestarts < 0 {
		o.SERestarts = pick(o.SEServers, 1)
	}
	setD(&o.SEPhase, 20*time.Second, 5*time.Second)
	if o.SEHotRate < 0 {
		o.SEHotRate = pick(10000, 2000)
	}
	setD(&o.SEReadyTimeout, 30*time.Minute, 5*time.Minute)
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

// counts is ints allowing 0 (an installation without endpoints).
func counts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%q is not a count", f)
		}
		out = append(out, v)
	}
	return out, nil
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
