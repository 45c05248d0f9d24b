package dispatcher_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/internal/metricsauth"
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

// TestSecureMetricsKnowScrapersByTheirCertificates runs a dispatcher with secure metrics as
// the controller renders them (--metrics-secure, --metrics-client-ca-file, its mounted mirror
// of the scraper CA): the handshake fails without a client certificate, and with one of
// another CA; the scraper's certificate reads /metrics. The dispatcher asks the API server
// nothing about its scrapers, so its ServiceAccount needs no TokenReview or SubjectAccessReview
// grant. Without a CA file, secure metrics are refused at start.
func TestSecureMetricsKnowScrapersByTheirCertificates(t *testing.T) {
	e := newEnv(t)
	rcv := newReceiver(t, nil)
	rcv.Trust(e.endpoint("orders", v1alpha1.WebhookEndpointSpec{URL: rcv.URL()}))
	scraper, err := testenv.WriteTLS(filepath.Join(t.TempDir(), "scraper"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := testenv.WriteTLS(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	secure := func(o *dispatcher.Options) {
		o.MetricsAddr = addr
		o.Config.MetricsSecure = true
		o.MetricsClientCerts = metricsauth.ClientCerts{CAFile: scraper.CA, Name: "webhook-operator"}
	}
	e.dispatcher("a", secure)
	e.publish("order.created", "evt_1", []byte(`{}`))
	testenv.Eventually(t, 30*time.Second, func() bool { return rcv.Stats().Requests == 1 }, "the event to be delivered%s", lazy(e.dump))
	scrape := func(cert, key string) (int, error) {
		c := &tls.Config{InsecureSkipVerify: true} // self-signed serving certificate
		if cert != "" {
			pair, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				t.Fatal(err)
			}
			c.Certificates = []tls.Certificate{pair}
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: c, DisableKeepAlives: true}}
		resp, err := hc.Get("https://" + addr + "/metrics")
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		if resp.StatusCode == http.StatusOK && !strings.Contains(string(b), "# TYPE") {
			return 0, fmt.Errorf("200 without metrics: %.200s", b)
		}
		return resp.StatusCode, nil
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		code, err := scrape(scraper.ClientCert, scraper.ClientKey)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("answered %d", code)
		}
		return err
	}, "the scraper's client certificate to read the dispatcher's /metrics")
	for _, c := range []struct{ name, cert, key string }{
		{"no client certificate", "", ""},
		{"a client certificate of another CA", other.ClientCert, other.ClientKey},
	} {
		if code, err := scrape(c.cert, c.key); err == nil {
			t.Errorf("%s: answered %d, want a failed handshake", c.name, code)
		}
	}

	err = dispatcher.Run(context.Background(), dispatcher.Options{Namespace: e.ns, Config: e.cfg, MetricsAddr: "127.0.0.1:0", RestConfig: cp.Config, Logger: quietLogger(t)})
	if err == nil || !strings.Contains(err.Error(), "--metrics-client-ca-file") {
		t.Errorf("secure metrics without a scraper CA: %v", err)
	}
}

// A dispatcher whose manager stops on its own (here its /metrics address is taken when it
// starts serving) stops too and says why, instead of running on without probes or
// informers: never ready again, its endpoints unavailable. The kubelet restarts it.
func TestADispatcherWhoseManagerStopsExitsWithItsError(t *testing.T) {
	e := newEnv(t)
	e.cfg.MetricsSecure = false
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- dispatcher.Run(ctx, dispatcher.Options{Namespace: e.ns, Config: e.cfg, Identity: "d1", RestConfig: cp.Config,
			MetricsAddr: taken.Addr().String(), ShutdownGrace: 2 * time.Second, Registry: prometheus.NewRegistry(), Logger: quietLogger(t)})
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "the manager") {
			t.Fatalf("the dispatcher ended with %v, want the manager's error", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the dispatcher ran on for a minute after its manager stopped")
	}
}
