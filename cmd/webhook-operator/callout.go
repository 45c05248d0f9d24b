package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/metricsauth"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/version"
)

// Environment variables of the callout service's own NATS login (the AUTH account's user).
const (
	EnvCalloutUser     = "NATS_CALLOUT_USER"
	EnvCalloutPassword = "NATS_CALLOUT_PASSWORD"
)

// busAuthFlags say how tenants authenticate to the bus, for the controller: in callout mode
// (served by `webhook-operator callout`) it gives every dispatcher a projected token of the
// audience, of this lifetime.
type busAuthFlags struct {
	enabled      bool
	audience     string
	tokenSeconds int64
}

func (f *busAuthFlags) add(fs *pflag.FlagSet) {
	fs.BoolVar(&f.enabled, "nats-auth-callout", false,
		"the bus authenticates with nats-server's auth callout, served by `webhook-operator callout`: dispatchers, producers and kubectl webhooks connect with Kubernetes tokens and get their namespace's permissions only (see internal/natsauth)")
	fs.StringVar(&f.audience, "nats-token-audience", natsauth.DefaultAudience, "audience of the projected ServiceAccount tokens dispatchers connect with")
	fs.Int64Var(&f.tokenSeconds, "nats-token-expiration-seconds", 3600,
		"lifetime of the projected ServiceAccount tokens dispatchers connect with (600 to 86400); the kubelet renews them at 80%, and a connection's authorization ends with its token")
}

func (f *busAuthFlags) validate() error {
	if !f.enabled {
		return nil
	}
	var errs []error
	if f.audience == "" {
		errs = append(errs, errors.New("--nats-token-audience must not be empty"))
	}
	if f.tokenSeconds < 600 || f.tokenSeconds > 86400 {
		errs = append(errs, fmt.Errorf("--nats-token-expiration-seconds must be from 600 (the kubelet's minimum) to 86400, not %d", f.tokenSeconds))
	}
	return errors.Join(errs...)
}

func (f *busAuthFlags) busAuth() controllers.BusAuth {
	return controllers.BusAuth{Callout: f.enabled, Audience: f.audience, TokenSeconds: f.tokenSeconds}
}

// calloutFlags configure the auth callout `webhook-operator callout` serves.
type calloutFlags struct {
	issuerSeedFile string
	xkeySeedFile   string
	audience       string
	maxSession     time.Duration
	ingress        string
	dataAPI        string
	limits         natsauth.Limits
	ratePerHost    float64
	burstPerHost   int
	refusalTTL     time.Duration
}

// addLimitFlags binds the limits of every tenant connection: the callout writes them into the
// user JWTs it issues, nats-config into the server's configuration (the two must agree).
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
	fs.StringVar(&f.issuerSeedFile, "nats-callout-issuer-seed-file", "", "account nkey seed (SA...) the callout signs users with; its public key is the server's auth_callout issuer (required)")
	fs.StringVar(&f.xkeySeedFile, "nats-callout-xkey-seed-file", "", "curve key seed (SX...) when the server encrypts authorization requests (auth_callout xkey)")
	fs.StringVar(&f.audience, "nats-token-audience", natsauth.DefaultAudience, "audience of the Kubernetes tokens the callout accepts (the dispatchers' projected tokens, producers', kubectl webhooks')")
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
	var errs []error
	if l := f.limits; l.MaxPayload < int64(maxEventBytes)+recordHeadroom {
		errs = append(errs, fmt.Errorf("--nats-user-max-payload (%d) must be at least --max-event-bytes (%d) plus 64Ki for the operator's headers and records", l.MaxPayload, maxEventBytes))
	}
	if f.limits.MaxSubscriptions < 16 || f.limits.MaxData < 1 {
		errs = append(errs, errors.New("--nats-user-max-subscriptions must be at least 16 and --nats-user-max-data positive"))
	}
	if f.issuerSeedFile == "" {
		errs = append(errs, errors.New("the callout needs --nats-callout-issuer-seed-file"))
	}
	if f.audience == "" {
		errs = append(errs, errors.New("--nats-token-audience must not be empty"))
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

// callout serves the auth callout on every replica of `webhook-operator callout` (there is no
// leader), so that connections never wait for an election.
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

func init() { subcommands = append(subcommands, calloutCommand) }

// calloutCommand is `webhook-operator callout`: the auth callout in a process of its own,
// apart from the controller, which runs tenants' expressions (WebhookErasures): nothing a
// tenant writes runs where every namespace's connections are authorized. It reads what the
// callout decides on (ServiceAccounts, WebhookEndpoints, Namespaces, WebhookQuotas) through a
// cache, reviews tokens (TokenReview, SubjectAccessReview), and signs with the issuer seed it
// alone mounts.
func calloutCommand() *cobra.Command {
	cfg := opconfig.Default()
	f := &calloutFlags{}
	var metricsAddr, probeAddr string
	var zapOpts zap.Options
	cmd := &cobra.Command{
		Use:   "callout",
		Short: "Serve NATS's auth callout: tenants connect with Kubernetes tokens and get their namespace's permissions only",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := errors.Join(cfg.Validate(), f.validate(cfg.MaxEventBytes)); err != nil {
				return err
			}
			log := zap.New(zap.UseFlagOptions(&zapOpts))
			ctrl.SetLogger(log)
			rc, err := ctrl.GetConfig()
			if err != nil {
				return fmt.Errorf("reaching the API server: %w", err)
			}
			mgr, err := ctrl.NewManager(rc, ctrl.Options{
				Scheme:                 scheme.New(),
				Cache:                  controllers.CacheOptions(),
				Metrics:                metricsauth.ServerOptions(metricsAddr, cfg.MetricsSecure),
				HealthProbeBindAddress: probeAddr,
				Logger:                 log,
			})
			if err != nil {
				return fmt.Errorf("creating the manager: %w", err)
			}
			c, err := newCallout(f, &cfg, mgr, log)
			if err != nil {
				return err
			}
			if err := mgr.Add(c); err != nil {
				return err
			}
			if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
				return err
			}
			if err := mgr.AddReadyzCheck("nats-callout", c.ready); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			log.Info("serving the NATS auth callout", "version", version.Version, "nats", cfg.NATS.URL, "audience", f.audience,
				"encrypted", f.xkeySeedFile != "", "ingress", f.ingress)
			return mgr.Start(ctx)
		},
	}
	fs := cmd.Flags()
	cfg.AddFlags(fs)
	f.add(fs)
	fs.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "address of /metrics (0 disables)")
	fs.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (ready once connected to NATS; 0 disables)")
	gfs := &goFlagSet{}
	zapOpts.BindFlags(gfs.fs())
	fs.AddGoFlagSet(gfs.fs())
	return cmd
}
