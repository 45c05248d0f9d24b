// Command webhook-operator is the operator's one binary: `webhook-operator controller` runs the
// reconcilers, `webhook-operator dispatcher` is what every dispatcher Deployment runs,
// `webhook-operator callout` serves NATS's auth callout and `webhook-operator ingress` the
// HTTP ingress.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/webhook-operator/webhook-operator/internal/version"
)

func main() {
	root := &cobra.Command{
		Use:           "webhook-operator",
		Short:         "Deliver NATS JetStream events to webhook endpoints declared as Kubernetes resources",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Run:   func(*cobra.Command, []string) { fmt.Println(version.Version) },
	})
	for _, c := range subcommands {
		root.AddCommand(c())
	}
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "webhook-operator:", err)
		os.Exit(1)
	}
}

// subcommands are registered by the files that implement them (controller, dispatcher).
var subcommands []func() *cobra.Command
