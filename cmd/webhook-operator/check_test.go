package main

import (
	"bytes"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// runCheck runs `webhook-operator check` with args and returns its output and error.
func runCheck(args ...string) (string, error) {
	cmd := checkCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// The chart's test runs `check nats` with the release's settings: against a real server in
// the auth-callout mode the chart installs, requiring TLS with client certificates, it passes
// with the right CA and fails with a wrong one, without TLS, or where nothing listens.
func TestCheckNATS(t *testing.T) {
	auth, err := testenv.NewNATSAuth(streams.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.WithTLS(filepath.Join(t.TempDir(), "tls")); err != nil {
		t.Fatal(err)
	}
	n, err := testenv.StartNATSWith("", auth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Cleanup)
	tlsArgs := []string{"--nats-ca-file", auth.TLS.CA, "--nats-cert-file", auth.TLS.ClientCert, "--nats-key-file", auth.TLS.ClientKey}

	for _, u := range []string{n.URL(), fmt.Sprintf("tls://localhost:%d", n.Port)} {
		out, err := runCheck(append([]string{"nats", "--nats-url", u}, tlsArgs...)...)
		if err != nil || !strings.Contains(out, "JetStream enabled") || !strings.Contains(out, "certificate valid for") {
			t.Errorf("check nats %s with the server's CA: %v\n%s", u, err, out)
		}
	}

	other, err := testenv.WriteTLS(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runCheck("nats", "--nats-url", n.URL(), "--nats-ca-file", other.CA); err == nil || !strings.Contains(out, "certificate signed by unknown authority") {
		t.Errorf("check nats with another CA: %v\n%s", err, out)
	}
	if out, err := runCheck("nats", "--nats-url", n.URL()); err == nil || !strings.Contains(out, "certificate signed by unknown authority") {
		t.Errorf("check nats with the system's roots only: %v\n%s", err, out)
	}

	// Nothing listening, and one bad URL of two: each fails on its own.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "nats://" + l.Addr().String()
	_ = l.Close()
	out, err := runCheck(append([]string{"nats", "--nats-url", n.URL() + "," + closed}, tlsArgs...)...)
	if err == nil || !strings.Contains(out, "ok   "+n.URL()) || !strings.Contains(out, "FAIL "+closed) {
		t.Errorf("check nats with one server down: %v\n%s", err, out)
	}
}

// A server without JetStream, or without TLS when the flags ask for it, fails the check.
func TestCheckNATSRefuses(t *testing.T) {
	n := testenv.NewNATS(t)
	if out, err := runCheck("nats", "--nats-url", n.URL()); err != nil || !strings.Contains(out, "no TLS, JetStream enabled") {
		t.Errorf("check nats without TLS: %v\n%s", err, out)
	}
	files, err := testenv.WriteTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if out, err := runCheck("nats", "--nats-url", n.URL(), "--nats-ca-file", files.CA); err == nil || !strings.Contains(out, "offers no TLS") {
		t.Errorf("check nats with a CA against a server without TLS: %v\n%s", err, out)
	}
	if out, err := runCheck("nats", "--nats-url", strings.Replace(n.URL(), "nats://", "tls://", 1)); err == nil || !strings.Contains(out, "offers no TLS") {
		t.Errorf("check nats tls:// against a server without TLS: %v\n%s", err, out)
	}
	n.Server.DisableJetStream()
	if out, err := runCheck("nats", "--nats-url", n.URL()); err == nil || !strings.Contains(out, "JetStream disabled") {
		t.Errorf("check nats of a server without JetStream: %v\n%s", err, out)
	}
}
