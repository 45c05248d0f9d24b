package harness

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
)

// scale measures one dispatcher holding many idle endpoints: startup, memory, CPU.
func (b *bench) scale(ctx context.Context) (*section, error) {
	o := b.o
	s := &section{title: "Scale (idle endpoints)"}
	rcv, err := newReceiver("scale", nil)
	if err != nil {
		return nil, err
	}
	defer rcv.Close()
	type point struct {
		n                 int
		create, startup   time.Duration
		startCPU          time.Duration
		settle            time.Duration
		rss               int64
		mem               memStats
		idleCores         float64
		natsIdleCores     float64
		natsRSS0, natsRSS int64
		apiIdleCores      float64
		pubRate           float64
		etcdIdleCores     float64
		statusWrites      float64
		// restartWrites are the status writes of a second dispatcher started on the same
		// endpoints (largest count only), over restartSpan, with the API server's CPU.
		restartWrites   int
		restartSpan     time.Duration
		restartAPICores float64
	}
	var points []point
	counts := append([]int{1}, o.ScaleCounts...)
	var heapProfile, idleProfile string
	apiPid, etcdPid := childByName("kube-apiserver"), childByName("etcd")
	for i, n := range counts {
		progress("scale: %d endpoints", n)
		p := point{n: n}
		ns, err := b.namespace(ctx, "scale")
		if err != nil {
			return nil, err
		}
		ps, _ := sampleProc(b.nats.pid())
		p.natsRSS0 = ps.RSS
		eps := make([]endpoint, n)
		names := make([]string, n)
		for j := range n {
			names[j] = fmt.Sprintf("e%05d", j)
			eps[j] = endpoint{name: names[j], spec: v1alpha1.WebhookEndpointSpec{URL: rcv.URLWithPath("/" + names[j]), EventTypes: []v1alpha1.EventTypePattern{v1alpha1.EventTypePattern(fmt.Sprintf("s%d.>", j))}}}
		}
		t := time.Now()
		if err := b.createEndpoints(ctx, ns, eps); err != nil {
			return nil, err
		}
		p.create = time.Since(t)
		progress("  created %d endpoints, Secrets and consumers in %s", n, p.create.Round(time.Second))
		// What the endpoints' consumers cost every event a producer publishes: publish events
		// of a type no endpoint takes, before the dispatcher runs.
		pubN := 20000
		if o.Quick {
			pubN = 5000
		}
		tp := time.Now()
		if err := b.publishTo(ctx, b.cfg.Streams.For(ns).EventSubject("probe.none"), tag0(n), 0, pubN); err != nil {
			return nil, err
		}
		p.pubRate = float64(pubN) / time.Since(tp).Seconds()
		d, err := b.startDispatcher(ns)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		tag := fmt.Sprintf("scale%d", n)
		if err := b.publish(ctx, ns, "s0.ping", tag, 0, 1); err != nil {
			d.kill()
			return nil, err
		}
		if err := b.publish(ctx, ns, fmt.Sprintf("s%d.ping", n-1), tag, 1, 1); err != nil {
			d.kill()
			return nil, err
		}
		want := min(n, 2)
		if w := await(ctx, rcv, tag, want, 10*time.Minute, nil); !w.reached {
			d.kill()
			return nil, fmt.Errorf("%d endpoints: %d of %d probe deliveries within 10m; dispatcher log %s", n, w.unique, want, d.logPath)
		}
		p.startup = time.Since(t0)
		ps, _ = sampleProc(d.pid())
		p.startCPU = ps.CPU
		ts := time.Now()
		waitSettled(d, 2*time.Minute)
		// Each new endpoint gets its first status once: the idle window starts when they are
		// written (the dispatcher's CPU may drop under the threshold before, on a busy machine
		// whose kube-apiserver answers slowly).
		b.waitStatusesWritten(ctx, ns, 5*time.Minute)
		p.settle = time.Since(ts)
		idle := o.ScaleIdle
		if n == 1 {
			idle = min(idle, 10*time.Second)
		}
		writes := b.countStatusWrites(ctx, ns)
		d0, _ := sampleProc(d.pid())
		n0, _ := sampleProc(b.nats.pid())
		a0, _ := sampleProc(apiPid)
		e0, _ := sampleProc(etcdPid)
		if i == len(counts)-1 {
			// The idle window of the largest dispatcher runs under the CPU profiler.
			idleProfile = b.rep.file(fmt.Sprintf("dispatcher-idle-cpu-%d.pprof", n))
			if err := d.fetch(fmt.Sprintf("profile?seconds=%d", int(idle.Seconds())), idleProfile); err != nil {
				idleProfile = ""
			}
		} else {
			time.Sleep(idle)
		}
		d1, _ := sampleProc(d.pid())
		n1, _ := sampleProc(b.nats.pid())
		a1, _ := sampleProc(apiPid)
		e1, _ := sampleProc(etcdPid)
		p.statusWrites = float64(writes()) / idle.Seconds()
		p.apiIdleCores = (a1.CPU - a0.CPU).Seconds() / idle.Seconds()
		p.etcdIdleCores = (e1.CPU - e0.CPU).Seconds() / idle.Seconds()
		p.idleCores = (d1.CPU - d0.CPU).Seconds() / idle.Seconds()
		p.natsIdleCores = (n1.CPU - n0.CPU).Seconds() / idle.Seconds()
		p.natsRSS = n1.RSS
		if p.mem, err = d.stats(); err != nil {
			d.kill()
			return nil, err
		}
		ps, _ = sampleProc(d.pid())
		p.rss = ps.RSS
		if i == len(counts)-1 {
			heapProfile = b.rep.file(fmt.Sprintf("dispatcher-heap-%d.pprof", n))
			if err := d.fetch("heap?gc=1", heapProfile); err != nil {
				heapProfile = ""
			}
		}
		if err := d.stop(time.Minute); err != nil {
			progress("  %v", err)
		}
		if i == len(counts)-1 {
			// A restart with health unchanged: status writes from the new process's start
			// until it has settled and been idle a while.
			writes := b.countStatusWrites(ctx, ns)
			a0, _ := sampleProc(apiPid)
			t0 := time.Now()
			d, err := b.startDispatcher(ns)
			if err != nil {
				return nil, err
			}
			waitSettled(d, 2*time.Minute)
			time.Sleep(min(idle, 10*time.Second))
			a1, _ := sampleProc(apiPid)
			p.restartWrites, p.restartSpan = writes(), time.Since(t0)
			p.restartAPICores = (a1.CPU - a0.CPU).Seconds() / p.restartSpan.Seconds()
			if err := d.stop(time.Minute); err != nil {
				progress("  %v", err)
			}
			progress("  restart: %d status writes in %s", p.restartWrites, p.restartSpan.Round(time.Second))
		}
		b.retire(ctx, ns)
		points = append(points, p)
		progress("  settled (first statuses written) %s after startup", p.settle.Round(time.Second))
		progress("  startup %s, RSS %s, heap %s, %d goroutines, idle %.3f cores", p.startup.Round(100*time.Millisecond), mib(p.rss), mib(int64(p.mem.HeapAlloc)), p.mem.Goroutines, p.idleCores)
	}

	base := points[0]
	var rows [][]string
	for _, p := range points {
		perHeap, perRSS, perG := "–", "–", "–"
		if p.n > base.n {
			k := float64(p.n - base.n)
			perHeap = kib(float64(int64(p.mem.HeapAlloc)-int64(base.mem.HeapAlloc)) / k)
			perRSS = kib(float64(p.rss-base.rss) / k)
			perG = fmt.Sprintf("%.1f", float64(p.mem.Goroutines-base.mem.Goroutines)/k)
		}
		rows = append(rows, []string{strconv.Itoa(p.n), p.create.Round(100 * time.Millisecond).String(), p.startup.Round(100 * time.Millisecond).String(),
			fmt.Sprintf("%.1f s", p.startCPU.Seconds()), mib(p.rss), mib(int64(p.mem.HeapAlloc)), mib(int64(p.mem.StackInuse)), strconv.Itoa(p.mem.Goroutines),
			fmt.Sprintf("%.3f", p.idleCores), perHeap, perRSS, perG, fmt.Sprintf("%.3f", p.natsIdleCores), mib(p.natsRSS - p.natsRSS0), fmt.Sprintf("%.3f / %.3f", p.apiIdleCores, p.etcdIdleCores), fmt.Sprintf("%.1f", p.statusWrites), num(p.pubRate)})
	}
	s.printf("One dispatcher holding n idle endpoints (each with its signing Secret, its own pattern `s<i>.>` and its durable consumer). Startup is from the process start until a probe event to the first and to the last endpoint has arrived; then the dispatcher settles (under 0.2 cores over 2s, and every new endpoint's first status written: no status write for 3s) and its CPU is measured over %s of idleness. Memory is read after a forced GC (live heap) and from /proc (RSS). Per endpoint = (value at n − value with 1 endpoint) / (n − 1). Endpoint writes are the WebhookEndpoint changes (status applies) a watch saw during the idle window. The last column is the rate of a producer's asynchronous 1 KB publishes into the events stream (a type no endpoint takes) with the n endpoints' consumers on it, measured before the dispatcher starts.", o.ScaleIdle)
	s.table([]string{"endpoints", "created in", "startup", "startup CPU", "RSS", "live heap", "stacks", "goroutines", "idle CPU (cores)", "heap per endpoint", "RSS per endpoint", "goroutines per endpoint", "nats-server idle CPU (cores)", "nats-server RSS growth", "kube-apiserver / etcd idle CPU (cores)", "endpoint writes/s while idle", "publishes/s into the events stream"}, rows)
	for _, p := range points {
		if p.n == 10000 {
			b.rep.goal(s, p.rss < 320<<20, "issue 14", "10,000 idle endpoints in one dispatcher under 320 MiB RSS: %%GOAL%% (%s).", mib(p.rss))
			b.rep.goal(s, p.idleCores <= 0.02, "issue 14", "10,000 idle endpoints: at most 0.02 cores idle: %%GOAL%% (%.3f cores).", p.idleCores)
			b.rep.goal(s, p.statusWrites < 1 && p.restartWrites <= p.n/100, "issue 14",
				"no status-write storm: while idle and on a restart with health unchanged, (almost) no status written: %%GOAL%% (idle: %.1f writes/s; restart: %d writes in the %s from its start, kube-apiserver %.3f cores meanwhile).",
				p.statusWrites, p.restartWrites, p.restartSpan.Round(time.Second), p.restartAPICores)
		}
		if p.n == 1000 {
			per := float64(int64(p.mem.HeapAlloc)-int64(base.mem.HeapAlloc)) / float64(p.n-base.n)
			perRSS := float64(p.rss-base.rss) / float64(p.n-base.n)
			s.printf("Goal (issue 4): under 64 KB per idle endpoint with 1,000 endpoints: live heap %s (%s), RSS %s (%s).", kib(per), goal(per < 64<<10), kib(perRSS), goal(perRSS < 64<<10))
		}
	}
	if idleProfile != "" {
		s.printf("")
		s.printf("CPU profile of the idle dispatcher with %d endpoints over the idle window (`%s`), the project's functions (cumulative):", counts[len(counts)-1], idleProfile)
		s.printf("```")
		s.printf("%s", pprofTop(idleProfile, "-cum", "-show=webhook-operator/"))
		s.printf("```")
		s.printf("All functions (cumulative):")
		s.printf("```")
		s.printf("%s", pprofTop(idleProfile, "-cum"))
		s.printf("```")
	}
	if heapProfile != "" {
		s.printf("")
		s.printf("Heap profile with %d endpoints (`%s`, in-use space):", counts[len(counts)-1], heapProfile)
		s.printf("```")
		s.printf("%s", pprofTop(heapProfile, "-sample_index=inuse_space"))
		s.printf("```")
		s.printf("The project's functions (cumulative in-use space):")
		s.printf("```")
		s.printf("%s", pprofTop(heapProfile, "-sample_index=inuse_space", "-cum", "-show=webhook-operator/"))
		s.printf("```")
	}
	return s, nil
}

func tag0(n int) string { return fmt.Sprintf("scale%d-pub", n) }

// countStatusWrites watches the namespace's WebhookEndpoints from now on and returns a
// function that stops the watch and returns how many modifications it saw.
func (b *bench) countStatusWrites(ctx context.Context, ns string) func() int {
	wc, err := client.NewWithWatch(b.cp.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		return func() int { return -1 }
	}
	var list v1alpha1.WebhookEndpointList
	if err := b.k8s.List(ctx, &list, client.InNamespace(ns), client.Limit(1)); err != nil {
		return func() int { return -1 }
	}
	wctx, cancel := context.WithCancel(ctx)
	w, err := wc.Watch(wctx, &v1alpha1.WebhookEndpointList{}, &client.ListOptions{Namespace: ns, Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		cancel()
		return func() int { return -1 }
	}
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				n.Add(1)
			}
		}
	}()
	return func() int {
		w.Stop()
		cancel()
		<-done
		return int(n.Load())
	}
}

// waitSettled waits until the dispatcher uses under a fifth of a core over two seconds.
// waitStatusesWritten waits until 3s pass without a status write in namespace ns, or timeout.
func (b *bench) waitStatusesWritten(ctx context.Context, ns string, timeout time.Duration) {
	ts := time.Now()
	for time.Since(ts) < timeout && ctx.Err() == nil {
		writes := b.countStatusWrites(ctx, ns)
		time.Sleep(3 * time.Second)
		if writes() <= 0 {
			return
		}
	}
}

func waitSettled(d *dispatcherProc, timeout time.Duration) {
	ts := time.Now()
	for time.Since(ts) < timeout {
		a, _ := sampleProc(d.pid())
		time.Sleep(2 * time.Second)
		c, _ := sampleProc(d.pid())
		if (c.CPU-a.CPU).Seconds()/2 < 0.2 {
			return
		}
	}
}
