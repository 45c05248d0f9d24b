package dispatcher_test

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// BenchmarkIdleEndpointMemory measures what a dispatcher keeps for each idle endpoint of the
// shared lane (issue 32's goal: under 4 KiB): the heap in use (after a garbage collection)
// that a dispatcher adds to the test process when it serves n endpoints, less what it adds
// when it serves one, per endpoint added (B/idle-endpoint); the test's own objects are
// measured without a dispatcher and taken out. With WHK_IDLE_HEAP set to a path, the heap
// profile at n endpoints is written there (allocations sampled every 4 KiB):
//
//	WHK_IDLE_HEAP=/tmp/idle.heap go test ./dispatcher -run '^$' -bench IdleEndpointMemory -benchtime 1x
//	go tool pprof -sample_index=inuse_space -top /tmp/idle.heap
func BenchmarkIdleEndpointMemory(b *testing.B) {
	const n = 500
	runtime.MemProfileRate = 4096
	for range b.N {
		e := newEnv(b)
		spec := func(i int) v1alpha1.WebhookEndpointSpec {
			return v1alpha1.WebhookEndpointSpec{URL: fmt.Sprintf("http://127.0.0.1:9/hooks/%04d", i),
				EventTypes: []v1alpha1.EventTypePattern{v1alpha1.EventTypePattern(fmt.Sprintf("idle%04d.>", i))}}
		}
		e.endpoint("idle-0000", spec(0))
		test1 := settledHeap()
		stop := e.dispatcher("d1")
		one := settledHeap() - test1
		stop()
		for i := 1; i < n; i++ {
			e.endpoint(fmt.Sprintf("idle-%04d", i), spec(i))
		}
		testN := settledHeap()
		stop = e.dispatcher("d2")
		all := settledHeap() - testN
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
		b.ReportMetric(float64(all-one)/(n-1), "B/idle-endpoint")
		b.ReportMetric(float64(one)/1024, "KiB/dispatcher-with-one")
	}
}

// settledHeap is the heap in use once it stopped growing for a few seconds (the dispatcher
// has read every endpoint and built its workers).
func settledHeap() int64 {
	var last int64
	steady := 0
	for range 120 {
		time.Sleep(500 * time.Millisecond)
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		now := int64(ms.HeapInuse)
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
