// Package scale_test measures the controller at scale: 1,000 endpoints across 10 namespaces,
// created at once, against a real kube-apiserver, etcd and nats-server, with the controller
// running as its own process (`webhook-operator controller`) so that its memory is its own.
//
// It is a benchmark, so `make test` does not run it:
//
//	go test -run '^$' -bench ControllerScale -benchtime=1x ./controllers/scale/
//
// SCALE_ENDPOINTS, SCALE_NAMESPACES and SCALE_CONCURRENCY (the controller's
// --max-concurrent-reconciles) change the shape.
package scale_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkControllerScale creates every endpoint at once (one in 20 dedicated, the others on
// their namespace's shared dispatcher) and reports:
//   - s-wired: until every endpoint has its consumer and its Deployment exists;
//   - s-ready: until every endpoint is Ready, after the test marks every Deployment available;
//   - reconciles/s: endpoint and dispatcher reconciles over s-wired;
//   - MiB-peak: the controller process's peak resident memory (VmHWM);
//   - s-deleted: until every endpoint is deleted (each drained) and nothing is left.
func BenchmarkControllerScale(b *testing.B) {
	endpoints, namespaces := envInt("SCALE_ENDPOINTS", 1000), envInt("SCALE_NAMESPACES", 10)
	concurrency := envInt("SCALE_CONCURRENCY", 16)
	ctx := context.Background()

	cp, err := testenv.StartControlPlane()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cp.Stop() }()
	k8s := cp.Client
	// The test watches rather than lists, so that counting costs the API server nothing.
	watched, err := cache.New(cp.Config, cache.Options{Scheme: scheme.New()})
	if err != nil {
		b.Fatal(err)
	}
	cctx, stopCache := context.WithCancel(ctx)
	defer stopCache()
	for _, obj := range []client.Object{&v1alpha1.WebhookEndpoint{}, &appsv1.Deployment{}} {
		if _, err := watched.GetInformer(cctx, obj); err != nil {
			b.Fatal(err)
		}
	}
	go func() { _ = watched.Start(cctx) }()
	if !watched.WaitForCacheSync(cctx) {
		b.Fatal("test cache did not sync")
	}
	ns, err := testenv.StartNATS("")
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Cleanup()
	nc, js, err := ns.Connect()
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	layout := streams.DefaultConfig()

	dir := b.TempDir()
	bin := filepath.Join(dir, "webhook-operator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/webhook-operator")
	build.Dir = testenv.Root()
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building the controller: %v\n%s", err, out)
	}
	kubeconfig, err := cp.WriteKubeconfig(dir)
	if err != nil {
		b.Fatal(err)
	}
	metricsAddr := freeAddr(b)
	ctrlLog, err := os.Create(filepath.Join(dir, "controller.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer ctrlLog.Close()
	cmd := exec.Command(bin, "controller", "--kubeconfig="+kubeconfig, "--nats-url="+ns.URL(),
		"--dispatcher-image=registry.example/webhook-operator:bench", "--metrics-bind-address="+metricsAddr, "--metrics-secure=false",
		"--health-probe-bind-address=0", "--max-concurrent-reconciles="+strconv.Itoa(concurrency), "--zap-log-level=error")
	cmd.Stdout, cmd.Stderr = ctrlLog, ctrlLog
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	// The controller is up once it serves its metrics.
	testenv.Eventually(b, 60*time.Second, func() error {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("metrics: %s", resp.Status)
		}
		return nil
	}, "the controller to start")

	nsNames := make([]string, namespaces)
	for i := range nsNames {
		nsNames[i] = fmt.Sprintf("scale-%02d", i)
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsNames[i]}}); err != nil {
			b.Fatal(err)
		}
	}
	dedicated := 0
	eps := make([]*v1alpha1.WebhookEndpoint, endpoints)
	for i := range eps {
		ep := &v1alpha1.WebhookEndpoint{
			ObjectMeta: metav1.ObjectMeta{Namespace: nsNames[i%namespaces], Name: fmt.Sprintf("endpoint-%04d", i)},
			Spec: v1alpha1.WebhookEndpointSpec{
				URL:        fmt.Sprintf("https://receiver-%d.example.com/hooks", i),
				EventTypes: []v1alpha1.EventTypePattern{"order.*", "invoice.paid"},
			},
		}
		if i%20 == 0 {
			ep.Spec.Dispatcher = &v1alpha1.DispatcherSpec{Dedicated: true}
			dedicated++
		}
		eps[i] = ep
	}
	wantDeployments := namespaces + dedicated

	b.ResetTimer()
	start := time.Now()
	parallel(b, eps, 32, func(ep *v1alpha1.WebhookEndpoint) error { return k8s.Create(ctx, ep) })
	created := time.Since(start)

	var consumers, deployments int
	testenv.Eventually(b, 5*time.Minute, func() error {
		consumers = countConsumers(ctx, b, js, nsNames, layout.Names.For, streams.NamespaceNames.DeliveriesStream, "ep_scale-")
		list := &appsv1.DeploymentList{}
		if err := watched.List(ctx, list); err != nil {
			return err
		}
		deployments = 0
		for _, d := range list.Items {
			if strings.HasPrefix(d.Namespace, "scale-") {
				deployments++
			}
		}
		if consumers != endpoints || deployments != wantDeployments {
			return fmt.Errorf("%d of %d consumers, %d of %d Deployments", consumers, endpoints, deployments, wantDeployments)
		}
		return nil
	}, "every consumer and Deployment")
	wired := time.Since(start)
	reconcilesWired := reconciles(b, metricsAddr)

	// Availability, as the deployment controller would report it; then every endpoint Ready.
	list := &appsv1.DeploymentList{}
	if err := k8s.List(ctx, list); err != nil {
		b.Fatal(err)
	}
	var deps []*appsv1.Deployment
	for i := range list.Items {
		if strings.HasPrefix(list.Items[i].Namespace, "scale-") {
			deps = append(deps, &list.Items[i])
		}
	}
	parallel(b, deps, 16, func(d *appsv1.Deployment) error {
		d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, ReadyReplicas: 1, AvailableReplicas: 1, UpdatedReplicas: 1}
		return k8s.Status().Update(ctx, d)
	})
	testenv.Eventually(b, 5*time.Minute, func() error {
		l := &v1alpha1.WebhookEndpointList{}
		if err := watched.List(ctx, l); err != nil {
			return err
		}
		ready := 0
		for _, ep := range l.Items {
			if meta.IsStatusConditionTrue(ep.Status.Conditions, v1alpha1.ConditionReady) && ep.Status.ObservedGeneration == ep.Generation {
				ready++
			}
		}
		if ready != endpoints {
			return fmt.Errorf("%d of %d endpoints Ready", ready, endpoints)
		}
		return nil
	}, "every endpoint Ready")
	ready := time.Since(start)
	reconcilesReady := reconciles(b, metricsAddr)

	delStart := time.Now()
	parallel(b, eps, 32, func(ep *v1alpha1.WebhookEndpoint) error { return client.IgnoreNotFound(k8s.Delete(ctx, ep)) })
	testenv.Eventually(b, 5*time.Minute, func() error {
		l := &v1alpha1.WebhookEndpointList{}
		if err := watched.List(ctx, l); err != nil {
			return err
		}
		d := &appsv1.DeploymentList{}
		if err := watched.List(ctx, d); err != nil {
			return err
		}
		deliveries := countConsumers(ctx, b, js, nsNames, layout.Names.For, streams.NamespaceNames.DeliveriesStream, "")
		events := countConsumers(ctx, b, js, nsNames, layout.Names.For, streams.NamespaceNames.EventsStream, "")
		if n := len(l.Items) + len(d.Items) + deliveries + events; n > 0 {
			return fmt.Errorf("%d endpoints, %d Deployments, %d endpoint and %d router consumers left", len(l.Items), len(d.Items), deliveries, events)
		}
		return nil
	}, "every endpoint and dispatcher gone")
	deleted := time.Since(delStart)
	b.StopTimer()
	peak, cpu := processStats(b, cmd.Process.Pid)

	b.ReportMetric(wired.Seconds(), "s-wired")
	b.ReportMetric(ready.Seconds(), "s-ready")
	b.ReportMetric(float64(reconcilesWired.total())/wired.Seconds(), "reconciles/s")
	b.ReportMetric(float64(peak)/(1<<20), "MiB-peak")
	b.ReportMetric(deleted.Seconds(), "s-deleted")
	b.Logf("%d endpoints (%d dedicated) in %d namespaces, --max-concurrent-reconciles=%d, CPUs %d",
		endpoints, dedicated, namespaces, concurrency, runtime.NumCPU())
	b.Logf("created by the test in %.1fs; every consumer (%d) and Deployment (%d) in %.1fs; every endpoint Ready in %.1fs",
		created.Seconds(), consumers, deployments, wired.Seconds(), ready.Seconds())
	b.Logf("reconciles until wired: %s (%.0f/s); until Ready: %s (%.0f/s)", reconcilesWired, float64(reconcilesWired.total())/wired.Seconds(),
		reconcilesReady, float64(reconcilesReady.total())/ready.Seconds())
	b.Logf("the controller's API requests: %s", apiLatency(b, metricsAddr))
	b.Logf("controller peak RSS %.1f MiB, CPU %.1fs over the whole run; deletion of all (each drained) %.1fs",
		float64(peak)/(1<<20), cpu.Seconds(), deleted.Seconds())
}

// apiLatency scrapes the controller's API requests by verb: count and mean latency.
func apiLatency(b *testing.B, addr string) string {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sum, count := map[string]float64{}, map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var m map[string]float64
		switch {
		case strings.HasPrefix(line, "rest_client_request_duration_seconds_sum{"):
			m = sum
		case strings.HasPrefix(line, "rest_client_request_duration_seconds_count{"):
			m = count
		default:
			continue
		}
		i := strings.Index(line, `verb="`)
		verb := line[i+len(`verb="`):]
		verb = verb[:strings.IndexByte(verb, '"')]
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		m[verb] += v
	}
	var parts []string
	for verb, n := range count {
		parts = append(parts, fmt.Sprintf("%s %.0f × %.1fms", verb, n, 1000*sum[verb]/max(n, 1)))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// reconcileCounts are controller-runtime's reconcile counts per controller, and the time
// they took ("<controller>/seconds").
type reconcileCounts map[string]float64

func (r reconcileCounts) total() int {
	return int(r["webhookendpoint"] + r["dispatcher"] + r["retrypolicy"])
}

func (r reconcileCounts) String() string {
	avg := func(c string) float64 { return 1000 * r[c+"/seconds"] / max(r[c], 1) }
	return fmt.Sprintf("%.0f endpoint (%.0fms each) + %.0f dispatcher (%.0fms each) + %.0f retrypolicy",
		r["webhookendpoint"], avg("webhookendpoint"), r["dispatcher"], avg("dispatcher"), r["retrypolicy"])
}

// reconciles scrapes controller_runtime_reconcile_total from the controller's /metrics.
func reconciles(b *testing.B, addr string) reconcileCounts {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	out := reconcileCounts{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		suffix := ""
		switch {
		case strings.HasPrefix(line, "controller_runtime_reconcile_total{"):
		case strings.HasPrefix(line, "controller_runtime_reconcile_time_seconds_sum{"):
			suffix = "/seconds"
		default:
			continue
		}
		i := strings.Index(line, `controller="`)
		if i < 0 {
			continue
		}
		name := line[i+len(`controller="`):]
		name = name[:strings.IndexByte(name, '"')]
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			out[name+suffix] += v
		}
	}
	return out
}

// processStats returns a process's peak resident set size (VmHWM), in bytes, and the CPU time
// it has used.
func processStats(b *testing.B, pid int) (int64, time.Duration) {
	b.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	var peak int64
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			peak = kb << 10
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return peak, time.Duration(utime+stime) * time.Second / ticks
}

// countConsumers counts a stream's consumers whose names start with prefix.
// countConsumers counts the consumers whose name starts with prefix on one stream of each
// namespace's set (a namespace without it counts none).
func countConsumers(ctx context.Context, b *testing.B, js jetstream.JetStream, namespaces []string,
	names func(string) streams.NamespaceNames, stream func(streams.NamespaceNames) string, prefix string) int {
	b.Helper()
	n := 0
	for _, ns := range namespaces {
		s, err := js.Stream(ctx, stream(names(ns)))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		list := s.ConsumerNames(ctx)
		for name := range list.Name() {
			if strings.HasPrefix(name, prefix) {
				n++
			}
		}
		if err := list.Err(); err != nil {
			b.Fatal(err)
		}
	}
	return n
}

func parallel[T any](b *testing.B, items []T, workers int, f func(T) error) {
	b.Helper()
	ch := make(chan T)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				if err := f(it); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, it := range items {
		ch <- it
	}
	close(ch)
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

func freeAddr(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
