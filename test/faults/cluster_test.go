package faults

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/localstack"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// clusterEnv is the installation of the cluster scenarios: three nats-server processes
// clustered on loopback, and a local stack of its own (control plane, controller with
// --stream-replicas=3, dispatchers) whose controller, dispatchers, plugin and producers are
// given every node's URL, as an installation on an existing NATS cluster is.
type clusterEnv struct {
	nats  *testenv.NATSCluster
	stack *localstack.Stack
}

var (
	clusterOnce sync.Once
	clusterE    *clusterEnv
	clusterErr  error
)

// clusterStack starts the cluster scenarios' installation the first time a test asks for it;
// the suite stops it at the end.
func clusterStack(t *testing.T) *clusterEnv {
	t.Helper()
	clusterOnce.Do(func() { clusterE, clusterErr = startClusterEnv() })
	if clusterErr != nil {
		t.Fatalf("starting the NATS cluster and its stack: %v", clusterErr)
	}
	return clusterE
}

// clusterName is the name of the fault suite's NATS cluster; every node has the tag clusterTag.
const (
	clusterName = "faults"
	clusterTag  = "webhook-operator"
)

func startClusterEnv() (*clusterEnv, error) {
	dir := filepath.Join(suiteDir, "cluster")
	clogf := func(format string, args ...any) { logf("cluster: "+format, args...) }
	// The installation's auth callout and TLS on every node, and the leaf node's site: a
	// producer of namespace faults-leaf (TestNATSLeafNode).
	auth, err := testenv.NewNATSAuth(streams.DefaultNames())
	if err != nil {
		return nil, err
	}
	if err := auth.WithTLS(filepath.Join(dir, "tls")); err != nil {
		return nil, err
	}
	auth.Config.LeafSites = []natsauth.LeafSite{{Name: "branch", Namespace: leafNamespace, User: "leaf-branch", Password: auth.Keys.AdminPassword + "-leaf"}}
	nc, err := testenv.StartNATSCluster(testenv.NATSClusterOptions{Binary: filepath.Join(binDir, "nats-server"), Dir: filepath.Join(dir, "nats"),
		Size: 3, Auth: auth, Name: clusterName, Tag: clusterTag, Logf: clogf})
	if err != nil {
		return nil, err
	}
	st, err := localstack.Start(context.Background(), localstack.Options{
		Dir:      dir,
		Binary:   filepath.Join(binDir, "webhook-operator"),
		NATSURL:  nc.URLs(),
		NATSAuth: auth,
		// Every stream and the bucket with three replicas, one on each node of the tag.
		ControllerArgs: []string{"--allow-http", "--allowed-cidrs=127.0.0.0/8", "--stream-replicas=3", "--stream-placement-tags=" + clusterTag},
		Logf:           clogf,
		Grace:          5 * time.Second,
	})
	if err != nil {
		nc.Stop()
		return nil, err
	}
	return &clusterEnv{nats: nc, stack: st}, nil
}

// stopClusterEnv stops the cluster scenarios' installation if a test started it.
func stopClusterEnv() {
	if clusterE == nil {
		return
	}
	if err := clusterE.stack.Stop(); err != nil {
		logf("cluster: stopping the stack: %v", err)
	}
	clusterE.nats.Stop()
}

// TestNATSCluster: three nats-server processes in a cluster, every stream and the bucket with
// three replicas. While events are published and delivered, the leader of the namespace's
// events stream (endpoints take their deliveries from it) is killed with SIGKILL, started
// again and waited for until the cluster is whole (every replica current); then another node
// is killed and started the same way. Never are two nodes down at once, so JetStream keeps a quorum: nothing may be missing, and
// duplicates are bounded by what at-least-once allows (the deliveries outstanding at each
// kill, at most the endpoint's maxInFlight: their acknowledgements may be lost).
func TestNATSCluster(t *testing.T) {
	n, rate, rounds, down := 1500, 75, 1, 2*time.Second
	if *full {
		n, rate, rounds, down = 10000, 150, 2, 5*time.Second
	}
	const maxInFlight = 20
	env := clusterStack(t)
	tn := newTenantOn(t, env.stack, "faults-cluster")
	rcv, err := newReceiver(tn.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	// A little slow and failing now and then, so deliveries are in flight and retries wait as
	// message schedules when a node dies.
	rcv.SetResponder(testenv.Misbehave(testenv.Behaviour{MaxLatency: 20 * time.Millisecond, FailRatio: 0.05}))
	tn.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: patient}
spec:
  schedule: [0s, 1s, 2s, 5s, 10s, 20s]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: ledger}
spec:
  url: %s
  eventTypes: [ledger.>]
  timeout: 2s
  maxInFlight: %d
  retryPolicyRef: {name: patient}
  signing: {secretRef: {name: signing, key: secret}}
  dispatcher: {dedicated: true, replicas: 2}
`, rcv.URL(), maxInFlight))
	tn.waitCondition("ledger", v1alpha1.ConditionReady, "True", 2*time.Minute)

	set := streams.DefaultConfig().For(tn.ns)
	eventsStream := set.EventsStream()
	if err := checkReplicas(context.Background(), env.nats, append(set.Streams(), "KV_"+set.Bucket()), 3); err != nil {
		t.Fatal(err)
	}

	prod, ctx := startProducer(t, tn)
	began := time.Now()
	run := time.Duration(n) * time.Second / time.Duration(rate)
	var kills []string
	faults := make(chan error, 1)
	go func() {
		for r := range rounds {
			// Each round starts at its share of the publishing run.
			time.Sleep(time.Until(began.Add(run * time.Duration(2*r+1) / time.Duration(2*rounds+1)))) // pacing
			// First the events stream's leader, then another node: the stream's new leader.
			first, err := env.nats.StreamLeader(ctx, eventsStream)
			if err != nil {
				faults <- err
				return
			}
			for i := range 2 {
				name := first
				if i == 1 {
					if name, err = env.nats.StreamLeader(ctx, eventsStream); err != nil {
						faults <- err
						return
					}
					if name == first {
						name = env.nats.Other(first).Name
					}
				}
				what, err := crash(ctx, env.nats, name, eventsStream, down)
				kills = append(kills, what)
				if err != nil {
					faults <- err
					return
				}
				time.Sleep(2 * time.Second) // the cluster runs whole for a while
			}
		}
		faults <- nil
	}()
	if err := prod.publish(ctx, tn.ns, events("cluster", "ledger.posted", n), rate); err != nil {
		t.Fatal(err)
	}
	if err := <-faults; err != nil {
		t.Fatalf("killing nodes of the cluster (%s): %v", strings.Join(kills, "; "), err)
	}
	f, err := settle(ctx, "NATS cluster, node kills", tn, prod.publishedAt(), time.Minute, 3*time.Minute, rcv)
	if err != nil {
		t.Fatal(err)
	}
	f.RunTime = time.Since(began)
	health := tn.settledHealth("ledger")
	f.Faults = fmt.Sprintf("3 nodes, R3 streams and bucket; %s; %d requests, %d refused (5%% fail on purpose); the producer retried %d publishes; endpoint status: %s",
		strings.Join(kills, "; "), rcv.Stats().Requests, rcv.Stats().Refused, prod.retries.Load(), health)
	check(t, f)
	explainMissing(ctx, t, tn, "ledger", f.MissingIDs, rcv)
	// Exact: an outcome whose acknowledgement a kill lost is settled from the log, and a log
	// message a new leader stored twice is counted once.
	checkHealthCounts(t, tn, "ledger", rcv, f, time.Minute)
	checkDeadLetterReasons(ctx, t, tn)
	if bound := len(kills) * maxInFlight; f.Duplicates > bound {
		t.Errorf("%d duplicates after %d node kills: at-least-once allows at most the %d deliveries outstanding at each kill (maxInFlight %d), %d in all",
			f.Duplicates, len(kills), maxInFlight, maxInFlight, bound)
	}
}

// crash kills node name of c with SIGKILL, starts it again after down and waits until the
// cluster is whole; it says what it did. stream names the stream whose leadership it reports.
func crash(ctx context.Context, c *testenv.NATSCluster, name, stream string, down time.Duration) (string, error) {
	n, err := c.Node(name)
	if err != nil {
		return "", err
	}
	var roles []string
	if leader, err := c.StreamLeader(ctx, stream); err == nil && leader == name {
		roles = append(roles, "leader of "+stream)
	}
	if meta, err := c.MetaLeader(); err == nil && meta == name {
		roles = append(roles, "meta leader")
	}
	what := name
	if len(roles) > 0 {
		what += " (" + strings.Join(roles, ", ") + ")"
	}
	n.Kill()
	killed := time.Now()
	time.Sleep(down) // the outage
	if err := n.Start(); err != nil {
		return what + " SIGKILLed, not restarted", err
	}
	if err := c.WaitCurrent(ctx, 3*time.Minute); err != nil {
		return what + " SIGKILLed and restarted, not current", err
	}
	return fmt.Sprintf("%s SIGKILLed, whole again after %s", what, time.Since(killed).Round(100*time.Millisecond)), nil
}

// checkReplicas checks that every stream named has replicas replicas, placed on the nodes of
// the cluster's tag.
func checkReplicas(ctx context.Context, c *testenv.NATSCluster, names []string, replicas int) error {
	nc, js, err := c.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		cfg := s.CachedInfo().Config
		if cfg.Replicas != replicas {
			return fmt.Errorf("stream %s has %d replicas, want %d (--stream-replicas)", name, cfg.Replicas, replicas)
		}
		if cfg.Placement == nil || !slices.Equal(cfg.Placement.Tags, []string{clusterTag}) {
			return fmt.Errorf("stream %s is placed %+v, want on the tag %s (--stream-placement-tags)", name, cfg.Placement, clusterTag)
		}
	}
	return nil
}

// settledHealth waits (a bounded while) until the endpoint's status reports nothing pending
// and says what it counts.
func (tn *tenant) settledHealth(name string) string {
	var h *v1alpha1.DeliveryHealth
	err := testenv.Poll(time.Minute, func() error {
		ep, err := tn.endpoint(name)
		if err != nil {
			return err
		}
		h = ep.Status.Health
		if h == nil || h.Pending > 0 {
			return fmt.Errorf("health %+v", h)
		}
		return nil
	})
	if h == nil {
		return "no health reported"
	}
	settled := ""
	if err != nil {
		settled = " (still pending after a minute)"
	}
	return fmt.Sprintf("attempts %d, failures %d, delivered %d, dead-lettered %d, pending %d%s, success rate %s",
		h.Attempts, h.Failures, h.Delivered, h.DeadLettered, h.Pending, settled, h.SuccessRate)
}

// checkDeadLetterReasons fails the test for a dead letter of the tenant's without a reason.
func checkDeadLetterReasons(ctx context.Context, t *testing.T, tn *tenant) {
	t.Helper()
	dls, err := readDeadLetters(ctx, tn)
	if err != nil {
		t.Fatal(err)
	}
	for _, dl := range dls {
		if dl.Reason == "" {
			t.Errorf("dead letter of event %s (delivery %s) has no reason", dl.EventID, dl.DeliveryID)
		}
	}
}

// TestNATSLeafNode: a tenant's producer lives elsewhere, behind a leaf node (a nats-server
// without JetStream whose remote lists every node of the cluster), as a team's own NATS at
// another site would be. It publishes its events through the leaf node; the cluster's
// JetStream stores and acknowledges them through the leaf connection, and the operator, on
// the cluster, delivers every one. The JetStream API itself does not answer through such a
// leaf node (no JetStream domain is configured, and the operator uses none), so what needs it
// (the controller, the dispatchers, kubectl webhooks) connects to the cluster.
// leafNamespace is the namespace the leaf node's site produces for.
const leafNamespace = "faults-leaf"

func TestNATSLeafNode(t *testing.T) {
	n, rate := 300, 100
	if *full {
		n, rate = 2000, 200
	}
	env := clusterStack(t)
	leaf, err := env.nats.StartLeaf()
	if err != nil {
		t.Fatal(err)
	}
	defer leaf.Stop()
	tn := newTenantOn(t, env.stack, leafNamespace)
	rcv, err := newReceiver(tn.secret)
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	tn.apply(fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: branch}
spec:
  url: %s
  eventTypes: [sale.*]
  signing: {secretRef: {name: signing, key: secret}}
`, rcv.URL()))
	tn.waitCondition("branch", v1alpha1.ConditionReady, "True", 2*time.Minute)

	nc, err := nats.Connect(leaf.URL(), nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ictx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ictx); !errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		t.Errorf("the JetStream API through the leaf node: %v, want %v (docs/scaling.md: what works through a leaf node)", err, jetstream.ErrJetStreamNotEnabled)
	}

	prod, ctx := startProducerAt(t, leaf.URL())
	began := time.Now()
	if err := prod.publish(ctx, tn.ns, events("leaf", "sale.closed", n), rate); err != nil {
		t.Fatal(err)
	}
	f, err := settle(ctx, "NATS leaf node producer", tn, prod.publishedAt(), time.Minute, 3*time.Minute, rcv)
	if err != nil {
		t.Fatal(err)
	}
	f.RunTime = time.Since(began)
	f.Faults = fmt.Sprintf("none: the producer publishes through a leaf node (no JetStream of its own) connected to the 3-node cluster; the producer retried %d publishes",
		prod.retries.Load())
	check(t, f)
	checkHealthCounts(t, tn, "branch", rcv, f, time.Minute)
}
