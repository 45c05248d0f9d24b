package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/webhook-operator/webhook-operator/internal/opconfig"
)

func init() { subcommands = append(subcommands, checkCommand) }

// checkCommand is what the chart's test (`helm test`) runs in a pod of the release: whether
// the release's NATS settings reach a JetStream server.
func checkCommand() *cobra.Command {
	var (
		conf    opconfig.NATS
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "check nats --nats-url=<urls>",
		Short: "Check that every NATS URL answers, over TLS verified with the given CA, with JetStream enabled",
		Long: `check nats connects to every server of --nats-url (comma-separated) as the controller
would, with --nats-ca-file, --nats-cert-file and --nats-key-file: the name resolves, the server
answers, its certificate is valid for the name under the CA (when the URL is tls:// or the
server or the flags ask for TLS), and it has JetStream enabled. It does not log in: it needs
no credential. The chart's test (helm test) runs it with the release's settings.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] != "nats" {
				return fmt.Errorf("unknown check %q (there is one: nats)", args[0])
			}
			cfg, err := conf.TLS()
			if err != nil {
				return err
			}
			var failed []string
			for _, u := range strings.Split(conf.URL, ",") {
				u = strings.TrimSpace(u)
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
				info, err := checkNATS(ctx, u, cfg)
				cancel()
				if err != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "FAIL %s: %v\n", u, err)
					failed = append(failed, u)
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "ok   %s: server %s (nats-server %s), %s, JetStream enabled\n", u, info.ServerName, info.Version, info.tls)
			}
			if len(failed) > 0 {
				return fmt.Errorf("%d of the NATS URLs failed: %s", len(failed), strings.Join(failed, ", "))
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&conf.URL, "nats-url", "nats://127.0.0.1:4222", "NATS server URLs, comma-separated")
	fs.StringVar(&conf.CAFile, "nats-ca-file", "", "PEM CA bundle for the NATS servers' TLS certificates")
	fs.StringVar(&conf.CertFile, "nats-cert-file", "", "PEM client certificate for NATS servers that verify their clients (with --nats-key-file)")
	fs.StringVar(&conf.KeyFile, "nats-key-file", "", "PEM key of --nats-cert-file")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "how long each server may take")
	return cmd
}

// natsInfo is what a server says first, in its INFO line.
type natsInfo struct {
	ServerName   string `json:"server_name"`
	Version      string `json:"version"`
	JetStream    bool   `json:"jetstream"`
	TLSRequired  bool   `json:"tls_required"`
	TLSAvailable bool   `json:"tls_available"`
	tls          string
}

// checkNATS dials a NATS URL, reads the server's INFO, upgrades to TLS as a client would, and
// requires JetStream. cfg (may be nil: the system's roots) verifies the server's certificate.
func checkNATS(ctx context.Context, rawURL string, cfg *tls.Config) (natsInfo, error) {
	var info natsInfo
	if !strings.Contains(rawURL, "://") {
		rawURL = "nats://" + rawURL
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return info, err
	}
	if u.Scheme != "nats" && u.Scheme != "tls" {
		return info, fmt.Errorf("scheme %q: want nats:// or tls://", u.Scheme)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "4222"
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, port))
	if err != nil {
		return info, err
	}
	defer func() { _ = conn.Close() }()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return info, fmt.Errorf("no INFO from the server: %w", err)
	}
	body, ok := strings.CutPrefix(strings.TrimSpace(line), "INFO ")
	if !ok {
		return info, fmt.Errorf("not a NATS server: it said %.80q", line)
	}
	if err := json.Unmarshal([]byte(body), &info); err != nil {
		return info, fmt.Errorf("the server's INFO: %w", err)
	}
	wantTLS := u.Scheme == "tls" || cfg != nil
	switch {
	case info.TLSRequired || (wantTLS && info.TLSAvailable):
		c := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg != nil {
			c = cfg.Clone()
		}
		c.ServerName = host
		t := tls.Client(conn, c)
		if err := t.HandshakeContext(ctx); err != nil {
			return info, fmt.Errorf("TLS: %w", err)
		}
		info.tls = tls.VersionName(t.ConnectionState().Version) + ", certificate valid for " + host
		if len(c.Certificates) > 0 || c.GetClientCertificate != nil {
			info.tls += " (client certificate given)"
		}
	case wantTLS:
		return info, errors.New("the server offers no TLS, and the URL or the flags ask for it")
	default:
		info.tls = "no TLS"
	}
	if !info.JetStream {
		return info, fmt.Errorf("server %s (nats-server %s) has JetStream disabled", info.ServerName, info.Version)
	}
	return info, nil
}
