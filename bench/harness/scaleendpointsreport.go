package harness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// scaleEndpoints runs the scale-endpoints scenario at every count of -se-endpoints, each a
// fresh installation, and reports the curve.
func (b *bench) scaleEndpoints(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Scale (endpoints on a NATS cluster)"}
	dir, err := os.MkdirTemp("", "webhook-operator-bench-se-")
	if err != nil {
		return nil, err
	}
	progress("scale-endpoints: building webhook-operator and nats-server (the module's version) into %s", dir)
	operator, natsServer, err := buildSE(dir)
	if err != nil {
		return nil, err
	}
	var results []*seResult
	var runErr error
	for i, n := range o.SEEndpoints {
		nss := o.SENamespaces[0]
		if len(o.SENamespaces) > 1 {
			nss = o.SENamespaces[i]
		}
		c := seConfig{
			Endpoints: n, Namespaces: nss, Servers: o.SEServers, Replicas: o.SEReplicas,
			Active: o.SEActive, Dead: o.SEDead, Slow: o.SESlow, SlowAnswer: o.SESlowAnswer,
			Reference: n > 0, ReadyTimeout: o.SEReadyTimeout, Idle: o.SEIdle, Restarts: o.SERestarts, StopGrace: 10 * time.Minute,
			Rates: o.SERates, HotRate: o.SEHotRate, Phase: o.SEPhase, Shared: o.SEShared, IdleAfter: o.SEIdleAfter,
			OperatorBinary: operator, NATSBinary: natsServer, Dir: filepath.Join(dir, fmt.Sprintf("n%d", n)),
		}
		if o.Profile {
			c.ControllerHeap = b.rep.file(fmt.Sprintf("controller-heap-%d.pprof", n))
		}
		progress("scale-endpoints: %d endpoints in %d namespaces, %d servers, R%d (logs in %s)", n, nss, c.Servers, c.Replicas, c.Dir)
		res, err := runSE(ctx, c)
		if res != nil {
			results = append(results, res)
			if res.natsVersion != "" && b.natsVersion == "" {
				b.natsVersion = res.natsVersion
			}
		}
		if err != nil {
			runErr = fmt.Errorf("%d endpoints: %w (logs kept in %s)", n, err, c.Dir)
			break
		}
		_ = os.RemoveAll(c.Dir)
	}
	b.seReport(s, results)
	if runErr != nil {
		return s, runErr
	}
	_ = os.RemoveAll(dir)
	return s, nil
}

// buildSE builds webhook-operator and nats-server (the module's versions) into dir, at once.
func buildSE(dir string) (operator, natsServer string, err error) {
	operator, natsServer = filepath.Join(dir, "webhook-operator"), filepath.Join(dir, "nats-server")
	errs := make(chan error, 2)
	go func() { errs <- testenv.GoBuild(operator, "./cmd/webhook-operator") }()
	go func() { errs <- testenv.GoBuild(natsServer, "github.com/nats-io/nats-server/v2") }()
	err = errors.Join(<-errs, <-errs)
	return operator, natsServer, err
}

// perServer formats one figure of every server, "a / b / c".
func perServer(res *seResult, f func(serverFigures) string) string {
	parts := make([]string, len(res.servers))
	for i, sf := range res.servers {
		parts[i] = f(sf)
	}
	return strings.Join(parts, " / ")
}

func secs(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	if d < 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f s", d.Seconds())
}

func coresOf(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.3f", v)
}

// seReport renders the scenario's tables and goals.
func (b *bench) seReport(s *section, results []*seResult) {
	o := b.o
	s.printf("The whole product as an installation runs it, one fresh installation per count: %d nats-server processes (the version go.mod pins, built with `go build`) clustered on loopback, every stream and consumer with %d replicas placed on them; a kube-apiserver and etcd; the real controller (`webhook-operator controller`, default flags) and each namespace's dispatcher Deployment as a process (internal/localstack, NATS in auth-callout mode over TLS). The endpoints are applied as a user would, 16 at a time, spread evenly over the namespaces, each with its own event types (`<name>.>`) and a path of its own on a receiver on loopback; the controller makes their Secrets and consumers. %.0f%% of them receive events; of those, %.0f%% answer 500 (dead) and %.0f%% answer 200 after %s (slow, `timeout` %s), at least one each; one (the hot one) gets %s events/s. A namespace `se-ref` with one idle endpoint runs beside them: its dispatcher's RSS is the baseline of the dispatchers' memory per idle endpoint.",
		o.SEServers, o.SEReplicas, 100*o.SEActive, 100*o.SEDead, 100*o.SESlow, o.SESlowAnswer, o.SESlowAnswer+5*time.Second, num(float64(o.SEHotRate)))
	if o.SEShared {
		s.printf("")
		s.printf("**With -se-shared:** the controller runs with `--shared-dispatcher`: no namespace has a dispatcher Deployment of its own; the shared dispatcher's replicas (a Deployment in the controller's namespace, processes here) serve every namespace, `se-ref` included, each with the namespace's own tokens. The dispatchers' columns are those replicas; the reference and the memory per idle endpoint do not apply.")
	}
	s.printf("")
	s.printf("- consumers and streams are the account's, listed through the JetStream API (durable: the operator's; the clients' ordered consumers, R1 in memory, are not counted). HA assets are a server's streams and consumers with more than one replica, each a Raft group (from its `/jsz?accounts=true&streams=true&consumers=true&config=true`).")
	s.printf("- per server (n1 / n2 / n3): RSS and CPU from /proc, goroutines from its /debug/pprof (`prof_port`), files in its store directory; each server's `max_file_store` is 8 GiB or, with many namespaces, room for every namespace's stream bounds (JetStream reserves a stream's `max_bytes` there when the stream is made: 416 MiB a namespace with the defaults). Idle CPU is measured over a quiet window of %s after every endpoint was Ready and the status writes had stopped; the load average and the CPU the machine's other users took during it are beside it (the machine is shared: idle CPU figures are noisy).", o.SEIdle)
	s.printf("- consumers created in: from the first create until the consumer count of server n1 (its /jsz, read every second) last grew before every endpoint was Ready. Ready in: until every WebhookEndpoint's `Ready` condition is True (from a watch).")
	s.printf("- status writes: the API server's `apiserver_request_total` for webhookendpoints, subresource status, every verb but reads, over the quiet window.")
	s.printf("- restarts: server by server, SIGTERM and the time until the process exits (graceful stop), then started again and the time until its `/healthz` answers 200 (every stream and consumer it holds current; in brackets, until its JetStream API answered); the next waits until every server is healthy.")
	s.printf("")
	var rows [][]string
	for _, r := range results {
		a := r.assets
		rows = append(rows, []string{num(float64(r.c.Endpoints)), strconv.Itoa(r.c.Namespaces), num(float64(a.Durable)), strconv.Itoa(a.Streams),
			perServer(r, func(f serverFigures) string { return num(float64(f.haAssets())) }),
			perServer(r, func(f serverFigures) string { return fmt.Sprintf("%.0f", float64(f.rss)/(1<<20)) }),
			perServer(r, func(f serverFigures) string { return coresOf(f.idleCores) }),
			perServer(r, func(f serverFigures) string { return num(float64(f.goroutines)) }),
			perServer(r, func(f serverFigures) string { return num(float64(f.files)) }),
			secs(r.consumers), secs(r.ready), r.idleLoad[0] + " → " + r.idleLoad[1], coresOf(r.idleOthers)})
	}
	s.printf("Per server (n1 / n2 / n3):")
	s.table([]string{"endpoints", "namespaces", "durable consumers", "streams", "HA assets", "RSS (MiB)", "idle CPU (cores)", "goroutines", "store files", "consumers created in", "all Ready in", "load average over the quiet window", "other users' CPU meanwhile (cores)"}, rows)
	rows = nil
	for _, r := range results {
		if r.applyAPI > 0 {
			s.printf("JetStream API requests from the first create until every endpoint was Ready, at %s endpoints: %s (%.1f per endpoint; every client's, summed over the servers' `/jsz` api.total).",
				num(float64(r.c.Endpoints)), num(float64(r.applyAPI)), float64(r.applyAPI)/float64(max(r.total, 1)))
		}
	}
	for _, r := range results {
		if len(r.applyCPU) == 0 || r.total == 0 {
			continue
		}
		n := float64(r.total)
		var parts []string
		for _, part := range []string{"kube-apiserver", "etcd", "controller", "dispatchers", "nats-servers"} {
			parts = append(parts, fmt.Sprintf("%s %.1f ms", part, 1000*r.applyCPU[part]/n))
		}
		s.printf("CPU per endpoint from the first create until every endpoint was Ready, at %s endpoints: %s.", num(float64(r.c.Endpoints)), strings.Join(parts, ", "))
		type kv struct {
			k string
			v float64
		}
		var reqs []kv
		total := 0.0
		for k, v := range r.applyRequests {
			reqs = append(reqs, kv{k, v})
			total += v
		}
		slices.SortFunc(reqs, func(a, b kv) int { return cmp.Compare(b.v, a.v) })
		var top []string
		for _, q := range reqs[:min(len(reqs), 12)] {
			top = append(top, fmt.Sprintf("%s %.2f", q.k, q.v/n))
		}
		if len(reqs) > 0 {
			s.printf("API server requests per endpoint meanwhile (apiserver_request_total, watches left out): %.1f in all; %s.", total/n, strings.Join(top, ", "))
		}
	}
	for _, r := range results {
		for _, f := range r.servers {
			if !f.restarted {
				continue
			}
			stop := secs(f.stop)
			if !f.graceful {
				stop += " (killed)"
			}
			rows = append(rows, []string{num(float64(r.c.Endpoints)), f.name, stop, secs(f.ready) + " (" + secs(f.jsReady) + ")", r.restartLoad})
		}
	}
	if len(rows) > 0 {
		s.printf("Restarts, one server after the other:")
		s.table([]string{"endpoints", "server", "graceful stop", "healthy after its start (JetStream answering)", "load average before the restarts"}, rows)
	}
	rows = nil
	for _, r := range results {
		disp := len(r.dispatcherRSS)
		mean := int64(0)
		if disp > 0 {
			mean = r.dispatchersRSS() / int64(disp)
		}
		per := "–"
		if v := r.perIdleEndpoint(); !math.IsNaN(v) {
			per = kib(v)
		}
		rows = append(rows, []string{num(float64(r.c.Endpoints)), mib(r.controllerRSS), coresOf(r.controllerIdle), strconv.Itoa(disp), mib(r.dispatchersRSS()), mib(mean), mib(r.refRSS), per,
			coresOf(r.dispatcherIdle), fmt.Sprintf("%.1f", r.statusWrites), fmt.Sprintf("%.1f", r.otherWrites), coresOf(r.apiIdle) + " / " + coresOf(r.etcdIdle), secs(r.settle)})
	}
	s.printf("The controller, the dispatchers and the API server (RSS after the quiet window; CPU over it):")
	defer func() {
		for _, r := range results {
			if r.controllerHeap == "" {
				continue
			}
			s.printf("The controller's live heap with %s endpoints after the quiet window (`%s`), in use after a collection, cumulative:", num(float64(r.c.Endpoints)), r.controllerHeap)
			s.printf("```")
			s.printf("%s", pprofTop(r.controllerHeap, "-sample_index=inuse_space", "-cum"))
			s.printf("```")
		}
	}()
	for _, r := range results {
		if f := r.sleep; r.c.Shared && r.c.IdleAfter > 0 {
			s.printf("Sleeping namespaces (%s endpoints; `--shared-dispatcher-idle-after=%s`): when the quiet window began, %d namespaces asleep and %d awake (webhook_shared_dispatcher_namespaces, summed over the shared dispatcher's replicas), %s after the status writes had stopped. The first event after sleeping, one each to an idle endpoint of %d sleeping namespaces in turn, publish → receipt: %s.",
				num(float64(r.c.Endpoints)), r.c.IdleAfter, f.asleep, f.awake, secs(f.after), len(f.wakes), durations(f.wakes))
			s.printf("")
		}
	}
	s.table([]string{"endpoints", "controller RSS", "controller idle CPU", "dispatchers", "dispatchers' RSS", "per dispatcher", "reference dispatcher (1 endpoint)", "dispatcher memory per idle endpoint", "dispatchers' idle CPU (cores)", "status writes/min while idle", "other endpoint writes/min", "kube-apiserver / etcd idle CPU", "status writes settled after Ready in"}, rows)
	for _, r := range results {
		t := r.traffic
		if t == nil || t.healthy == 0 || len(o.SERates) == 0 { // -se-rates '' skips the traffic
			continue
		}
		s.printf("Publish → receipt with %s endpoints (%d healthy active ones; latency from the publish call to the receiver, one machine's clock; load average %s → %s):", num(float64(r.c.Endpoints)), t.healthy, t.load[0], t.load[1])
		var lr [][]string
		row := func(what string, l seLatency, ref float64) {
			rel := "–"
			if !math.IsNaN(ref) && ref > 0 {
				rel = ratio(l.p99 / ref)
			}
			lr = append(lr, []string{what, num(l.achieved), fmt.Sprintf("%s / %s", num(float64(l.got)), num(float64(l.sent))), ms(l.p50), ms(l.p99), ms(l.max), rel})
		}
		for _, rate := range o.SERates {
			if l, ok := t.rates[rate]; ok {
				row(fmt.Sprintf("%s events/s over the %d healthy endpoints", num(float64(rate)), t.healthy), l, math.NaN())
			}
		}
		base := o.SERates[0]
		if t.hot.sent > 0 {
			row(fmt.Sprintf("the hot endpoint's %d neighbours (its namespace's healthy endpoints) at %s events/s, alone", t.neighbours, num(float64(base))), t.base, math.NaN())
			row(fmt.Sprintf("the same beside the hot endpoint at %s events/s", num(float64(o.SEHotRate))), t.hotNeighbours, t.base.p99)
			row("the other healthy endpoints meanwhile", t.hotOthers, t.rates[base].p99)
			row("the hot endpoint itself (its backlog drains for at most 3 minutes)", t.hot, math.NaN())
		}
		if t.deadN+t.slowN > 0 {
			row(fmt.Sprintf("the healthy endpoints at %s events/s beside %d dead and %d slow ones", num(float64(base)), t.deadN, t.slowN), t.iso, t.rates[base].p99)
		}
		s.table([]string{"what", "offered /s", "received / published", "p50 ms", "p99 ms", "max ms", "p99 ratio to alone"}, lr)
		if t.deadN+t.slowN > 0 {
			s.printf("During the isolation phase the dead endpoints got %d requests, the slow ones %d.", t.deadReq, t.slowReq)
		}
	}
	if len(results) == 0 {
		return
	}
	r := results[len(results)-1]
	at := fmt.Sprintf("at %s endpoints in %d namespaces", num(float64(r.c.Endpoints)), r.c.Namespaces)
	streamsPerNS := 2 // consumers read the events and the deliveries streams
	nss := r.c.Namespaces
	if r.c.Reference {
		nss++
	}
	// A goal is judged on the figures of the stage that measures it; a run stopped before
	// that stage leaves it not measured.
	judgeOf := func(issue string) func(need seStage, what string, ok bool, format string, a ...any) {
		return func(need seStage, what string, ok bool, format string, a ...any) {
			if r.reached < need {
				b.rep.unmeasured(s, issue, what+" "+at, r.stopped)
				return
			}
			b.rep.goal(s, ok, issue, what+": %%GOAL%% "+format, a...)
		}
	}
	judge := judgeOf("issue 32")
	judge(seSnapshot, fmt.Sprintf("consumers independent of endpoints, at most one per namespace and stream (%d here)", streamsPerNS*nss),
		r.assets.Durable <= streamsPerNS*nss, "(%s durable consumers %s).", num(float64(r.assets.Durable)), at)
	maxRSS, maxIdle := int64(0), 0.0
	for _, f := range r.servers {
		maxRSS = max(maxRSS, f.rss)
		if !math.IsNaN(f.idleCores) {
			maxIdle = max(maxIdle, f.idleCores)
		}
	}
	judge(seSnapshot, "each server under 1 GiB RSS and 0.15 cores idle (the goal is for 100,000 endpoints)",
		maxRSS < 1<<30 && maxIdle < 0.15, "%s (largest %s, %.3f cores; load average %s).", at, mib(maxRSS), maxIdle, r.idleLoad[1])
	judge(seStarted, "every endpoint Ready within 10 minutes of applying them",
		r.readyCount == r.total && r.ready <= 10*time.Minute, "%s (%d of %d, %s).", at, r.readyCount, r.total, secs(r.ready))
	if r.c.Shared {
		// One process serves every namespace: no reference dispatcher to subtract; what the
		// namespaces' dispatchers cost in all is issue 33's measure.
		judge(seSnapshot, "the controller under 1 GiB", r.controllerRSS < 1<<30, "%s (controller %s).", at, mib(r.controllerRSS))
		judgeOf("issue 33")(seQuiet, "the dispatchers of every namespace under 2 GiB and 0.2 cores idle (the goal is for 1,000 namespaces, 900 idle)",
			r.dispatchersRSS() < 2<<30 && r.dispatcherIdle < 0.2, "%s (the shared dispatcher: %s, %.3f cores idle; %d namespaces asleep, %d awake).", at, mib(r.dispatchersRSS()), r.dispatcherIdle, r.sleep.asleep, r.sleep.awake)
		if r.c.IdleAfter > 0 {
			judgeOf("issue 33")(seQuiet, "the first event after idleness delivered within 5 s",
				len(r.sleep.wakes) > 0 && slices.Max(r.sleep.wakes) <= 5*time.Second, "%s (%s).", at, durations(r.sleep.wakes))
		}
	} else {
		per := r.perIdleEndpoint()
		judge(seSnapshot, "the controller under 1 GiB and the dispatchers' memory per idle endpoint under 4 KiB",
			r.controllerRSS < 1<<30 && !math.IsNaN(per) && per < 4<<10, "%s (controller %s, %s per idle endpoint).", at, mib(r.controllerRSS), kib(per))
	}
	judge(seQuiet, "no status write while nothing changes", r.statusWrites == 0, "%s (%.1f status writes/min over %s).", at, r.statusWrites, o.SEIdle)
	if r.reached < seTrafficDone && o.SEPhase > 0 && len(o.SERates) > 0 {
		b.rep.unmeasured(s, "issue 32", "isolation and publish → receipt latency "+at, r.stopped)
	}
	if t := r.traffic; t != nil && r.reached >= seTrafficDone && t.healthy > 0 && len(o.SERates) > 0 {
		base := o.SERates[0]
		if t.deadN+t.slowN > 0 {
			rel := t.iso.p99 / t.rates[base].p99
			b.rep.goal(s, rel <= 1.5, "issue 32", "with 1%% of the endpoints dead and 1%% answering in %s, the healthy endpoints' p99 at most 1.5x the baseline's: %%GOAL%% %s (%s ms against %s ms, %s).", o.SESlowAnswer, at, ms(t.iso.p99), ms(t.rates[base].p99), ratio(rel))
		}
		if t.hot.sent > 0 {
			rel := t.hotNeighbours.p99 / t.base.p99
			b.rep.goal(s, rel <= 1.5, "issue 32", "a hot endpoint (%s events/s) does not delay its neighbours (their p99 at most 1.5x alone): %%GOAL%% %s (%s ms against %s ms, %s).", num(float64(o.SEHotRate)), at, ms(t.hotNeighbours.p99), ms(t.base.p99), ratio(rel))
		}
		if l, ok := t.rates[1000]; ok {
			b.rep.goal(s, l.p99 < 5, "issue 32", "p99 publish → receipt under 5 ms at 1,000 events/s: %%GOAL%% %s, R%d (%s ms).", at, r.c.Replicas, ms(l.p99))
		}
		if l, ok := t.rates[5000]; ok {
			b.rep.goal(s, l.p99 < 10, "issue 32", "p99 publish → receipt under 10 ms at 5,000 events/s: %%GOAL%% %s, R%d (%s ms).", at, r.c.Replicas, ms(l.p99))
		}
	}
	s.printf("")
	s.printf("Throughput with every feature on against the naive loop is the throughput scenario's (run it in the same command: `-run throughput,latency,scale-endpoints`).")
}

// durations lists ds, rounded to milliseconds ("–" when none).
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "–"
	}
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond).String()
	}
	return strings.Join(out, ", ")
}
