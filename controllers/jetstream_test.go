package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/opconfig"
)

// With no server to reach, the controller still starts, and every JetStream call fails at
// once with ErrNATSUnavailable instead of waiting.
func TestJetStreamWithoutAServer(t *testing.T) {
	cfg := opconfig.Default()
	cfg.NATS.URL = "nats://127.0.0.1:1"
	start := time.Now()
	js, err := ConnectJetStream(&cfg)
	if err != nil {
		t.Fatalf("connecting without a server must not fail: %v", err)
	}
	defer js.Close()
	called := false
	err = js.Do(context.Background(), "ns", func(context.Context, jetstream.JetStream) error {
		called = true
		return nil
	})
	if !errors.Is(err, ErrNATSUnavailable) || called {
		t.Errorf("Do = %v (called %v), want ErrNATSUnavailable without calling", err, called)
	}
	if d := time.Since(start); d > NATSTimeout {
		t.Errorf("failing took %v", d)
	}
}
