package cluster

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// upgradeFrom is the earlier version the installation starts at: the last one whose every
// endpoint had consumers of its own (before the shared lane).
var upgradeFrom = flag.String("cluster.upgrade-from", "4cfab78",
	"install this earlier commit's chart and image first (built from git history) and upgrade to the checkout's while events flow; '' installs the checkout's at once")

const (
	// legacy is the namespace whose endpoints the earlier version made.
	legacy = "legacy"
	// tagOld is the earlier version's image tag.
	tagOld = "cluster-old"
	// legacyEvents is how many events each waiting endpoint has (below every threshold that
	// would disable it).
	legacyEvents = 8
)

// packOld builds the earlier version's binary from git history (git archive: the checkout's
// repository is left as it is; a shallow clone's origin is fetched into the test's
// directory), packs it into an image with that version's Dockerfile, loads
// it into the node and returns that version's chart.
func (s *install) packOld(t *testing.T) string {
	t.Helper()
	rev, repo := *upgradeFrom, world.root
	if command("", "git", "-C", repo, "cat-file", "-e", rev+"^{commit}").err != nil {
		// A shallow clone: its origin's history, fetched into a repository of the test's.
		origin := command("", "git", "-C", repo, "remote", "get-url", "origin")
		if origin.err != nil {
			t.Fatalf("-cluster.upgrade-from=%s: no such commit in %s and no origin to fetch it from (pass -cluster.upgrade-from= to install this version at once): %s", rev, repo, origin.stderr)
		}
		repo = filepath.Join(world.dir, "history")
		sh(t, "git", "init", "-q", repo)
		sh(t, "git", "-C", repo, "fetch", "-q", strings.TrimSpace(origin.stdout), "+refs/heads/*:refs/remotes/origin/*")
		if r := command("", "git", "-C", repo, "cat-file", "-e", rev+"^{commit}"); r.err != nil {
			t.Fatalf("-cluster.upgrade-from=%s: no such commit in %s or its origin %s: %s", rev, world.root, strings.TrimSpace(origin.stdout), r.stderr)
		}
	}
	dir := filepath.Join(world.dir, "old")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sh(t, "sh", "-c", fmt.Sprintf("git -C %q archive %q | tar -x -C %q", repo, rev, dir))
	logf(t, "building the earlier version %s from git history", rev)
	bin := filepath.Join(dir, "bin", "webhook-operator")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/webhook-operator/webhook-operator/internal/version.Version="+rev, "-o", bin, "./cmd/webhook-operator")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of %s: %v\n%s", rev, err, out)
	}
	tar := filepath.Join(world.dir, "old.tar")
	sh(t, filepath.Join(world.root, "bin", "pack-image"), "-o", tar, "-tag", imageRepo+":"+tagOld, "-dockerfile", filepath.Join(dir, "Dockerfile"),
		"-build-arg", "VERSION="+rev, "-source", "build:/out/webhook-operator="+bin)
	loadImage(t, tar)
	return filepath.Join(dir, "charts", "webhook-operator")
}

// legacyEndpoint is what the upgrade step reads of an endpoint.
func legacyEndpoint(t *testing.T, name string) v1alpha1.WebhookEndpoint {
	t.Helper()
	var ep v1alpha1.WebhookEndpoint
	kubectlJSON(t, &ep, "-n", legacy, "get", "webhookendpoint", name, "-o", "json")
	return ep
}

// health is an endpoint's counts as its status shows them.
func health(ep v1alpha1.WebhookEndpoint) v1alpha1.DeliveryHealth {
	if ep.Status.Health == nil {
		return v1alpha1.DeliveryHealth{}
	}
	return *ep.Status.Health
}

// upgrade is the installation of the earlier version upgraded with `helm upgrade` while
// events flow: its endpoints (each with consumers of its own) have retries scheduled for
// tomorrow, deliveries held (a suspended endpoint) and dead letters waiting. After the
// upgrade nothing is lost or sent early, the counts are exact, every endpoint is on the shared
// lane and the consumers of its own are deleted once drained.
func (s *install) upgrade(t *testing.T) {
	if s.oldChart == "" {
		t.Skip("installed at this checkout's version (-cluster.upgrade-from='' or -cluster.reuse)")
	}
	s.tenant(t, legacy)
	flowURL, refusingURL := receiver(t, legacy, "flow"), receiver(t, legacy, "refusing")
	respond(t, legacy, "refusing", 503)
	apply(t, fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: tomorrow, namespace: %[1]s}
spec:
  schedule: [0s, 24h]
  circuitBreaker: {consecutiveFailures: 0}
---
apiVersion: webhook-operator.io/v1alpha1
kind: RetryPolicy
metadata: {name: once, namespace: %[1]s}
spec:
  schedule: [0s]
  circuitBreaker: {consecutiveFailures: 0}
`, legacy))
	endpoint(t, legacy, "flow", flowURL, "flow.posted", "")
	endpoint(t, legacy, "later", refusingURL, "later.posted", "  retryPolicyRef: {name: tomorrow}")
	endpoint(t, legacy, "dead", refusingURL, "dead.posted", "  retryPolicyRef: {name: once}")
	// Suspended: not Ready (reason Suspended), its consumers made.
	apply(t, fmt.Sprintf(`
apiVersion: webhook-operator.io/v1alpha1
kind: WebhookEndpoint
metadata: {name: paused, namespace: %s}
spec:
  url: %s
  eventTypes: [paused.posted]
  suspend: true
  signing: {secretRef: {name: signing, key: secret}}
  tls: {caBundleSecretRef: {name: receiver-ca, key: ca.crt}}
`, legacy, flowURL))
	eventually(t, 3*time.Minute, "the earlier version's endpoints, each with a consumer of its own", func() error {
		for _, name := range []string{"flow", "later", "dead", "paused"} {
			if ep := legacyEndpoint(t, name); ep.Status.Lane != "" || ep.Status.ConsumerName == "" {
				return fmt.Errorf("endpoint %s: lane %q, consumer %q: want no lane and a consumer of its own", name, ep.Status.Lane, ep.Status.ConsumerName)
			}
		}
		return nil
	})

	// What waits when the upgrade comes: retries due tomorrow, dead letters, held events.
	prefix := runID + "-legacy"
	for _, typ := range []string{"later", "dead", "paused"} {
		produce(t, legacy, "p-"+typ, typ+".posted", prefix+"-"+typ, legacyEvents, 20)
	}
	eventually(t, 3*time.Minute, "the earlier version's first attempts, dead letters and held events", func() error {
		st, err := receipts(legacy, "refusing")
		if err != nil {
			return err
		}
		later, dead, paused := health(legacyEndpoint(t, "later")), health(legacyEndpoint(t, "dead")), health(legacyEndpoint(t, "paused"))
		if st.Stats.Requests != 2*legacyEvents || later.Failures != legacyEvents || later.Pending != legacyEvents ||
			dead.DeadLettered != legacyEvents || paused.Pending != legacyEvents {
			return fmt.Errorf("refused %d requests (want %d); later: failures %d pending %d; dead: dead-lettered %d; paused: pending %d (want %d each)",
				st.Stats.Requests, 2*legacyEvents, later.Failures, later.Pending, dead.DeadLettered, paused.Pending, legacyEvents)
		}
		return nil
	})

	// The upgrade, while a producer publishes.
	const flowing, rate = 600, 20
	startProducer(t, legacy, "p-flow", "flow.posted", prefix+"-flow", flowing, rate)
	time.Sleep(5 * time.Second) // events flow before the upgrade starts
	logf(t, "helm upgrade %s from %s to this checkout's chart (image %s:%s) while events flow", release, *upgradeFrom, imageRepo, tagA)
	sh(t, "helm", append([]string{"upgrade", release, "charts/webhook-operator", "--namespace", operatorNS, "--wait", "--timeout", "5m"}, s.values(tagA)...)...)
	kubectl(t, "-n", operatorNS, "wait", "--for=condition=Available", "deployment", "-l", "app.kubernetes.io/name=webhook-operator", "--timeout=3m")
	p := waitProducer(t, legacy, "p-flow", 5*time.Minute)
	if p.Published != flowing || len(p.Unacked) > 0 {
		t.Fatalf("the producer published %d of %d events (unacknowledged: %v)", p.Published, flowing, p.Unacked)
	}

	// Nothing lost, nothing sent twice but what the earlier version's dispatcher may have had
	// in flight as the rollout stopped it (at-least-once); every endpoint on the shared lane,
	// its own consumers drained and deleted. An endpoint joins the shared lane only once its
	// dispatcher has rolled out: before that fix, runs counted up to 86 of 600 sent twice.
	st := waitReceived(t, legacy, "flow", ids(prefix+"-flow", flowing), 5*time.Minute)
	dups := 0
	for _, r := range st.Receipts {
		dups += r.Count - 1
	}
	logf(t, "%d of %d events sent twice across the upgrade", dups, flowing)
	if dups > int(v1alpha1.DefaultMaxInFlight) {
		t.Errorf("%d duplicate deliveries across the upgrade, more than the %d a dispatcher stopped by the rollout may have had in flight", dups, v1alpha1.DefaultMaxInFlight)
	}
	onShared := func(names ...string) {
		eventually(t, 3*time.Minute, "endpoints "+strings.Join(names, ", ")+" on the shared lane with no consumer of their own", func() error {
			for _, name := range names {
				ep := legacyEndpoint(t, name)
				if ep.Status.Lane != streams.LaneShared.String() || len(ep.Status.DrainingConsumers) > 0 {
					return fmt.Errorf("%s: lane %q, draining %v", name, ep.Status.Lane, ep.Status.DrainingConsumers)
				}
			}
			return nil
		})
	}
	onShared("flow", "later", "dead")

	// The held events are delivered when the endpoint resumes, once each.
	kubectl(t, "-n", legacy, "patch", "webhookendpoint", "paused", "--type=merge", "-p", `{"spec":{"suspend":false}}`)
	pausedIDs := ids(prefix+"-paused", legacyEvents)
	st = waitReceived(t, legacy, "flow", pausedIDs, 3*time.Minute)
	for _, id := range pausedIDs {
		if n := st.Receipts[id].Count; n != 1 {
			t.Errorf("held event %s delivered %d times after the endpoint resumed", id, n)
		}
	}
	onShared("paused")

	// Nothing sent early: tomorrow's retries still wait, and the counts are exact.
	eventually(t, 2*time.Minute, "exact counts after the upgrade", func() error {
		flow, later, dead, paused := health(legacyEndpoint(t, "flow")), health(legacyEndpoint(t, "later")), health(legacyEndpoint(t, "dead")), health(legacyEndpoint(t, "paused"))
		// Each delivery is counted, one sent twice too: as many as the receiver accepted.
		fr, err := receipts(legacy, "flow")
		if err != nil {
			return err
		}
		accepted := 0
		for _, id := range ids(prefix+"-flow", flowing) {
			accepted += fr.Receipts[id].Count
		}
		if flow.Delivered != int64(accepted) || flow.Pending != 0 || flow.Failures != 0 ||
			later.Failures != legacyEvents || later.Pending != legacyEvents || later.Delivered != 0 ||
			dead.DeadLettered != legacyEvents || dead.Pending != 0 ||
			paused.Delivered != legacyEvents || paused.Pending != 0 {
			return fmt.Errorf("flow %+v (the receiver accepted %d); later %+v; dead %+v; paused %+v", counts(flow), accepted, counts(later), counts(dead), counts(paused))
		}
		return nil
	})
	rs, err := receipts(legacy, "refusing")
	if err != nil {
		t.Fatal(err)
	}
	if rs.Stats.Requests != 2*legacyEvents {
		t.Errorf("the refusing receiver got %d requests, want the %d first attempts only: a retry due tomorrow was sent early", rs.Stats.Requests, 2*legacyEvents)
	}
	if left := ownConsumers(t); len(left) > 0 {
		t.Errorf("consumers of the earlier version's endpoints left: %v", left)
	}
	// Deleted, the endpoint's retries (moved onto the shared lane's schedules) are
	// dead-lettered and its finalizer lets it go.
	before := health(legacyEndpoint(t, "dead")).DeadLettered
	kubectl(t, "-n", legacy, "delete", "webhookendpoint", "later", "--wait=true", "--timeout=2m")
	if rs, err := receipts(legacy, "refusing"); err != nil || rs.Stats.Requests != 2*legacyEvents {
		t.Errorf("after deleting the endpoint the refusing receiver got %d requests (%v), want %d", rs.Stats.Requests, err, 2*legacyEvents)
	}
	if after := health(legacyEndpoint(t, "dead")).DeadLettered; after != before {
		t.Errorf("deleting another endpoint changed dead's dead-lettered count from %d to %d", before, after)
	}
	// As a user reads them: the data API's dead letters of the deleted endpoint.
	eventually(t, time.Minute, "the deleted endpoint's retries among the namespace's dead letters", func() error {
		r := command("", "kubectl", "-n", legacy, "get", "webhookdeadletters", "--field-selector", "spec.endpoint=later,status.reason=endpoint_deleted", "-o", "name")
		if r.err != nil {
			return fmt.Errorf("%v: %s", r.err, r.stderr)
		}
		if n := len(strings.Fields(r.stdout)); n != legacyEvents {
			return fmt.Errorf("%d dead letters of later with reason endpoint_deleted, want %d", n, legacyEvents)
		}
		return nil
	})
	logf(t, "upgrade from %s while events flowed: %d events delivered (%d sent twice), %d retries still due tomorrow (dead-lettered when their endpoint was deleted), %d dead letters and %d held events (delivered once on resume) counted exactly; every endpoint on the shared lane, no consumer of its own left",
		*upgradeFrom, flowing, dups, legacyEvents, legacyEvents, legacyEvents)
}

// counts is what an error message shows of an endpoint's health.
func counts(h v1alpha1.DeliveryHealth) string {
	return fmt.Sprintf("{attempts %d failures %d delivered %d dead-lettered %d pending %d}", h.Attempts, h.Failures, h.Delivered, h.DeadLettered, h.Pending)
}

// ownConsumers are the consumers on the NATS servers that belong to an endpoint of the
// legacy namespace alone.
func ownConsumers(t *testing.T) []string {
	t.Helper()
	b, err := rawGet("/api/v1/namespaces/nats/services/http:nats:8222/proxy/jsz?accounts=true&streams=true&consumers=true")
	if err != nil {
		t.Fatal(err)
	}
	var jsz struct {
		Accounts []struct {
			Streams []struct {
				Name      string `json:"name"`
				Consumers []struct {
					Name string `json:"name"`
				} `json:"consumer_detail"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := json.Unmarshal(b, &jsz); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range jsz.Accounts {
		for _, s := range a.Streams {
			for _, c := range s.Consumers {
				for _, name := range []string{"flow", "later", "dead", "paused"} {
					if c.Name == streams.EndpointConsumerOf(legacy, name) {
						out = append(out, s.Name+"/"+c.Name)
					}
				}
			}
		}
	}
	return out
}
