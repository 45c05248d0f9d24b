package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/webhook-operator/webhook-operator/internal/console"
)

func init() { subcommands = append(subcommands, consoleCommand) }

// consoleCommand is `webhook-operator console`: the web console, which calls the Kubernetes
// API as the signed-in user (internal/console).
func consoleCommand() *cobra.Command {
	var (
		addr, certFile, keyFile, keyFileSession string
		namespaces                              []string
		maxSession                              time.Duration
		o                                       console.OIDCOptions
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console: endpoints, deliveries and dead letters, as the signed-in user's RBAC allows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rc, err := ctrl.GetConfig()
			if err != nil {
				return err
			}
			var key []byte
			if keyFileSession != "" {
				b, err := os.ReadFile(keyFileSession)
				if err != nil {
					return fmt.Errorf("--session-key-file: %w", err)
				}
				if key, err = base64.StdEncoding.DecodeString(strings.TrimSpace(string(b))); err != nil || len(key) != 32 {
					return errors.New("--session-key-file must hold 32 bytes, base64-encoded (head -c32 /dev/urandom | base64)")
				}
			}
			if (certFile == "") != (keyFile == "") {
				return errors.New("--tls-cert-file and --tls-key-file go together")
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
			s, err := console.New(ctx, console.Options{Kube: rc, SessionKey: key, MaxSession: maxSession, OIDC: o, Namespaces: namespaces, Logger: log})
			if err != nil {
				return err
			}
			log.Info("console listening", "address", addr, "tls", certFile != "")
			return s.Run(ctx, addr, certFile, keyFile)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&addr, "listen", ":8443", "address the console listens on")
	fs.StringVar(&certFile, "tls-cert-file", "", "serving certificate (PEM); without it the console serves plain HTTP, for a TLS-terminating proxy in front or localhost")
	fs.StringVar(&keyFile, "tls-key-file", "", "serving key (PEM)")
	fs.StringVar(&keyFileSession, "session-key-file", "", "32 bytes, base64-encoded, that seal the session cookies (replicas must share it); without it a random key: sessions end with the process")
	fs.DurationVar(&maxSession, "max-session", 12*time.Hour, "longest session, whatever the token's own expiry")
	fs.StringSliceVar(&namespaces, "namespace", nil, "namespaces offered to users who may not list namespaces (repeatable)")
	fs.StringVar(&o.IssuerURL, "oidc-issuer-url", "", "OIDC issuer: offers sign-in with the cluster's identity provider (the API server must accept its ID tokens for --oidc-client-id)")
	fs.StringVar(&o.ClientID, "oidc-client-id", "", "the console's OIDC client id")
	fs.StringVar(&o.ClientSecret, "oidc-client-secret", os.Getenv("OIDC_CLIENT_SECRET"), "the console's OIDC client secret, for a confidential client (default $OIDC_CLIENT_SECRET)")
	fs.StringVar(&o.RedirectURL, "oidc-redirect-url", "", "the console's /oidc/callback as browsers reach it")
	fs.StringSliceVar(&o.Scopes, "oidc-scope", []string{"email", "groups"}, "scopes asked besides openid (repeatable)")
	fs.StringVar(&o.CAFile, "oidc-ca-file", "", "CA of the OIDC provider's certificate, when not a public one")
	return cmd
}
