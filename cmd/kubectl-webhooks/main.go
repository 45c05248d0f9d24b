// Command kubectl-webhooks is the kubectl plugin of webhook-operator (`kubectl webhooks ...`):
// publish a test event, show endpoint health, read the delivery log, list, show and replay
// dead letters, and re-enable an auto-disabled endpoint. The commands live in
// internal/plugin.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/webhook-operator/webhook-operator/internal/plugin"
)

func main() {
	// The plugin reports through its output; controller-runtime's client has nothing to log.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := plugin.Run(ctx, os.Args[1:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}, os.Getenv)
	stop()
	os.Exit(code)
}
