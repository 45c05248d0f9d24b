// Command bench is `make bench`: it measures the webhook-operator dispatcher (throughput,
// latency, isolation, retry backlog, recovery, scale) against a real nats-server, a real
// control plane and HTTP receivers on loopback, prints a table and writes it to
// bench/results/. See package harness.
//
//	bench [-quick] [-run throughput,latency,...] [-repeat N] [flags]
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/webhook-operator/webhook-operator/bench/harness"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "child" {
		os.Exit(harness.Child(os.Args[2:]))
	}
	o, err := harness.ParseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := harness.Run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
