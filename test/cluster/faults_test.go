package cluster

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// figures account for one fault's events: every event the producer got acknowledged was
// received or dead-lettered; none is missing.
type figures struct {
	Fault                                    string
	Sent, Received, Duplicates, DeadLettered int
	Missing                                  int
	missingIDs                               []string
}

func (f figures) String() string {
	return fmt.Sprintf("%-46s sent %4d  received %4d  duplicates %3d  dead-lettered %2d  missing %d",
		f.Fault, f.Sent, f.Received, f.Duplicates, f.DeadLettered, f.Missing)
}

// faultEvents: how many events each fault's producer publishes, and how fast.
const (
	faultEvents = 400
	faultRate   = 20.0
)

// duringStream publishes faultEvents to the orders endpoint, does fault once some have been
// delivered, and accounts for every event.
func (s *install) duringStream(t *testing.T, pl *plugin, name, prefix string, fault func(t *testing.T)) figures {
	t.Helper()
	prefix = runID + prefix
	want := ids(prefix, faultEvents)
	startProducer(t, shop, "producer-"+prefix, "order.created", prefix, faultEvents, faultRate)
	eventually(t, 3*time.Minute, "the first deliveries of "+prefix, func() error {
		st, err := receipts(shop, "orders")
		if err != nil {
			return err
		}
		n := 0
		for _, id := range want[:faultEvents/4] {
			if st.Receipts[id].Count > 0 {
				n++
			}
		}
		if n < 20 {
			return fmt.Errorf("%d delivered so far", n)
		}
		return nil
	})
	logf(t, "%s: mid-stream, doing it", name)
	fault(t)
	p := waitProducer(t, shop, "producer-"+prefix, 10*time.Minute)
	f := figures{Fault: name, Sent: p.Published}
	unacked := map[string]bool{}
	for _, id := range p.Unacked {
		unacked[id] = true
	}
	var sent []string
	for _, id := range want {
		if !unacked[id] {
			sent = append(sent, id)
		}
	}
	// Everything arrives or is dead-lettered: wait for that, bounded, and account for what
	// is there either way.
	var st receiverState
	waited := testenv.Poll(8*time.Minute, func() error {
		var err error
		if st, err = receipts(shop, "orders"); err != nil {
			return err
		}
		dead := map[string]bool{}
		for _, dl := range pl.deadLetters(t, shop, "orders") {
			if strings.HasPrefix(dl.EventID, prefix+"-") {
				dead[dl.EventID] = true
			}
		}
		f.Received, f.Duplicates, f.DeadLettered, f.Missing, f.missingIDs = 0, 0, 0, 0, nil
		for _, id := range sent {
			switch c := st.Receipts[id].Count; {
			case c > 0:
				f.Received++
				f.Duplicates += c - 1
			case dead[id]:
				f.DeadLettered++
			default:
				f.Missing++
				f.missingIDs = append(f.missingIDs, id)
			}
		}
		if f.Missing > 0 {
			return fmt.Errorf("%d of %d events neither received nor dead-lettered", f.Missing, len(sent))
		}
		return nil
	})
	if waited != nil {
		t.Logf("%s: %v", name, waited)
	}
	logf(t, "%s", f)
	if f.Missing > 0 || len(p.Unacked) > 0 {
		t.Errorf("%s: %d events missing (e.g. %v), %d never acknowledged to the producer", name, f.Missing, f.missingIDs[:min(5, len(f.missingIDs))], len(p.Unacked))
	}
	if st.Stats.BadSignatures != 0 {
		t.Errorf("%s: %d bad signatures", name, st.Stats.BadSignatures)
	}
	return f
}

// faults breaks the installation the ways a cluster does while events flow.
func (s *install) faults(t *testing.T) {
	pl := newPlugin(t, shop, s.tls)
	var all []figures
	defer func() {
		t.Logf("faults (events of the orders endpoint, each fault's own):")
		for _, f := range all {
			t.Logf("  %s", f)
		}
	}()

	all = append(all, s.duringStream(t, pl, "helm upgrade to a new image tag (rolling)", "upgrade", func(t *testing.T) {
		sh(t, "helm", append([]string{"upgrade", release, "charts/webhook-operator", "--namespace", operatorNS, "--wait", "--timeout", "5m"}, s.values(tagB)...)...)
		eventually(t, 5*time.Minute, "the dispatcher to roll to "+tagB, func() error {
			img := command("", "kubectl", "-n", shop, "get", "deployment", "webhook-dispatcher", "-o", "jsonpath={.spec.template.spec.containers[0].image}").stdout
			if !strings.HasSuffix(img, ":"+tagB) {
				return fmt.Errorf("dispatcher image %q", img)
			}
			return nil
		})
		kubectl(t, "-n", shop, "rollout", "status", "deployment/webhook-dispatcher", "--timeout=5m")
		logf(t, "upgraded: controller and dispatcher run %s:%s", imageRepo, tagB)
	}))

	// A tenant no later fault touches: its dispatcher's token is followed to its renewal.
	if *withRenewal {
		s.watchToken(t)
	}

	all = append(all, s.duringStream(t, pl, "dispatcher pod force-deleted", "kill", func(t *testing.T) {
		pods := strings.Fields(kubectl(t, "-n", shop, "get", "pods", "-l", "app.kubernetes.io/managed-by=webhook-operator", "-o", "name"))
		if len(pods) == 0 {
			t.Fatal("no dispatcher pod")
		}
		kubectl(t, append([]string{"-n", shop, "delete", "--force", "--grace-period=0"}, pods...)...)
		logf(t, "deleted %v with --force --grace-period=0", pods)
	}))

	all = append(all, s.duringStream(t, pl, "NATS pod leading the events stream deleted", "nats", func(t *testing.T) {
		leader := streamLeader(t, "WEBHOOKS_"+shop)
		kubectl(t, "-n", natsNS, "delete", "pod", leader)
		logf(t, "deleted %s, the leader of WEBHOOKS_%s", leader, shop)
	}))
	kubectl(t, "-n", natsNS, "rollout", "status", "statefulset/nats", "--timeout=5m")

	all = append(all, s.duringStream(t, pl, "controller pod deleted", "ctrl", func(t *testing.T) {
		kubectl(t, "-n", operatorNS, "delete", "pod", "-l", "app.kubernetes.io/name=webhook-operator,app.kubernetes.io/component=controller")
		kubectl(t, "-n", operatorNS, "wait", "--for=condition=Available", "deployment", "-l", "app.kubernetes.io/name=webhook-operator", "--timeout=3m")
	}))
}

// streamLeader asks a NATS server's monitoring endpoint which server leads a stream.
func streamLeader(t *testing.T, stream string) string {
	t.Helper()
	var leader string
	eventually(t, time.Minute, "the leader of "+stream, func() error {
		b, err := rawGet("/api/v1/namespaces/nats/services/http:nats:8222/proxy/jsz?accounts=true&streams=true")
		if err != nil {
			return err
		}
		var jsz struct {
			Accounts []struct {
				Streams []struct {
					Name    string `json:"name"`
					Cluster struct {
						Leader string `json:"leader"`
					} `json:"cluster"`
				} `json:"stream_detail"`
			} `json:"account_details"`
		}
		if err := json.Unmarshal(b, &jsz); err != nil {
			return err
		}
		for _, a := range jsz.Accounts {
			for _, s := range a.Streams {
				if s.Name == stream && s.Cluster.Leader != "" {
					leader = s.Cluster.Leader
					return nil
				}
			}
		}
		return fmt.Errorf("no leader of %s in %.200s", stream, b)
	})
	return leader
}
