package ingress_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// BenchmarkPublishJSON is one JSON event's POST through the ingress to an acknowledged
// JetStream publish (authorization cached), from parallel clients: the CPU the ingress spends
// per event, to profile with -cpuprofile. `make bench` measures it against its baselines.
func BenchmarkPublishJSON(b *testing.B) {
	w := newWorld(b, nil)
	tok := producer(b, "a", "bench", true)
	data := `{"order_id":"ord_1001","total":42.5,"note":"` + strings.Repeat("x", 800) + `"}`
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	cl := &http.Client{Transport: tr}
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := fmt.Sprintf(`{"id":"evt_%d","type":"bench.created","data":%s}`, n.Add(1), data)
			req, _ := http.NewRequest(http.MethodPost, w.url+"/v1/namespaces/a/events", bytes.NewReader([]byte(body)))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			resp, err := cl.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}
