// Command webhook-operator-demo is `make demo`: the whole product on one machine. It starts the
// local stack (internal/localstack: kube-apiserver and etcd, an embedded NATS JetStream, the
// controller, and a pod runner that runs the dispatcher Deployments as local processes), two
// receivers on loopback (one verifying signatures, one failing on purpose), applies the
// endpoints of hack/demo, publishes a handful of events with `kubectl webhooks publish`, and
// shows with kubectl and the plugin what a user wants to see. Then it keeps the stack running
// until Ctrl-C, or, with DEMO_DURATION (e.g. 60s), stops by itself: exit status 0 only if the
// healthy endpoint got every event and the failing one has a dead letter.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	// The in-process pod runner is a controller-runtime controller; what it does is narrated
	// on stdout, and the controller's and dispatchers' logs are files (or -verbose).
	ctrllog.SetLogger(logr.Discard())
	o := options{}
	flag.StringVar(&o.dir, "dir", envOr("DEMO_DIR", filepath.Join(os.TempDir(), "webhook-operator-demo")),
		"directory for the kubeconfig, NATS storage, logs and pods; emptied at start ($DEMO_DIR)")
	flag.StringVar(&o.binDir, "bin", envOr("DEMO_BIN", ""), "directory holding webhook-operator and kubectl-webhooks (default: the checkout's bin/)")
	flag.StringVar(&o.manifests, "manifests", "", "directory of the demo's manifests (default: the checkout's hack/demo)")
	duration := envOr("DEMO_DURATION", "")
	flag.StringVar(&duration, "duration", duration, "stop by itself after this long, e.g. 60s, and exit 1 unless the checks passed ($DEMO_DURATION); empty: run until Ctrl-C")
	flag.BoolVar(&o.verbose, "verbose", os.Getenv("DEMO_VERBOSE") != "", "also print the controller's and dispatchers' logs ($DEMO_VERBOSE)")
	flag.Parse()
	if duration != "" {
		d, err := time.ParseDuration(duration)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "webhook-operator-demo: DEMO_DURATION must be a positive duration such as 60s, not %q\n", duration)
			os.Exit(2)
		}
		o.duration = d
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	code := run(ctx, o)
	stop()
	os.Exit(code)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
