package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/attribute"
	"k8s.io/apimachinery/pkg/api/resource"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/webhook-operator/webhook-operator/dispatcher"
	"github.com/webhook-operator/webhook-operator/dispatcher/shared"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/tracing"
)

func init() { subcommands = append(subcommands, dispatcherCommand) }

func dispatcherCommand() *cobra.Command {
	cfg := opconfig.Default()
	o := dispatcher.Options{}
	var zapOpts zap.Options
	budget := resource.NewQuantity(dispatcher.DefaultMemoryBudget, resource.BinarySI)
	var pool sharedFlags
	cmd := &cobra.Command{
		Use:   "dispatcher --namespace=<ns> [--endpoint=<name>] | --shared",
		Short: "Deliver a namespace's events to its webhook endpoints (run by the dispatcher Deployments), or many namespaces' (--shared)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if pool.shared == (o.Namespace != "") {
				return fmt.Errorf("give either --namespace (a namespace's dispatcher) or --shared (the installation's shared dispatcher)")
			}
			if pool.shared && o.Endpoint != "" {
				return fmt.Errorf("--endpoint names a dedicated dispatcher's endpoint: not with --shared")
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			if o.Replicas == 0 {
				if v, err := strconv.Atoi(os.Getenv("WEBHOOK_DISPATCHER_REPLICAS")); err == nil {
					o.Replicas = v
				}
			}
			if o.Identity == "" {
				o.Identity = os.Getenv("POD_NAME")
			}
			o.MemoryBudget = budget.Value()
			if o.MemoryBudget <= 0 {
				return fmt.Errorf("--memory-budget must be positive, not %s", budget)
			}
			if !pool.shared {
				// A shared dispatcher holds a budget for each namespace it serves: a soft
				// limit of one namespace's would keep its collector running without end.
				dispatcher.SetMemoryLimit(o.MemoryBudget)
			}
			log := zap.New(zap.UseFlagOptions(&zapOpts))
			ctrl.SetLogger(log)
			o.Logger = log
			// A token connection asks for the namespace it serves.
			cfg.NATS.Namespace = o.Namespace
			o.Config = cfg
			rc, err := ctrl.GetConfig()
			if err != nil {
				return fmt.Errorf("reaching the API server: %w", err)
			}
			o.RestConfig = rc
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			ns := o.Namespace
			if pool.shared {
				ns = os.Getenv("POD_NAMESPACE")
			}
			tracer, shutdown, err := tracing.FromEnv(ctx, "webhook-dispatcher",
				attribute.String("k8s.namespace.name", ns), attribute.String("k8s.pod.name", o.Identity))
			if err != nil {
				return err
			}
			if tracer != nil {
				log.Info("tracing: every delivery attempt is a span, exported with OTLP as the OTEL_* environment says")
			}
			defer func() {
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = shutdown(sctx)
			}()
			o.Tracer = tracer
			if pool.shared {
				return pool.run(ctx, o)
			}
			return dispatcher.Run(ctx, o)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Namespace, "namespace", "", "namespace whose endpoints this dispatcher serves")
	fs.StringVar(&o.Endpoint, "endpoint", "", "the one dedicated endpoint this dispatcher serves")
	fs.IntVar(&o.Replicas, "replicas", 0, "replicas of this dispatcher (default: $WEBHOOK_DISPATCHER_REPLICAS, else 1); rate limits are divided among them")
	fs.StringVar(&o.Identity, "identity", "", "this replica's identity (default: $POD_NAME, else host and pid)")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "address of /metrics (0 disables)")
	fs.StringVar(&o.MetricsClientCerts.CAFile, "metrics-client-ca-file", "", "PEM CA bundle of the scrapers: with --metrics-secure, /metrics is served over mutual TLS to client certificates it signed, and asks the API server nothing (the controller mounts its mirror of --dispatcher-metrics-ca-secret); read again when it changes")
	fs.StringVar(&o.MetricsClientCerts.Name, "metrics-client-name", "", "subject common name a scraper's client certificate must carry (empty: any the CA signed)")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 disables)")
	fs.DurationVar(&o.ShutdownGrace, "shutdown-grace", 25*time.Second, "how long in-flight deliveries may finish after SIGTERM")
	fs.DurationVar(&o.StatusInterval, "status-interval", 5*time.Second, "at most how often an active endpoint's status is written")
	fs.DurationVar(&o.LeaseTTL, "lease-ttl", 10*time.Second, "how long a silent replica keeps the leases of its partitions")
	fs.IntVar(&o.Partitions, "partitions", dispatcher.DefaultPartitions, "partitions a dispatcher's endpoints fall into, shared among its replicas: the holder of an endpoint's partition alone delivers it when it is PerKey or rate-limited and writes its status, and each endpoint's maxInFlight is divided among the partitions")
	fs.StringVar(&o.EgressProxyCredentials, "egress-proxy-credentials-dir", "", "directory with the --egress-proxy credentials as files username and password (the controller mounts its mirror of --egress-proxy-credentials-secret there), read at every new tunnel")
	fs.Var(quantityFlag{budget}, "memory-budget", "bytes of events and deliveries held in memory at most (more wait in the streams); the default fits the chart's 256Mi memory limit, with the Go runtime's soft memory limit set to twice this plus 48Mi unless GOMEMLIMIT is set")
	pool.addFlags(fs)
	cfg.AddFlags(fs)
	gfs := &goFlagSet{}
	zapOpts.BindFlags(gfs.fs())
	fs.AddGoFlagSet(gfs.fs())
	return cmd
}

// quantityFlag is a flag holding a Kubernetes quantity (64Mi, 1Gi).
type quantityFlag struct{ q *resource.Quantity }

func (f quantityFlag) String() string { return f.q.String() }
func (f quantityFlag) Type() string   { return "quantity" }
func (f quantityFlag) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return err
	}
	*f.q = q
	return nil
}

// sharedFlags configure the installation's shared dispatcher (--shared).
type sharedFlags struct {
	shared    bool
	configMap string
	tokens    string
	audience  string
	idleAfter time.Duration
	budget    *resource.Quantity
}

func (f *sharedFlags) addFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&f.shared, "shared", false, "serve every namespace the pool ConfigMap (--namespaces-configmap, in this pod's namespace) lists, each with its own dispatcher ServiceAccount's tokens, which this pod's ServiceAccount may create there (the controller's --shared-dispatcher)")
	fs.StringVar(&f.configMap, "namespaces-configmap", names.SharedPool, "with --shared: the ConfigMap of this pod's namespace that lists the namespaces to serve (key "+shared.NamespacesKey+", one a line)")
	fs.StringVar(&f.tokens, "tokens-dir", "/var/run/webhook-operator/tokens", "with --shared: where the served namespaces' tokens are kept (a memory-backed volume)")
	fs.StringVar(&f.audience, "nats-token-audience", natsauth.DefaultAudience, "with --shared: the audience of the namespaces' bus tokens (the auth callout's)")
	f.budget = resource.NewQuantity(128<<20, resource.BinarySI)
	fs.Var(quantityFlag{f.budget}, "shared-memory-budget", "with --shared: bytes of events and deliveries the whole process holds at most, shared by the namespaces it serves, each also within --memory-budget (one that holds nothing may always take a message); the default fits the chart's 256Mi memory limit (the controller passes half the Deployment's memory limit)")
	fs.DurationVar(&f.idleAfter, "idle-after", time.Minute, "with --shared: how long a namespace has nothing to do before its dispatcher stops until an event, a replay or a change of its endpoints arrives (0: never)")
}

// run runs the shared dispatcher with o as every namespace's dispatcher options.
func (f *sharedFlags) run(ctx context.Context, o dispatcher.Options) error {
	home := os.Getenv("POD_NAMESPACE")
	if home == "" {
		return fmt.Errorf("--shared needs $POD_NAMESPACE, the namespace of its pool ConfigMap")
	}
	s, err := shared.New(shared.Options{Dispatcher: o, RestConfig: o.RestConfig, Audience: f.audience, Dir: f.tokens,
		MetricsAddr: o.MetricsAddr, ProbeAddr: o.ProbeAddr, IdleAfter: f.idleAfter, MemoryBudget: f.budget.Value(), Logger: o.Logger})
	if err != nil {
		return err
	}
	followCtx, stopFollowing := context.WithCancel(ctx)
	defer stopFollowing()
	go s.Follow(followCtx, home, f.configMap)
	return s.Run(ctx)
}
