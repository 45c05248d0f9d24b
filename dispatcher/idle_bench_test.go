package dispatcher_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// BenchmarkIdleEndpointMemory measures what a dispatcher keeps for each idle endpoint of the
// shared lane (issue 32's goal: under 4 KiB): the live heap that a dispatcher adds to the test
// process when it serves n endpoints, less what it adds when it serves one, per endpoint added;
// the test's own objects are measured without a dispatcher and taken out. Two figures:
//   - B/idle-endpoint-dispatcher: what a dispatcher's own process holds. The test process also
//     runs the nats-server and the auth callout the dispatcher talks to (pods of their own in
//     an installation): what the heap profile says they allocated (a frame of nats-server or of
//     internal/natsauth in the allocation's stack) is left out. The profile samples every 512
//     bytes, so this figure is an estimate (within a few percent at 500 endpoints).
//   - B/idle-endpoint: the whole process's live heap (HeapAlloc after a garbage collection: the
//     heap in use with its spans' free room, varied by a few KiB per endpoint from run to run),
//     the broker's share of the dispatcher's requests (its subject cache, the callout
//     account's response imports) included.
//
// Both are read once the Secrets read at the start are no longer kept (SecretsHold after it).
// With WHK_IDLE_HEAP set to a path, the heap profile at n endpoints is written there. Each
// endpoint carries the status the controller writes on a Ready endpoint (controllerStatus):
//
//	WHK_IDLE_HEAP=/tmp/idle.heap go test ./dispatcher -run '^$' -bench IdleEndpointMemory -benchtime 1x
//	go tool pprof -sample_index=inuse_space -top /tmp/idle.heap
func BenchmarkIdleEndpointMemory(b *testing.B) {
	const n = 500
	runtime.MemProfileRate = 512
	for range b.N {
		e := newEnv(b)
		spec := func(i int) v1alpha1.WebhookEndpointSpec {
			return v1alpha1.WebhookEndpointSpec{URL: fmt.Sprintf("http://127.0.0.1:9/hooks/%04d", i),
				EventTypes: []v1alpha1.EventTypePattern{v1alpha1.EventTypePattern(fmt.Sprintf("idle%04d.>", i))}}
		}
		e.endpoint("idle-0000", spec(0))
		e.controllerStatus("idle-0000")
		test1, own1 := settledHeap(), ownHeap()
		stop := e.dispatcher("d1")
		one, oneOwn := settledHeap()-test1, ownHeap()-own1
		stop()
		for i := 1; i < n; i++ {
			e.endpoint(fmt.Sprintf("idle-%04d", i), spec(i))
			e.controllerStatus(fmt.Sprintf("idle-%04d", i))
		}
		testN, ownN := settledHeap(), ownHeap()
		stop = e.dispatcher("d2")
		// An idle endpoint's Secrets are kept only for the resolves that follow a change.
		time.Sleep(dispatcher.SecretsHold + 5*time.Second)
		all, allOwn := settledHeap()-testN, ownHeap()-ownN
		if path := os.Getenv("WHK_IDLE_HEAP"); path != "" {
			f, err := os.Create(path)
			if err != nil {
				b.Fatal(err)
			}
			runtime.GC()
			_ = pprof.WriteHeapProfile(f)
			_ = f.Close()
		}
		stop()
		b.ReportMetric(float64(allOwn-oneOwn)/(n-1), "B/idle-endpoint-dispatcher")
		b.ReportMetric(float64(all-one)/(n-1), "B/idle-endpoint")
		b.ReportMetric(float64(oneOwn)/1024, "KiB/dispatcher-with-one")
	}
}

// settledHeap is the live heap once it stopped growing for a few seconds (the dispatcher
// has read every endpoint and built its workers).
func settledHeap() int64 {
	var last int64
	steady := 0
	for range 120 {
		time.Sleep(500 * time.Millisecond)
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		now := int64(ms.HeapAlloc)
		if d := now - last; d < 64<<10 && d > -(64<<10) {
			steady++
			if steady >= 6 {
				return now
			}
		} else {
			steady = 0
		}
		last = now
	}
	return last
}

// ownHeap is the live heap the memory profile attributes to anything but the broker and the
// auth callout the test process runs for the dispatcher (a frame of nats-server or of
// internal/natsauth in the allocation's stack), as of a garbage collection run now: each
// sampled record scaled as pprof scales it.
func ownHeap() int64 {
	runtime.GC()
	runtime.GC() // the profile is published a cycle late
	var recs []runtime.MemProfileRecord
	for {
		n, ok := runtime.MemProfile(recs, true)
		if ok {
			recs = recs[:n]
			break
		}
		recs = make([]runtime.MemProfileRecord, n+64)
	}
	rate := float64(runtime.MemProfileRate)
	var total float64
	for i := range recs {
		r := &recs[i]
		bytes, objects := r.InUseBytes(), r.InUseObjects()
		if bytes <= 0 || objects <= 0 || broker(r.Stack()) {
			continue
		}
		avg := float64(bytes) / float64(objects)
		total += float64(bytes) / (1 - math.Exp(-avg/rate))
	}
	return int64(total)
}

// broker reports whether a stack allocates for the nats-server or the auth callout.
func broker(stk []uintptr) bool {
	frames := runtime.CallersFrames(stk)
	for {
		f, more := frames.Next()
		if strings.Contains(f.Function, "nats-io/nats-server/") || strings.Contains(f.Function, "/internal/natsauth.") {
			return true
		}
		if !more {
			return false
		}
	}
}

// controllerStatus writes on endpoint name the status the controller writes on a Ready
// endpoint of the shared lane (its names, its dispatcher, the Ready and StorageLimitReached
// conditions and their messages), as in an installation.
func (e *env) controllerStatus(name string) {
	e.t.Helper()
	ctx := context.Background()
	ep := e.get(name)
	patch := client.MergeFrom(ep.DeepCopy())
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	st := &ep.Status
	st.ObservedGeneration = ep.Generation
	st.SigningSecretName, st.SecretsVersion, st.RetryPolicyName = names.SigningSecret(name), "3f2a9c41d07be615", "default"
	st.DeliverySubject, st.ConsumerName = e.set.DeliverySubject(name), streams.IntakeConsumer(e.ns)
	st.Lane = streams.LaneShared.String()
	st.Dispatcher = &v1alpha1.DispatcherStatus{Name: names.SharedDispatcher, Replicas: 2, AvailableReplicas: 2}
	st.Conditions = []metav1.Condition{
		{Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReady, ObservedGeneration: ep.Generation, LastTransitionTime: now,
			Message: fmt.Sprintf("consumer %s delivers %s through Deployment %s (2/2 available)", st.ConsumerName, st.DeliverySubject, st.Dispatcher.Name)},
		{Type: v1alpha1.ConditionStorageLimitReached, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonWithinLimits, ObservedGeneration: ep.Generation, LastTransitionTime: now,
			Message: fmt.Sprintf("dead-letter stream %s (limit 1.0 GiB), deliveries stream %s (limit 1.0 GiB) and delivery log %s (limit 1.0 GiB) have room",
				e.set.DeadLetterStream(), e.set.DeliveriesStream(), e.set.AttemptsStream())},
	}
	if err := e.k8s.Status().Patch(ctx, ep, patch); err != nil {
		e.t.Fatal(err)
	}
}

// BenchmarkIdleNamespaceMemory measures what one more namespace costs a process that serves
// many (issue 33's shared dispatchers): the live heap that k dispatchers of k namespaces of 10
// idle endpoints each add to the test process, less what one adds, per namespace added, as
// B/idle-namespace-dispatcher (the broker's and the auth callout's allocations left out, as in
// BenchmarkIdleEndpointMemory) and B/idle-namespace (the whole heap). Each namespace's
// dispatcher holds its own NATS connection, informers and stages, as it does in a pod of its
// own, where the Go runtime and the process come on top (about 70 MiB RSS a pod):
//
//	go test ./dispatcher -run '^$' -bench IdleNamespaceMemory -benchtime 1x
func BenchmarkIdleNamespaceMemory(b *testing.B) {
	const k, perNamespace = 20, 10
	runtime.MemProfileRate = 512
	for range b.N {
		root := newEnv(b)
		envs := []*env{root}
		for range k - 1 {
			envs = append(envs, root.sibling())
		}
		for j, e := range envs {
			for i := range perNamespace {
				name := fmt.Sprintf("idle-%02d-%02d", j, i)
				e.endpoint(name, v1alpha1.WebhookEndpointSpec{URL: fmt.Sprintf("http://127.0.0.1:9/hooks/%s", name),
					EventTypes: []v1alpha1.EventTypePattern{v1alpha1.EventTypePattern(fmt.Sprintf("idle%02d%02d.>", j, i))}})
				e.controllerStatus(name)
			}
		}
		base, baseOwn := settledHeap(), ownHeap()
		envs[0].dispatcher("ns-0")
		time.Sleep(dispatcher.SecretsHold + 5*time.Second)
		one, oneOwn := settledHeap()-base, ownHeap()-baseOwn
		for j, e := range envs[1:] {
			e.dispatcher(fmt.Sprintf("ns-%d", j+1))
		}
		time.Sleep(dispatcher.SecretsHold + 5*time.Second)
		all, allOwn := settledHeap()-base, ownHeap()-baseOwn
		b.ReportMetric(float64(allOwn-oneOwn)/(k-1), "B/idle-namespace-dispatcher")
		b.ReportMetric(float64(all-one)/(k-1), "B/idle-namespace")
		b.ReportMetric(float64(oneOwn)/1024, "KiB/first-namespace-dispatcher")
		b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
	}
}
