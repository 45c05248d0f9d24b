package harness

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// What the broker may hold for an installation, in durable consumers and streams: the bound
// TestScaleEndpointsSmall asserts. Today every endpoint has a consumer on its namespace's
// events stream and one on its deliveries stream, and every namespace has five streams
// (events, deliveries, delivery log, dead letters, the bucket). The new engine (issue 32) sets
// consumersPerEndpoint to 0: consumers independent of endpoints, at most one per namespace
// and stream.
const (
	consumersPerEndpoint       = 2
	consumersPerNamespace      = 2 // one per stream consumed: events and deliveries
	streamsPerNamespace        = 5
	installationStreams        = 0 // streams of the installation, whatever the namespaces
	installationConsumersFixed = 0 // durable consumers of the installation itself
)

// maxConsumers is the bound on durable consumers of endpoints endpoints in namespaces
// namespaces.
func maxConsumers(endpoints, namespaces int) int {
	return consumersPerEndpoint*endpoints + consumersPerNamespace*namespaces + installationConsumersFixed
}

// TestSELayout: the scenario's endpoints are spread over the namespaces, a tenth of them
// active, with one hot, at least one dead and one slow, each namespace keeping a healthy one.
func TestSELayout(t *testing.T) {
	eps := seLayout(seConfig{Endpoints: 1000, Namespaces: 10, Active: 0.1, Dead: 0.01, Slow: 0.01, HotRate: 1})
	if len(eps) != 1000 {
		t.Fatalf("%d endpoints, want 1000", len(eps))
	}
	per := map[string]int{}
	classes := map[seClass]int{}
	healthyIn := map[string]int{}
	seen := map[string]bool{}
	for _, ep := range eps {
		per[ep.ns]++
		classes[ep.class]++
		if ep.class == seHealthy {
			healthyIn[ep.ns]++
		}
		if seen[ep.name] {
			t.Fatalf("endpoint name %s twice", ep.name)
		}
		seen[ep.name] = true
	}
	if len(per) != 10 {
		t.Fatalf("%d namespaces, want 10", len(per))
	}
	for ns, n := range per {
		if n != 100 {
			t.Errorf("namespace %s has %d endpoints, want 100", ns, n)
		}
		if healthyIn[ns] == 0 {
			t.Errorf("namespace %s has no healthy active endpoint", ns)
		}
	}
	want := map[seClass]int{seIdle: 900, seHealthy: 97, seHot: 1, seDead: 1, seSlow: 1}
	for c, n := range want {
		if classes[c] != n {
			t.Errorf("class %d: %d endpoints, want %d", c, classes[c], n)
		}
	}
	if eps[0].class != seHot {
		t.Errorf("the hot endpoint is %+v, want namespace 0's first", eps[0])
	}
	if got := seLayout(seConfig{Endpoints: 0, Namespaces: 10, Active: 0.1}); len(got) != 0 {
		t.Errorf("no endpoints: %d", len(got))
	}
}

// TestScaleEndpointsSmall is the scale-endpoints scenario reduced to what `make test` can
// afford: 50 endpoints in 2 namespaces on one nats-server, the real controller and the
// dispatchers as processes. It asserts counts and structure only (every endpoint Ready, what
// the broker holds against the bound above, the servers' figures readable), never timings.
func TestScaleEndpointsSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane, nats-server, the controller and dispatchers")
	}
	const endpoints, namespaces = 50, 2
	dir := t.TempDir()
	began := time.Now()
	operator, natsServer, err := buildSE(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("webhook-operator and nats-server built in %s", time.Since(began).Round(100*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began = time.Now()
	res, err := runSE(ctx, seConfig{
		Endpoints: endpoints, Namespaces: namespaces, Servers: 1, Replicas: 1,
		ReadyTimeout: 2 * time.Minute, StopGrace: time.Minute,
		OperatorBinary: operator, NATSBinary: natsServer, Dir: filepath.Join(dir, "install"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("installation started, %d endpoints applied and Ready, figures read and everything stopped in %s", endpoints, time.Since(began).Round(100*time.Millisecond))
	if res.readyCount != endpoints || res.total != endpoints {
		t.Errorf("%d of %d endpoints Ready, want %d", res.readyCount, res.total, endpoints)
	}
	a := res.assets
	if bound := maxConsumers(endpoints, namespaces); a.Durable > bound {
		t.Errorf("%d durable consumers for %d endpoints in %d namespaces, want at most %d", a.Durable, endpoints, namespaces, bound)
	}
	if a.Durable < namespaces {
		t.Errorf("%d durable consumers: the dispatchers of %d namespaces read through none?", a.Durable, namespaces)
	}
	if bound := streamsPerNamespace*namespaces + installationStreams; a.Streams > bound {
		t.Errorf("%d streams for %d namespaces, want at most %d", a.Streams, namespaces, bound)
	}
	if a.ReplicatedStreams+a.ReplicatedConsumers != 0 {
		t.Errorf("one server, R1: %d replicated streams and %d replicated consumers, want none", a.ReplicatedStreams, a.ReplicatedConsumers)
	}
	if len(res.servers) != 1 {
		t.Fatalf("%d servers' figures, want 1", len(res.servers))
	}
	f := res.servers[0]
	if f.rss <= 0 || f.goroutines <= 0 || f.files <= 0 {
		t.Errorf("server figures unread: %+v", f)
	}
	// The server itself holds what the JetStream API lists (its /jsz counts the clients'
	// ephemeral consumers too).
	if f.streams != a.Streams || f.consumers < a.Durable || f.haAssets() != 0 {
		t.Errorf("server n1 holds %d streams and %d consumers (%d replicated); the account has %d streams, %d durable and %d ephemeral consumers",
			f.streams, f.consumers, f.haAssets(), a.Streams, a.Durable, a.Ephemeral)
	}
	if len(res.dispatcherRSS) != namespaces || res.controllerRSS <= 0 {
		t.Errorf("RSS of %d dispatchers (want %d) and of the controller (%d) read", len(res.dispatcherRSS), namespaces, res.controllerRSS)
	}
}
