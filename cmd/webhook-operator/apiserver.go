package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/webhook-operator/webhook-operator/internal/dataapi"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
)

func init() { subcommands = append(subcommands, apiserverCommand) }

func apiserverCommand() *cobra.Command {
	cfg := opconfig.Default()
	o := dataapi.NewOptions()
	cmd := &cobra.Command{
		Use:   "apiserver",
		Short: "Serve deliveries, dead letters and events as Kubernetes resources (data.webhook-operator.io), behind the aggregation layer",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			// Through the auth callout the server asks for its own namespace, where its
			// ServiceAccount's role is granted.
			if cfg.NATS.TokenFile != "" && cfg.NATS.Namespace == "" {
				if cfg.NATS.Namespace = os.Getenv("POD_NAMESPACE"); cfg.NATS.Namespace == "" {
					return errors.New("--nats-token-file needs the server's namespace: set POD_NAMESPACE")
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			nc, js, err := cfg.Connect("webhook-operator-apiserver", append(dataapi.ConnectOptions(),
				nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
					if err != nil {
						klog.InfoS("disconnected from NATS", "error", err.Error())
					}
				}),
				nats.ReconnectHandler(func(*nats.Conn) { klog.InfoS("reconnected to NATS") }))...)
			if err != nil {
				return err
			}
			defer nc.Close()
			bus := &dataapi.Bus{NC: nc, JS: js, Streams: cfg.Streams, MaxEventBytes: cfg.MaxEventBytes}
			if cfg.NATS.TokenFile != "" {
				// Through the auth callout the server deletes nothing itself: a purge connects
				// as the namespace's purger, which RBAC (delete on webhookdeliveries) allows it.
				bus.Purger = func(ctx context.Context, ns string) (*nats.Conn, jetstream.JetStream, func(), error) {
					pc := cfg
					pc.NATS.Namespace = natsauth.PurgeUser(ns)
					pnc, pjs, err := pc.Connect("webhook-operator-apiserver purge "+ns, append(dataapi.ConnectOptions(), nats.RetryOnFailedConnect(false), nats.MaxReconnects(0))...)
					if err != nil {
						return nil, nil, nil, err
					}
					return pnc, pjs, pnc.Close, nil
				}
			}
			s, err := dataapi.New(o, bus)
			if err != nil {
				return err
			}
			return s.Run(ctx)
		},
	}
	fs := cmd.Flags()
	cfg.AddFlags(fs)
	o.AddFlags(fs)
	gfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(gfs)
	fs.AddGoFlagSet(gfs)
	return cmd
}
