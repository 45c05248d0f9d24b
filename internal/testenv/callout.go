package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// NewCalloutNATS starts a server in auth-callout mode for one test (configure, when set, may
// change its configuration first) and returns it with the admin's JetStream; both end with
// the test.
func NewCalloutNATS(t testing.TB, configure func(*NATSAuth)) (*NATS, jetstream.JetStream) {
	t.Helper()
	auth, err := NewNATSAuth(streams.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	if configure != nil {
		configure(auth)
	}
	n, err := StartNATSWith(t.TempDir(), auth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	nc, js, err := n.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return n, js
}

// CalloutService is the callout service of the keys, in the default layout, placing users in
// the tenants' account with the configuration's tenant limits; it decrypts requests when the
// configuration has an xkey, and accepts tokens in clear when the server has no TLS (it is a
// test's, on loopback).
func (a *NATSAuth) CalloutService(kube *natsauth.Kube, log logr.Logger) (*natsauth.Service, error) {
	issuer, err := nkeys.FromSeed(a.Keys.IssuerSeed)
	if err != nil {
		return nil, err
	}
	svc := &natsauth.Service{Kube: kube, Bus: natsauth.BusOf(streams.DefaultConfig()),
		Issuer: issuer, Account: natsauth.AccountTenants, Limits: a.Config.TenantLimits, Log: log,
		// A test's server without TLS is on loopback.
		AllowPlaintextTokens: a.TLS == nil}
	if a.Config.XKey != "" {
		if svc.XKey, err = nkeys.FromSeed(a.Keys.XKeySeed); err != nil {
			return nil, err
		}
	}
	return svc, nil
}

// ServeCallout runs svc on a connection of the callout's user until stop is called or the test
// ends, and returns once it answers.
func (n *NATS) ServeCallout(t testing.TB, svc *natsauth.Service) (stop func()) {
	t.Helper()
	cc, err := n.ConnectCallout()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = svc.Serve(ctx, cc) }()
	if err := Poll(5*time.Second, func() bool { return cc.NumSubscriptions() > 0 }); err != nil {
		t.Fatalf("the callout service did not subscribe: %v", err)
	}
	if err := cc.Flush(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
			cc.Close()
		}
	}
	t.Cleanup(stop)
	return stop
}
