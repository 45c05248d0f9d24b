package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/controllers"
	"github.com/webhook-operator/webhook-operator/internal/metricsauth"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/scheme"
	"github.com/webhook-operator/webhook-operator/internal/version"
)

func init() { subcommands = append(subcommands, controllerCommand) }

// controllerFlags are the controller's own flags; the installation-wide ones are opconfig's.
type controllerFlags struct {
	cfg                     opconfig.Config
	dispatcherImage         string
	dispatcherReplicas      int32
	cpuRequest, memRequest  string
	cpuLimit, memLimit      string
	maxReplicas             int32
	maxEndpoints            int32
	maxCPU, maxMemory       string
	leaderElect             bool
	leaderElectionNamespace string
	metricsAddr, probeAddr  string
	pprofAddr               string
	maxConcurrentReconciles int
	replayTTL               time.Duration
	maxErasures             int
	maxErasuresPerNamespace int
	retentionInterval       time.Duration
	egress                  egressFlags
	autoscale               bool
	autoscaling             controllers.Autoscaling
	dispatcherOTELEnv       []string
	dispatcherOTELSecret    string
	egressProxySecret       string
	metricsCASecret         string
	metricsClientName       string
	excludedNamespaces      []string
	busAuth                 busAuthFlags
	sharedDispatcher        bool
	sharedIdleAfter         time.Duration
}

// defaultExcludedNamespaces are the namespaces the controller never acts in unless the
// installer says otherwise (its own namespace is always added).
var defaultExcludedNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// newControllerFlags returns the flags with their defaults.
func newControllerFlags() *controllerFlags {
	return &controllerFlags{cfg: opconfig.Default(), autoscaling: controllers.DefaultAutoscaling()}
}

// egressFlags ask for an egress NetworkPolicy per dispatcher and say where DNS, NATS and the API
// server are.
type egressFlags struct {
	enabled        bool
	dns, nats      string // JSON lists of NetworkPolicyPeers
	apiServerCIDRs []string
	apiServerPorts []int32
}

func (f *controllerFlags) add(fs *pflag.FlagSet) {
	f.cfg.AddFlags(fs)
	fs.StringVar(&f.dispatcherImage, "dispatcher-image", os.Getenv("OPERATOR_IMAGE"), "image of dispatcher Deployments: the operator's own (default $OPERATOR_IMAGE)")
	fs.Int32Var(&f.dispatcherReplicas, "dispatcher-replicas", 1, "replicas of each shared dispatcher (dedicated ones: spec.dispatcher.replicas)")
	fs.BoolVar(&f.sharedDispatcher, "shared-dispatcher", false, "serve the endpoints of every namespace without a dedicated dispatcher with one shared dispatcher Deployment in the controller's namespace, each namespace under its own dispatcher ServiceAccount's tokens, instead of a dispatcher Deployment per namespace (a namespace labelled "+names.LabelOwnDispatcher+"=true keeps its own); needs the auth callout")
	fs.DurationVar(&f.sharedIdleAfter, "shared-dispatcher-idle-after", time.Minute, "with --shared-dispatcher: how long a namespace has nothing to do before the shared dispatcher stops serving it until an event, a replay or a change of its endpoints arrives (0: never)")
	fs.StringVar(&f.cpuRequest, "dispatcher-cpu-request", "100m", "CPU request of a dispatcher container (empty: none)")
	fs.StringVar(&f.memRequest, "dispatcher-memory-request", "64Mi", "memory request of a dispatcher container (empty: none)")
	fs.StringVar(&f.cpuLimit, "dispatcher-cpu-limit", "1", "CPU limit of a dispatcher container, and of a dedicated one that sets none (empty: none)")
	fs.StringVar(&f.memLimit, "dispatcher-memory-limit", "256Mi", "memory limit of a dispatcher container, and of a dedicated one that sets none (empty: none)")
	fs.Int32Var(&f.maxEndpoints, "max-endpoints-per-namespace", 1000, "most endpoints a namespace may have when its WebhookQuota sets no spec.maxEndpoints, or it has none: endpoints in creation order, each beyond it Ready False QuotaExceeded, as under a quota's maxEndpoints; 0 leaves them unbounded")
	fs.Int32Var(&f.maxReplicas, "dispatcher-max-replicas", 10, "most replicas an endpoint's dedicated dispatcher runs (spec.dispatcher.replicas above it runs at it, and the endpoint's DispatcherCapped condition says so); 1 to 20")
	fs.StringVar(&f.maxCPU, "dispatcher-max-cpu", "2", "largest CPU request or limit of a dedicated dispatcher (spec.dispatcher.resources above it run at it; empty: no cap)")
	fs.StringVar(&f.maxMemory, "dispatcher-max-memory", "1Gi", "largest memory request or limit of a dedicated dispatcher (spec.dispatcher.resources above it run at it; empty: no cap)")
	fs.BoolVar(&f.leaderElect, "leader-elect", false, "elect a leader, so that several controller replicas can run with one active")
	fs.StringVar(&f.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the controller's own, in a cluster)")
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus /metrics endpoint (0 disables)")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 disables)")
	fs.StringVar(&f.pprofAddr, "pprof-bind-address", "0", "address of Go's /debug/pprof profiles, for measuring the controller's memory and CPU (0 disables; keep it off any network others reach)")
	fs.IntVar(&f.maxConcurrentReconciles, "max-concurrent-reconciles", 16, "reconciles running at once, per kind (they mostly wait on the API server and NATS)")
	fs.DurationVar(&f.retentionInterval, "payload-retention-interval", controllers.DefaultRetentionInterval, "how often payloads past their retention (spec.payloadRetention, a WebhookQuota's retention) are removed from the delivery log and the dead letters")
	fs.IntVar(&f.maxErasures, "max-erasures", controllers.DefaultMaxErasures, "WebhookErasures in progress at once (each holds the ids of the events it matched, up to 100,000, in the controller's memory); the others wait, Queued")
	fs.IntVar(&f.maxErasuresPerNamespace, "max-erasures-per-namespace", controllers.DefaultMaxErasuresPerNamespace, "WebhookErasures of one namespace in progress at once (at most --max-erasures)")
	fs.DurationVar(&f.replayTTL, "replay-ttl", controllers.DefaultReplayTTL, "how long a completed WebhookReplay is kept before it is deleted (0 keeps it; a replay's "+v1alpha1.AnnotationTTLAfterComplete+" annotation overrides it)")

	fs.StringSliceVar(&f.excludedNamespaces, "excluded-namespaces", defaultExcludedNamespaces, "namespaces the controller never acts in, besides its own: an endpoint there is Stalled (NamespaceExcluded) and gets no dispatcher, Secret or consumer, and none reads their events (the chart's admission policy refuses the controller's objects there too)")
	fs.StringArrayVar(&f.dispatcherOTELEnv, "dispatcher-otel-env", nil, "an OTEL_* environment variable (NAME=VALUE) set on every dispatcher, repeatable: the standard OpenTelemetry settings that turn on traces of deliveries (e.g. OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4317, OTEL_EXPORTER_OTLP_PROTOCOL=grpc). Its values show in every dispatcher's pod template: headers and certificate or key files are refused here (use --dispatcher-otel-env-secret)")
	fs.StringVar(&f.egressProxySecret, "egress-proxy-credentials-secret", "", "a Secret of the controller's namespace (type kubernetes.io/basic-auth: keys username and password) with the credentials of --egress-proxy; the controller mirrors those keys into each dispatcher namespace, where the dispatchers read them at every new tunnel")
	fs.StringVar(&f.metricsCASecret, "dispatcher-metrics-ca-secret", "", "a Secret of the controller's namespace whose ca.crt is the scraper CA: with --metrics-secure (which needs it) the dispatchers serve /metrics over mutual TLS to client certificates it signed, asking the API server nothing; the controller mirrors ca.crt alone into each dispatcher namespace")
	fs.StringVar(&f.metricsClientName, "dispatcher-metrics-client-name", "", "the subject common name the dispatchers require of a scraper's client certificate (empty: any the scraper CA signed)")
	fs.StringVar(&f.dispatcherOTELSecret, "dispatcher-otel-env-secret", "", "a Secret of the controller's namespace holding the dispatchers' tracing credentials: OTEL_* keys (e.g. OTEL_EXPORTER_OTLP_HEADERS) set on every dispatcher by reference, and ca.crt, tls.crt, tls.key mounted for the OTLP exporter; the controller mirrors it into each dispatcher namespace")

	a := &f.autoscaling
	fs.BoolVar(&f.autoscale, "autoscaling", false, "scale every dispatcher Deployment on its endpoints' pending deliveries with a KEDA ScaledObject (needs KEDA); the controller then no longer sets their replicas")
	fs.StringVar(&a.MonitoringEndpoint, "autoscaling-nats-monitoring-endpoint", a.MonitoringEndpoint, "host:port of a NATS server's HTTP monitoring endpoint, which KEDA reads the consumers' lag from (e.g. nats.nats.svc:8222)")
	fs.BoolVar(&a.MonitoringHTTPS, "autoscaling-nats-monitoring-https", a.MonitoringHTTPS, "the NATS monitoring endpoint speaks HTTPS")
	fs.StringVar(&a.Account, "autoscaling-nats-account", a.Account, "NATS account holding the streams ($G when the servers define no accounts)")
	fs.Int32Var(&a.MaxReplicas, "autoscaling-max-replicas", a.MaxReplicas, "most replicas of a dispatcher (the fewest are --dispatcher-replicas or spec.dispatcher.replicas)")
	fs.Int64Var(&a.LagThreshold, "autoscaling-lag-threshold", a.LagThreshold, "pending deliveries of one endpoint per replica: an endpoint with n times this lag asks for n replicas")
	fs.DurationVar(&a.PollingInterval, "autoscaling-polling-interval", a.PollingInterval, "how often KEDA reads the lags")
	fs.BoolVar(&f.egress.enabled, "dispatcher-egress-policy", false, "give every dispatcher an egress NetworkPolicy: DNS, NATS, the API server, and receivers outside the ranges the outbound guard refuses (plus --allowed-cidrs)")
	fs.StringVar(&f.egress.dns, "dispatcher-egress-dns-to", "", `the DNS servers' NetworkPolicyPeers as JSON, e.g. [{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"kube-system"}}}] (empty: any destination on port 53)`)
	fs.StringVar(&f.egress.nats, "dispatcher-egress-nats-to", "", "the NATS servers' NetworkPolicyPeers as JSON (empty: any destination on the --nats-url ports)")
	fs.StringSliceVar(&f.egress.apiServerCIDRs, "dispatcher-egress-api-server-cidrs", nil, "CIDRs of the Kubernetes API server's endpoints (empty: any destination on the API server ports)")
	fs.Int32SliceVar(&f.egress.apiServerPorts, "dispatcher-egress-api-server-ports", []int32{443, 6443}, "ports of the Kubernetes API server's endpoints")
	f.busAuth.add(fs)
}

// policy is the dispatchers' egress policy the flags ask for, nil when they ask for none.
func (e *egressFlags) policy() (*controllers.EgressPolicy, error) {
	if !e.enabled {
		return nil, nil
	}
	p := &controllers.EgressPolicy{APIServerPorts: e.apiServerPorts}
	var errs []error
	for _, peers := range []struct {
		flag, value string
		into        *[]networkingv1.NetworkPolicyPeer
	}{{"--dispatcher-egress-dns-to", e.dns, &p.DNS}, {"--dispatcher-egress-nats-to", e.nats, &p.NATS}} {
		if strings.TrimSpace(peers.value) == "" {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(peers.value))
		dec.DisallowUnknownFields()
		if err := dec.Decode(peers.into); err != nil {
			errs = append(errs, fmt.Errorf("%s: a JSON list of NetworkPolicyPeers: %w", peers.flag, err))
		}
	}
	for _, c := range e.apiServerCIDRs {
		pr, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			errs = append(errs, fmt.Errorf("--dispatcher-egress-api-server-cidrs: %q is not a CIDR", c))
			continue
		}
		p.APIServer = append(p.APIServer, pr)
	}
	for _, port := range e.apiServerPorts {
		if port < 1 || port > 65535 {
			errs = append(errs, fmt.Errorf("--dispatcher-egress-api-server-ports: %d is not a port", port))
		}
	}
	return p, errors.Join(errs...)
}

// options validates the flags and turns them into the reconcilers' options.
func (f *controllerFlags) options() (*controllers.Options, error) {
	var errs []error
	if err := f.cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if f.dispatcherImage == "" {
		errs = append(errs, errors.New("--dispatcher-image is required (or set OPERATOR_IMAGE to the operator's image)"))
	}
	if f.dispatcherReplicas < 1 || f.dispatcherReplicas > 20 {
		errs = append(errs, fmt.Errorf("--dispatcher-replicas must be 1 to 20, not %d", f.dispatcherReplicas))
	}
	if f.replayTTL < 0 {
		errs = append(errs, fmt.Errorf("--replay-ttl must be 0 (keep completed replays) or more, not %s", f.replayTTL))
	}
	if err := f.busAuth.validate(); err != nil {
		errs = append(errs, err)
	}
	if f.maxErasures < 1 || f.maxErasuresPerNamespace < 1 || f.maxErasuresPerNamespace > f.maxErasures {
		errs = append(errs, fmt.Errorf("--max-erasures (%d) and --max-erasures-per-namespace (%d) must be at least 1, the second at most the first", f.maxErasures, f.maxErasuresPerNamespace))
	}
	if f.maxConcurrentReconciles < 1 {
		errs = append(errs, fmt.Errorf("--max-concurrent-reconciles must be at least 1, not %d", f.maxConcurrentReconciles))
	}
	var autoscaling *controllers.Autoscaling
	if f.autoscale {
		if err := f.autoscaling.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("--autoscaling: %w", err))
		}
		a := f.autoscaling
		autoscaling = &a
	}
	otelEnv, err := parseOTELEnv(f.dispatcherOTELEnv)
	if err != nil {
		errs = append(errs, err)
	}
	var otelSecret types.NamespacedName
	if f.dispatcherOTELSecret != "" {
		otelSecret = types.NamespacedName{Namespace: f.ownNamespace(), Name: f.dispatcherOTELSecret}
		switch {
		case otelSecret.Namespace == "":
			errs = append(errs, errors.New("--dispatcher-otel-env-secret needs the controller's own namespace ($POD_NAMESPACE or --leader-election-namespace), where the Secret is"))
		case len(validation.IsDNS1123Subdomain(f.dispatcherOTELSecret)) > 0:
			errs = append(errs, fmt.Errorf("--dispatcher-otel-env-secret=%q: the name of a Secret of the controller's namespace", f.dispatcherOTELSecret))
		}
	}
	var egressSecret types.NamespacedName
	if f.egressProxySecret != "" {
		egressSecret = types.NamespacedName{Namespace: f.ownNamespace(), Name: f.egressProxySecret}
		switch {
		case egressSecret.Namespace == "":
			errs = append(errs, errors.New("--egress-proxy-credentials-secret needs the controller's own namespace ($POD_NAMESPACE or --leader-election-namespace), where the Secret is"))
		case len(validation.IsDNS1123Subdomain(f.egressProxySecret)) > 0:
			errs = append(errs, fmt.Errorf("--egress-proxy-credentials-secret=%q: the name of a Secret of the controller's namespace", f.egressProxySecret))
		case f.cfg.EgressProxy == "":
			errs = append(errs, errors.New("--egress-proxy-credentials-secret needs --egress-proxy: the proxy they open"))
		}
	}
	var metricsCA types.NamespacedName
	switch {
	case f.metricsCASecret != "":
		metricsCA = types.NamespacedName{Namespace: f.ownNamespace(), Name: f.metricsCASecret}
		switch {
		case metricsCA.Namespace == "":
			errs = append(errs, errors.New("--dispatcher-metrics-ca-secret needs the controller's own namespace ($POD_NAMESPACE or --leader-election-namespace), where the Secret is"))
		case len(validation.IsDNS1123Subdomain(f.metricsCASecret)) > 0:
			errs = append(errs, fmt.Errorf("--dispatcher-metrics-ca-secret=%q: the name of a Secret of the controller's namespace", f.metricsCASecret))
		}
	case f.cfg.MetricsSecure:
		errs = append(errs, errors.New("--metrics-secure needs --dispatcher-metrics-ca-secret: the dispatchers know their scrapers by client certificates of that CA (they may not ask the API server); or --metrics-secure=false"))
	}
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	caps := controllers.DispatcherCaps{MaxReplicas: f.maxReplicas, MaxResources: corev1.ResourceList{}}
	if f.maxEndpoints < 0 {
		errs = append(errs, fmt.Errorf("--max-endpoints-per-namespace must be 0 (unbounded) or more, not %d", f.maxEndpoints))
	}
	if f.maxReplicas < 1 || f.maxReplicas > 20 {
		errs = append(errs, fmt.Errorf("--dispatcher-max-replicas must be 1 to 20, not %d", f.maxReplicas))
	}
	for _, q := range []struct {
		flag, value string
		list        corev1.ResourceList
		name        corev1.ResourceName
	}{
		{"--dispatcher-cpu-request", f.cpuRequest, res.Requests, corev1.ResourceCPU},
		{"--dispatcher-memory-request", f.memRequest, res.Requests, corev1.ResourceMemory},
		{"--dispatcher-cpu-limit", f.cpuLimit, res.Limits, corev1.ResourceCPU},
		{"--dispatcher-memory-limit", f.memLimit, res.Limits, corev1.ResourceMemory},
		{"--dispatcher-max-cpu", f.maxCPU, caps.MaxResources, corev1.ResourceCPU},
		{"--dispatcher-max-memory", f.maxMemory, caps.MaxResources, corev1.ResourceMemory},
	} {
		if q.value == "" {
			continue
		}
		v, err := resource.ParseQuantity(q.value)
		if err != nil || v.Sign() <= 0 {
			errs = append(errs, fmt.Errorf("%s must be a positive quantity such as 100m or 64Mi, not %q", q.flag, q.value))
			continue
		}
		q.list[q.name] = v
	}
	if err := caps.Check(f.dispatcherReplicas, res); err != nil {
		errs = append(errs, fmt.Errorf("%w (--dispatcher-replicas, --dispatcher-cpu-*, --dispatcher-memory-* against --dispatcher-max-*)", err))
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, hasReq := res.Requests[name]
		lim, hasLim := res.Limits[name]
		if hasReq && hasLim && req.Cmp(lim) > 0 {
			errs = append(errs, fmt.Errorf("the dispatcher's %s request (%s) exceeds its limit (%s)", name, req.String(), lim.String()))
		}
	}
	egress, err := f.egress.policy()
	if err != nil {
		errs = append(errs, err)
	}
	for _, ns := range f.excludedNamespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--excluded-namespaces: %q is not a namespace name: %s", ns, strings.Join(msgs, "; ")))
		}
	}
	if f.sharedDispatcher && !f.busAuth.busAuth().Callout {
		errs = append(errs, errors.New("--shared-dispatcher serves each namespace with that namespace's own bus identity, which the auth callout gives: it needs the callout (the chart's nats.auth.callout)"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &controllers.Options{
		Config:                      f.cfg,
		DispatcherImage:             f.dispatcherImage,
		DispatcherReplicas:          f.dispatcherReplicas,
		DispatcherResources:         res,
		DispatcherCaps:              caps,
		MaxEndpointsPerNamespace:    f.maxEndpoints,
		MaxConcurrentReconciles:     f.maxConcurrentReconciles,
		ReplayTTL:                   f.replayTTL,
		RetentionInterval:           f.retentionInterval,
		MaxErasures:                 f.maxErasures,
		MaxErasuresPerNamespace:     f.maxErasuresPerNamespace,
		Namespace:                   f.ownNamespace(),
		DispatcherEgress:            egress,
		BusAuth:                     f.busAuth.busAuth(),
		Autoscaling:                 autoscaling,
		DispatcherOTELEnv:           otelEnv,
		ExcludedNamespaces:          f.excludedNamespaces,
		DispatcherOTELSecret:        otelSecret,
		EgressProxySecret:           egressSecret,
		DispatcherMetricsCA:         metricsCA,
		DispatcherMetricsClientName: f.metricsClientName,
		SharedDispatcher:            f.sharedDispatcher,
		SharedIdleAfter:             f.sharedIdleAfter,
	}, nil
}

// parseOTELEnv reads --dispatcher-otel-env values: NAME=VALUE with an OTEL_* name, so the flag
// cannot override a dispatcher's other variables (its identity, its NATS credentials), and none
// that would put a secret in every dispatcher's pod template (controllers.OTELSecretOnly).
func parseOTELEnv(values []string) ([]corev1.EnvVar, error) {
	var out []corev1.EnvVar
	var errs []error
	seen := map[string]bool{}
	for _, v := range values {
		name, value, ok := strings.Cut(v, "=")
		switch {
		case !ok || !controllers.IsOTELEnvName(name):
			errs = append(errs, fmt.Errorf("--dispatcher-otel-env=%q: want NAME=VALUE with an OpenTelemetry variable name (OTEL_ followed by capitals, digits or '_')", v))
		case controllers.OTELSecretOnly(name) != "":
			errs = append(errs, fmt.Errorf("--dispatcher-otel-env sets %s, refused: %s", name, controllers.OTELSecretOnly(name)))
		case seen[name]:
			errs = append(errs, fmt.Errorf("--dispatcher-otel-env sets %s twice", name))
		default:
			seen[name] = true
			out = append(out, corev1.EnvVar{Name: name, Value: value})
		}
	}
	return out, errors.Join(errs...)
}

// ownNamespace is the controller's namespace: $POD_NAMESPACE (the chart sets it), else the
// leader election namespace.
func (f *controllerFlags) ownNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	return f.leaderElectionNamespace
}

func controllerCommand() *cobra.Command {
	f := newControllerFlags()
	var zapOpts zap.Options
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Reconcile WebhookEndpoints and RetryPolicies into dispatchers and JetStream wiring",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := f.options()
			if err != nil {
				return err
			}
			ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
			setMemoryLimit(os.Getenv)
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return runController(ctx, f, opts)
		},
	}
	f.add(cmd.Flags())
	// zap and controller-runtime's --kubeconfig bind to standard-library flag sets.
	gfs := flag.NewFlagSet("controller", flag.ContinueOnError)
	zapOpts.BindFlags(gfs)
	if kc := flag.CommandLine.Lookup("kubeconfig"); kc != nil {
		gfs.Var(kc.Value, kc.Name, kc.Usage)
	}
	cmd.Flags().AddGoFlagSet(gfs)
	return cmd
}

// runController runs the manager until ctx ends.
func runController(ctx context.Context, f *controllerFlags, opts *controllers.Options) error {
	log := ctrl.Log.WithName("controller")
	restConfig, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("reaching the API server: %w", err)
	}
	// API request latency (and client-side throttling, if any) in /metrics.
	metrics.RegisterRESTClientMetrics(metrics.MetricRequestLatency, metrics.MetricRateLimiterLatency)
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                        scheme.New(),
		Cache:                         controllers.CacheOptions(),
		Metrics:                       metricsauth.ServerOptions(f.metricsAddr, opts.Config.MetricsSecure),
		HealthProbeBindAddress:        f.probeAddr,
		PprofBindAddress:              f.pprofAddr,
		LeaderElection:                f.leaderElect,
		LeaderElectionID:              "webhook-operator-controller.webhook-operator.io",
		LeaderElectionNamespace:       f.leaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	js, err := controllers.ConnectJetStream(&opts.Config)
	if err != nil {
		return err
	}
	defer js.Close()
	// webhook_nats_connected (see opconfig.NATSConnectedMetric) in the controller's /metrics.
	if err := metrics.Registry.Register(opconfig.NATSConnectedMetric(js.Connected)); err != nil {
		return err
	}
	if err := controllers.Setup(ctx, mgr, opts, js); err != nil {
		return fmt.Errorf("setting up the reconcilers: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	log.Info("starting", "version", version.Version, "nats", opts.Config.NATS.URL, "dispatcherImage", opts.DispatcherImage,
		"leaderElection", f.leaderElect, "maxConcurrentReconciles", opts.MaxConcurrentReconciles, "authCallout", f.busAuth.enabled)
	return mgr.Start(ctx)
}
