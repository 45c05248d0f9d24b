package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/attribute"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/kubeauth"
	"github.com/webhook-operator/webhook-operator/internal/metricsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/quota"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

func init() { subcommands = append(subcommands, ingressCommand) }

// ingressFlags are the ingress's own settings.
type ingressFlags struct {
	srv            ingress.ServerOptions
	metricsAddr    string
	probeAddr      string
	audiences      []string
	cacheTTL       time.Duration
	cacheSize      int
	rate           float64
	burst          int
	maxBatchEvents int
	maxBatchBytes  *resource.Quantity
	maxConcurrent  int
	maxReviews     int
	maxBodies      *resource.Quantity
	maxNSBodies    *resource.Quantity
	publishTimeout time.Duration
	identity       string
	replicas       int
}

func ingressCommand() *cobra.Command {
	cfg := opconfig.Default()
	f := ingressFlags{maxBatchBytes: resource.NewQuantity(ingress.DefaultMaxBatchBytes, resource.BinarySI),
		maxBodies: resource.NewQuantity(ingress.DefaultMaxBodyBytesInFlight, resource.BinarySI), maxNSBodies: resource.NewQuantity(0, resource.BinarySI)}
	var zapOpts zap.Options
	cmd := &cobra.Command{
		Use:   "ingress",
		Short: "Publish events over HTTP (JSON and CloudEvents) for callers Kubernetes RBAC allows (create on webhookevents)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			if len(f.audiences) == 0 {
				return errors.New("--token-audience must name at least one audience")
			}
			if f.rate < 0 || f.burst < 0 {
				return errors.New("--rate-limit and --rate-burst must not be negative")
			}
			if f.maxBodies.Value() < f.maxBatchBytes.Value() || f.maxNSBodies.Value() != 0 && f.maxNSBodies.Value() < f.maxBatchBytes.Value() {
				return fmt.Errorf("--max-body-bytes-in-flight (%s) and --max-body-bytes-per-namespace (%s) must each hold at least one batch (--max-batch-bytes %s)",
					f.maxBodies, f.maxNSBodies, f.maxBatchBytes)
			}
			log := zap.New(zap.UseFlagOptions(&zapOpts))
			ctrl.SetLogger(log)
			ingress.SetMemoryLimit()
			if f.identity == "" {
				f.identity = os.Getenv("POD_NAME")
			}
			// Through the auth callout the ingress asks for its own namespace: its ServiceAccount's
			// RoleIngress is granted there (and names every namespace's event subjects).
			if cfg.NATS.TokenFile != "" && cfg.NATS.Namespace == "" {
				cfg.NATS.Namespace = os.Getenv("POD_NAMESPACE")
				if cfg.NATS.Namespace == "" {
					return errors.New("--nats-token-file needs the ingress's namespace: set POD_NAMESPACE")
				}
			}
			rc, err := ctrl.GetConfig()
			if err != nil {
				return fmt.Errorf("reaching the API server: %w", err)
			}
			cs, err := kubernetes.NewForConfig(rc)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			tracer, shutdown, err := tracing.FromEnv(ctx, "webhook-ingress", attribute.String("k8s.pod.name", f.identity))
			if err != nil {
				return err
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = shutdown(sctx)
			}()
			if tracer != nil {
				log.Info("tracing: every published event is a span, exported with OTLP as the OTEL_* environment says")
			}

			name := "webhook-ingress"
			if f.identity != "" {
				name += " " + f.identity
			}
			nc, js, err := cfg.Connect(name,
				nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
					if err != nil {
						log.Info("disconnected from NATS", "error", err.Error())
					}
				}),
				nats.ReconnectHandler(func(*nats.Conn) { log.Info("reconnected to NATS") }))
			if err != nil {
				return err
			}
			defer nc.Close()
			reg := ctrlmetrics.Registry
			if err := reg.Register(opconfig.NATSConnectedMetric(nc.IsConnected)); err != nil {
				return err
			}
			m := ingress.NewMetrics(reg)
			// Namespaces whose WebhookQuota sets a publish rate get this replica's share of it.
			rates := &quota.RateTable{Replicas: f.replicas}
			h := ingress.NewHandler(ingress.Options{
				JS: js, MaxPayload: nc.MaxPayload, Names: cfg.Streams.Names,
				Auth: &ingress.Authorizer{Reviewer: kubeauth.Reviewer{Client: cs}, Audiences: f.audiences, TTL: f.cacheTTL, Size: f.cacheSize,
					MaxReviews: f.maxReviews, Observe: m.AuthLookup},
				RateLimit:     &ingress.RateLimiter{Rate: f.rate, Burst: f.burst, Namespace: rates.Lookup},
				MaxEventBytes: cfg.MaxEventBytes, MaxBatchEvents: f.maxBatchEvents, MaxBatchBytes: f.maxBatchBytes.Value(),
				MaxConcurrent: f.maxConcurrent, PublishTimeout: f.publishTimeout,
				MaxBodyBytesInFlight: f.maxBodies.Value(), MaxBodyBytesPerNamespace: f.maxNSBodies.Value(),
				Tracer: tracer, Metrics: m, Log: log.WithName("ingress"),
			})
			mgr, err := manager.New(rc, manager.Options{
				Scheme:                 scheme.New(),
				Metrics:                metricsauth.ServerOptions(f.metricsAddr, cfg.MetricsSecure),
				HealthProbeBindAddress: f.probeAddr,
				Logger:                 log,
			})
			if err != nil {
				return fmt.Errorf("creating the manager: %w", err)
			}
			quotas, err := mgr.GetCache().GetInformer(ctx, &v1alpha1.WebhookQuota{})
			if err != nil {
				return fmt.Errorf("watching WebhookQuotas: %w", err)
			}
			if _, err := quotas.AddEventHandler(rates.Handler()); err != nil {
				return err
			}
			// Not ready before it knows every namespace's rate.
			_ = mgr.AddReadyzCheck("quotas", func(*http.Request) error {
				if !quotas.HasSynced() {
					return errors.New("the WebhookQuotas are not read yet")
				}
				return nil
			})
			_ = mgr.AddHealthzCheck("ping", healthz.Ping)
			_ = mgr.AddReadyzCheck("nats", func(*http.Request) error {
				if !nc.IsConnected() {
					return errors.New("not connected to NATS")
				}
				return nil
			})
			f.srv.Log, f.srv.Metrics = log, m
			if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
				return ingress.Serve(ctx, h, f.srv, func(a net.Addr) {
					log.Info("ingress serving", "address", a.String(), "tls", f.srv.CertFile != "", "nats", nc.ConnectedUrl(),
						"audiences", f.audiences, "rateLimit", f.rate)
				})
			})); err != nil {
				return err
			}
			return mgr.Start(ctx)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.srv.Addr, "bind-address", ":8088", "address the ingress serves its API on")
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", "address of /metrics (0 disables)")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 disables)")
	fs.StringVar(&f.srv.CertFile, "tls-cert-file", "", "serve HTTPS with this certificate (PEM; read again when renewed)")
	fs.StringVar(&f.srv.KeyFile, "tls-key-file", "", "key of --tls-cert-file")
	fs.StringSliceVar(&f.audiences, "token-audience", []string{ingress.DefaultAudience},
		"audiences the callers' bearer tokens may be issued for (repeatable); add the API server's own to accept kubeconfig tokens too")
	fs.DurationVar(&f.cacheTTL, "auth-cache-ttl", ingress.DefaultAuthCacheTTL, "how long a caller's authorization (or refusal) is kept before it is asked again (never beyond its token's expiry)")
	fs.IntVar(&f.cacheSize, "auth-cache-size", ingress.DefaultAuthCacheSize, "most authorization decisions kept")
	fs.Float64Var(&f.rate, "rate-limit", 0, "events per second each namespace may publish through this replica (0: unlimited); more get 429 with Retry-After")
	fs.IntVar(&f.burst, "rate-burst", 0, "events a namespace may publish at once above --rate-limit (default: the rate, at least 1)")
	fs.IntVar(&f.maxBatchEvents, "max-batch-events", ingress.DefaultMaxBatchEvents, "most events in one batch")
	fs.Var(quantityFlag{f.maxBatchBytes}, "max-batch-bytes", "largest batch body (one event's body is bounded by --max-event-bytes and its envelope)")
	fs.IntVar(&f.maxConcurrent, "max-concurrent-requests", ingress.DefaultMaxConcurrent, "requests handled at once (once authenticated); more are answered 503 with Retry-After")
	fs.IntVar(&f.maxReviews, "max-reviews-in-flight", ingress.DefaultMaxReviews, "TokenReviews of unseen tokens in flight at once; callers beyond are answered 503 with Retry-After (cached callers go on)")
	fs.Var(quantityFlag{f.maxBodies}, "max-body-bytes-in-flight", "bytes of request bodies held at once; a body that would need more is answered 503 with Retry-After")
	fs.Var(quantityFlag{f.maxNSBodies}, "max-body-bytes-per-namespace", "bytes of one namespace's request bodies held at once (default: a quarter of --max-body-bytes-in-flight)")
	fs.IntVar(&f.srv.MaxConnections, "max-connections", ingress.DefaultMaxConnections, "connections open at once; one more is closed as soon as it is accepted")
	fs.IntVar(&f.srv.MaxConnectionsPerClient, "max-connections-per-client", ingress.DefaultMaxConnectionsPerClient, "connections open at once from one client address (-1: no bound; raise it behind a proxy or load balancer that hides clients' addresses)")
	fs.DurationVar(&f.publishTimeout, "publish-timeout", ingress.DefaultPublishTimeout, "how long a request waits for JetStream's acknowledgements")
	fs.DurationVar(&f.srv.ReadHeaderTimeout, "read-header-timeout", ingress.DefaultReadHeaderTimeout, "how long a request's headers may take to arrive")
	fs.DurationVar(&f.srv.ReadTimeout, "read-timeout", ingress.DefaultReadTimeout, "how long a whole request may take to arrive")
	fs.DurationVar(&f.srv.WriteTimeout, "write-timeout", ingress.DefaultWriteTimeout, "how long a request may take from its headers to the end of its response")
	fs.IntVar(&f.srv.MaxHeaderBytes, "max-header-bytes", ingress.DefaultMaxHeaderBytes, "largest request header block")
	fs.DurationVar(&f.srv.ShutdownGrace, "shutdown-grace", 20*time.Second, "how long requests in flight may finish after SIGTERM")
	fs.StringVar(&f.identity, "identity", "", "this replica's name (default: $POD_NAME)")
	fs.IntVar(&f.replicas, "replicas", 1, "ingress replicas sharing a namespace's WebhookQuota publish rate: each allows this share of it")
	cfg.AddFlags(fs)
	gfs := &goFlagSet{}
	zapOpts.BindFlags(gfs.fs())
	fs.AddGoFlagSet(gfs.fs())
	return cmd
}
