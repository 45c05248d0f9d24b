package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
)

// Environment variables of the callout service's own NATS login (the AUTH account's user).
const (
	EnvCalloutUser     = "NATS_CALLOUT_USER"
	EnvCalloutPassword = "NATS_CALLOUT_PASSWORD"
)

// calloutFlags configure the auth callout the controller serves.
type calloutFlags struct {
	enabled        bool
	issuerSeedFile string
	xkeySeedFile   string
	audience       string
	maxSession     time.Duration
	tokenSeconds   int64
	ingress        string
	dataAPI        string
	limits         natsauth.Limits
	ratePerHost    float64
	burstPerHost   int
	refusalTTL     time.Duration
}

// addLimitFlags binds the limits of every tenant connection: the controller writes them into
// the user JWTs it issues, nats-config into the server's configuration (the two must agree).
func addLimitFlags(fs *pflag.FlagSet, l *natsauth.Limits) {
	d := natsauth.DefaultLimits
	*l = d
	opconfig.BytesVar(fs, &l.MaxPayload, "nats-user-max-payload",
		"largest message a tenant connection (dispatcher, producer, kubectl webhooks) may publish; keep it above --max-event-bytes plus 64Ki for the operator's headers and records")
	fs.Int64Var(&l.MaxSubscriptions, "nats-user-max-subscriptions", d.MaxSubscriptions, "most subscriptions a tenant connection may hold at once")
	opconfig.BytesVar(fs, &l.MaxData, "nats-user-max-data",
		"data bound written into every tenant connection's user JWT (nats-server 2.15 does not enforce it: stored data is bounded by the streams' sizes)")
}

func (f *calloutFlags) add(fs *pflag.FlagSet) {
	fs.BoolVar(&f.enabled, "nats-auth-callout", false,
		"serve nats-server's auth callout: dispatchers, producers and kubectl webhooks connect with Kubernetes tokens and get their namespace's permissions only (see internal/natsauth)")
	fs.StringVar(&f.issuerSeedFile, "nats-callout-issuer-seed-file", "", "account nkey seed (SA...) the callout signs users with; its public key is the server's auth_callout issuer")
	fs.StringVar(&f.xkeySeedFile, "nats-callout-xkey-seed-file", "", "curve key seed (SX...) when the server encrypts authorization requests (auth_callout xkey)")
	fs.StringVar(&f.audience, "nats-token-audience", natsauth.DefaultAudience, "audience of the projected ServiceAccount tokens dispatchers connect with")
	fs.Int64Var(&f.tokenSeconds, "nats-token-expiration-seconds", 3600,
		"lifetime of the projected ServiceAccount tokens dispatchers connect with (600 to 86400); the kubelet renews them at 80%, and a connection's authorization ends with its token")
	fs.StringVar(&f.ingress, "nats-ingress-service-account", "",
		"namespace/name of the HTTP ingress's ServiceAccount (webhook-operator ingress): with a token of the NATS audience it may publish the events of every namespace, and nothing else (it authorizes each caller itself)")
	fs.StringVar(&f.dataAPI, "nats-apiserver-service-account", "",
		"namespace/name of the data API server's ServiceAccount (webhook-operator apiserver): with a token of the NATS audience it may read every namespace's streams and publish their events, and nothing else (the Kubernetes API server authorizes its callers)")
	fs.DurationVar(&f.maxSession, "nats-max-session", natsauth.DefaultMaxSession, "longest a connection's authorization lasts before it must reconnect (earlier when its token expires)")
	addLimitFlags(fs, &f.limits)
	fs.Float64Var(&f.ratePerHost, "nats-callout-rate-per-host", natsauth.DefaultRatePerHost,
		"authorization requests per second the callout reviews for one client host (its address as NATS sees it); beyond, it refuses them at once")
	fs.IntVar(&f.burstPerHost, "nats-callout-burst-per-host", natsauth.DefaultBurstPerHost, "requests one client host may make at once above its rate")
	fs.DurationVar(&f.refusalTTL, "nats-callout-refusal-ttl", natsauth.DefaultRefusalTTL, "how long a token the API server refused is refused again without asking it")
}

// recordHeadroom is what the operator's headers and records add to an event's payload.
const recordHeadroom = 64 << 10

func (f *calloutFlags) validate(maxEventBytes int) error {
	if !f.enabled {
		return nil
	}
	var errs []error
	if l := f.limits; l.MaxPayload < int64(maxEventBytes)+recordHeadroom {
		errs = append(errs, fmt.Errorf("--nats-user-max-payload (%d) must be at least --max-event-bytes (%d) plus 64Ki for the operator's headers and records", l.MaxPayload, maxEventBytes))
	}
	if f.limits.MaxSubscriptions < 16 || f.limits.MaxData < 1 {
		errs = append(errs, errors.New("--nats-user-max-subscriptions must be at least 16 and --nats-user-max-data positive"))
	}
	if f.issuerSeedFile == "" {
		errs = append(errs, errors.New("--nats-auth-callout needs --nats-callout-issuer-seed-file"))
	}
	if f.audience == "" {
		errs = append(errs, errors.New("--nats-token-audience must not be empty"))
	}
	if f.tokenSeconds < 600 || f.tokenSeconds > 86400 {
		errs = append(errs, fmt.Errorf("--nats-token-expiration-seconds must be from 600 (the kubelet's minimum) to 86400, not %d", f.tokenSeconds))
	}
	for flag, v := range map[string]string{"nats-ingress-service-account": f.ingress, "nats-apiserver-service-account": f.dataAPI} {
		if v == "" {
			continue
		}
		if ns, name, ok := strings.Cut(v, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			errs = append(errs, fmt.Errorf("--%s must be namespace/name, not %q", flag, v))
		}
	}
	if f.ratePerHost <= 0 || f.burstPerHost < 1 || f.refusalTTL <= 0 {
		errs = append(errs, errors.New("--nats-callout-rate-per-host, --nats-callout-burst-per-host and --nats-callout-refusal-ttl must be positive"))
	}
	if f.maxSession < time.Minute {
		errs = append(errs, fmt.Errorf("--nats-max-session must be at least 1m, not %s", f.maxSession))
	}
	return errors.Join(errs...)
}

func (f *calloutFlags) busAuth() controllers.BusAuth {
	return controllers.BusAuth{Callout: f.enabled, Audience: f.audience, TokenSeconds: f.tokenSeconds}
}

// callout serves the auth callout on every controller replica (not only the leader), so that
// connections never wait for a leader election.
type callout struct {
	svc       *natsauth.Service
	cfg       *opconfig.Config
	user      string
	password  string
	connected atomic.Pointer[nats.Conn]
}

// newCallout builds the service from the flags.
func newCallout(f *calloutFlags, cfg *opconfig.Config, mgr ctrl.Manager, log logr.Logger) (*callout, error) {
	issuer, err := natsauth.LoadIssuer(f.issuerSeedFile)
	if err != nil {
		return nil, fmt.Errorf("--nats-callout-issuer-seed-file: %w", err)
	}
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return nil, err
	}
	c := &callout{cfg: cfg, user: os.Getenv(EnvCalloutUser), password: os.Getenv(EnvCalloutPassword)}
	if c.user == "" {
		c.user = natsauth.DefaultCalloutUser
	}
	c.svc = &natsauth.Service{
		Kube: &natsauth.Kube{Client: cs, Audience: f.audience, AllowAPIAudience: cfg.NATS.AllowAPIAudienceTokens,
			Dispatchers:     controllers.DispatcherServiceAccounts(mgr.GetClient()),
			SourceConsumers: controllers.SourceConsumers(mgr.GetClient(), cfg.Streams.Names, cfg.AllowCrossNamespaceSources),
			EventPublishing: controllers.EventPublishing(mgr.GetClient()),
			Ingress:         f.ingress,
			DataAPI:         f.dataAPI},
		Bus:         natsauth.BusOf(cfg.Streams),
		Issuer:      issuer,
		Account:     natsauth.AccountTenants,
		MaxSession:  f.maxSession,
		Limits:      f.limits,
		RatePerHost: f.ratePerHost, BurstPerHost: f.burstPerHost, RefusalTTL: f.refusalTTL,
		// Tokens cross the network in clear only where the installation says so.
		AllowPlaintextTokens: cfg.NATS.AllowPlaintextTokens,
		Log:                  log.WithName("callout"),
	}
	if f.xkeySeedFile != "" {
		if c.svc.XKey, err = natsauth.LoadXKey(f.xkeySeedFile); err != nil {
			return nil, fmt.Errorf("--nats-callout-xkey-seed-file: %w", err)
		}
	}
	return c, nil
}

// NeedLeaderElection is false: every replica answers.
func (c *callout) NeedLeaderElection() bool { return false }

// Start connects to the callout account and answers until ctx ends.
func (c *callout) Start(ctx context.Context) error {
	nc, _, err := c.cfg.Connect("webhook-operator-callout", nats.UserInfo(c.user, c.password))
	if err != nil {
		return err
	}
	defer nc.Close()
	c.connected.Store(nc)
	return c.svc.Serve(ctx, nc)
}

// ready fails until the callout's connection is up.
func (c *callout) ready(*http.Request) error {
	if nc := c.connected.Load(); nc == nil || !nc.IsConnected() {
		return errors.New("the auth callout is not connected to NATS")
	}
	return nil
}
