package harness

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// brokerAssets is what the JetStream account holds, read through the JetStream API (every
// stream's info and every consumer's info): the same whichever server answers.
type brokerAssets struct {
	// Streams counts every stream (a key-value bucket is one, KV_<bucket>).
	Streams int
	// Durable counts durable consumers (the operator's); Ephemeral the others (the ordered
	// consumers of the clients' key-value watchers, which come and go with their processes).
	Durable, Ephemeral int
	// Replicated counts the streams and consumers with more than one replica: each is a Raft
	// group of its own on every server that holds a replica.
	ReplicatedStreams, ReplicatedConsumers int
}

// readBrokerAssets lists every stream and consumer of the account.
func readBrokerAssets(ctx context.Context, js jetstream.JetStream) (brokerAssets, error) {
	var a brokerAssets
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	streams := js.ListStreams(ctx)
	var infos []*jetstream.StreamInfo
	for si := range streams.Info() {
		infos = append(infos, si)
	}
	if err := streams.Err(); err != nil {
		return a, fmt.Errorf("listing streams: %w", err)
	}
	for _, si := range infos {
		a.Streams++
		if si.Config.Replicas > 1 {
			a.ReplicatedStreams++
		}
		s, err := js.Stream(ctx, si.Config.Name)
		if err != nil {
			return a, fmt.Errorf("stream %s: %w", si.Config.Name, err)
		}
		consumers := s.ListConsumers(ctx)
		for ci := range consumers.Info() {
			if ci.Config.Durable != "" {
				a.Durable++
			} else {
				a.Ephemeral++
			}
			if consumerReplicas(ci.Config.Replicas, ci.Config.Durable != "", si.Config.Replicas, si.Config.Retention == jetstream.LimitsPolicy) > 1 {
				a.ReplicatedConsumers++
			}
		}
		if err := consumers.Err(); err != nil {
			return a, fmt.Errorf("consumers of %s: %w", si.Config.Name, err)
		}
	}
	return a, nil
}

// consumerReplicas is how many replicas a consumer has, as nats-server decides it: its own
// setting, else its stream's, except that an ephemeral consumer of a limits stream without a
// setting has one.
func consumerReplicas(own int, durable bool, stream int, limits bool) int {
	switch {
	case own > 0 && own <= stream:
		return own
	case own == 0 && !durable && limits:
		return 1
	default:
		return stream
	}
}

// serverFigures are one nats-server's figures.
type serverFigures struct {
	name string
	// rss and goroutines after the quiet window; files in its store directory.
	rss        int64
	goroutines int
	files      int
	// streams and consumers the server holds (a replica of), and those of them with more than
	// one replica (its Raft groups besides the meta group), from its /jsz.
	streams, consumers                     int
	replicatedStreams, replicatedConsumers int
	// idleCores is its CPU over the quiet window.
	idleCores float64
	// stop is how long a graceful stop (SIGTERM) took, graceful false when it had to be
	// killed; ready how long after its start again /healthz answered 200 (every stream and
	// consumer it holds current), jsReady until its JetStream API answered.
	stop, ready, jsReady time.Duration
	graceful, restarted  bool
}

// haAssets are the server's replicated streams and consumers.
func (f serverFigures) haAssets() int { return f.replicatedStreams + f.replicatedConsumers }

// readServer reads a running server's memory, goroutines, files and JetStream assets.
func readServer(n *testenv.NATSProcess, profilePort int) (serverFigures, error) {
	f := serverFigures{name: n.Name}
	s, err := sampleProc(n.PID())
	if err != nil {
		return f, fmt.Errorf("%s: %w", n.Name, err)
	}
	f.rss = s.RSS
	if f.goroutines, err = goroutinesOf(profilePort); err != nil {
		return f, fmt.Errorf("%s: %w", n.Name, err)
	}
	if f.files, err = countFiles(n.StoreDir); err != nil {
		return f, fmt.Errorf("%s: %w", n.Name, err)
	}
	var jsz server.JSInfo
	if err := testenv.NATSMonitor(n.MonitorPort, "jsz?accounts=true&streams=true&consumers=true&config=true", &jsz); err != nil {
		return f, fmt.Errorf("%s: %w", n.Name, err)
	}
	for _, acc := range jsz.AccountDetails {
		for _, sd := range acc.Streams {
			f.streams++
			replicas := 1
			if sd.Config != nil {
				replicas = sd.Config.Replicas
			}
			if replicas > 1 {
				f.replicatedStreams++
			}
			for _, ci := range sd.Consumer {
				f.consumers++
				if ci.Config == nil {
					continue
				}
				limits := sd.Config == nil || sd.Config.Retention == server.LimitsPolicy
				if consumerReplicas(ci.Config.Replicas, ci.Config.Durable != "", replicas, limits) > 1 {
					f.replicatedConsumers++
				}
			}
		}
	}
	return f, nil
}

// goroutinesOf reads the goroutine count of the process serving /debug/pprof on port.
func goroutinesOf(port int) (int, error) {
	hc := &http.Client{Timeout: time.Minute}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/goroutine?debug=1", port))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "goroutine profile: total "); ok {
			return strconv.Atoi(strings.TrimSpace(rest))
		}
	}
	return 0, fmt.Errorf("no goroutine count in the profile on port %d", port)
}

// countFiles counts the regular files under dir.
func countFiles(dir string) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			n++
		}
		return nil
	})
	return n, err
}

// healthy reports whether the server's /healthz answers 200: JetStream enabled and, in a
// cluster, every stream and consumer it holds current.
func healthy(monitorPort int) bool {
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", monitorPort))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// jszConsumers is the number of consumers server n holds, from its /jsz (cheap: no details).
func jszConsumers(n *testenv.NATSProcess) (int, error) {
	info, err := testenv.NATSJSZ(n.MonitorPort)
	if err != nil {
		return 0, err
	}
	return info.Consumers, nil
}
