package dispatcher_test

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// A flood of 1 MiB events to a slow receiver with room for 500 requests in flight keeps the
// dispatcher's resident memory under the chart's 256 MiB limit: the byte budget holds the
// rest back in the stream.
func TestFloodOfLargeEventsStaysUnderTheMemoryLimit(t *testing.T) {
	e := newEnv(t)
	kubeconfig, err := cp.WriteKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var inflight atomic.Int64
	rcv := newReceiver(t, func(h testenv.Request) testenv.Response {
		inflight.Add(1)
		defer inflight.Add(-1)
		time.Sleep(time.Second)
		return testenv.Response{Status: 200}
	})
	e.endpoint("bulk", v1alpha1.WebhookEndpointSpec{URL: rcv.URL(), MaxInFlight: ptr[int32](500), Timeout: dur(30 * time.Second)})
	const n = 110 // within the events stream's default bound (128 MiB)
	body := bytes.Repeat([]byte("x"), 1<<20-4096)
	for i := range n {
		e.publish("bulk.created", fmt.Sprintf("evt_%04d", i), body)
	}
	p := e.process("p1", kubeconfig)
	var peak int64
	testenv.Eventually(t, 3*time.Minute, func() bool {
		peak = max(peak, rssOf(p.Process.Pid))
		return len(rcv.RequestsByID()) == n
	}, "delivered %d of %d%v", lazyN(func() int { return len(rcv.RequestsByID()) }), n, lazy(e.dump))
	const limit = 256 << 20
	t.Logf("peak RSS %d MiB while delivering %d events of 1 MiB", peak>>20, n)
	if peak > limit {
		t.Errorf("peak RSS %d MiB, over the chart's 256 MiB limit", peak>>20)
	}
}

// rssOf reads a process's resident set size in bytes (0 when unreadable).
func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
