package dispatcher_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// TestNATSConnectedMetric checks that webhook_nats_connected follows a running dispatcher's
// connection through a real nats-server restart: 1 while it delivers, 0 while the server is
// down, 1 again once it has reconnected (and delivers again).
func TestNATSConnectedMetric(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	rcv.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL()}))
	reg := prometheus.NewRegistry()
	e.dispatcher("a", func(o *dispatcher.Options) { o.Registry = reg })
	connected := func() float64 { return gauge(t, reg, "webhook_nats_connected", "") }

	e.publish("order.created", "evt_before", []byte(`{}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return rcv.Stats().Requests == 1 }, "the first event to be delivered%s", lazy(e.dump))
	if v := connected(); v != 1 {
		t.Fatalf("webhook_nats_connected is %v while delivering, want 1", v)
	}
	e.nats.Stop()
	testenv.Eventually(t, 30*time.Second, func() bool { return connected() == 0 }, "webhook_nats_connected to be 0 while nats-server is down")
	if err := e.nats.Start(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return connected() == 1 }, "webhook_nats_connected to be 1 after reconnecting")
	testenv.Eventually(t, 30*time.Second, e.nc.IsConnected, "the test's own connection to reconnect")
	e.publish("order.created", "evt_after", []byte(`{}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return rcv.RequestsByID()["evt_after"] > 0 }, "the event published after the restart to be delivered%s", lazy(e.dump))
}
