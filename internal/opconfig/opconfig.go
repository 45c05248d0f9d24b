// Package opconfig is the operator's installation-wide configuration: how to reach NATS, the
// JetStream layout, and the outbound policy. The controller parses it from its flags and
// renders the same settings into every dispatcher Deployment's arguments (DispatcherArgs), so
// the two can never disagree.
package opconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/webhook-operator/webhook-operator/internal/egressproxy"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Flags that let Kubernetes tokens go where they could be captured.
const (
	FlagAllowPlaintextTokens   = "nats-allow-plaintext-tokens"
	FlagAllowAPIAudienceTokens = "nats-allow-api-audience-tokens"
)

// Environment variables read for NATS secrets, so they never appear in a process's arguments.
const (
	EnvNATSUser     = "NATS_USER"
	EnvNATSPassword = "NATS_PASSWORD"
	EnvNATSToken    = "NATS_TOKEN"
)

// NATS says how to connect to the NATS servers.
type NATS struct {
	// URL is a comma-separated list of server URLs.
	URL string
	// CredsFile is a NATS .creds file (JWT and NKey seed).
	CredsFile string
	// CAFile is a PEM bundle to trust for the servers' TLS certificates.
	CAFile string
	// CertFile and KeyFile are a client certificate and its key, presented to servers that
	// verify their clients. Both are read again at every (re)connection, so a renewed
	// certificate is used without a restart.
	CertFile, KeyFile string
	// TokenFile is a Kubernetes token (a projected ServiceAccount token) to connect through
	// the operator's auth callout; it is read again at every (re)connection.
	TokenFile string
	// Namespace is the namespace a token connection asks for (the NATS user).
	Namespace string
	// CredentialsSecret names the Secret ("namespace/name") the controller mirrors into every
	// dispatcher namespace. Keys: creds (a .creds file), user, password, token, ca.crt.
	CredentialsSecret string
	// AllowPlaintextTokens lets a connection send a Kubernetes token to servers it does not
	// reach over TLS, and the controller's auth callout accept one: for a loopback demo only,
	// since whoever is on the path would capture the token. The controller passes it on to its
	// dispatchers.
	AllowPlaintextTokens bool
	// AllowAPIAudienceTokens lets the auth callout accept tokens of the API server's own
	// audience, and kubectl webhooks send its kubeconfig user's when it cannot get one of the
	// NATS audience: such a token is good against the API server too.
	AllowAPIAudienceTokens bool
}

// Config is the installation-wide configuration shared by controller and dispatchers.
type Config struct {
	NATS    NATS
	Streams streams.Config
	// AllowHTTP lets endpoints use http:// URLs; otherwise https is required.
	AllowHTTP bool
	// AllowedCIDRs are private or special ranges endpoints may reach anyway (an allow list).
	AllowedCIDRs []netip.Prefix
	// BlockedCIDRs are ranges endpoints may never reach besides the built-in ones, whatever
	// AllowedCIDRs says: a cluster's IPv6 pod and Service ranges, its NAT64 prefixes.
	BlockedCIDRs []netip.Prefix
	// EgressProxy is the HTTP CONNECT proxy (http://host:port or https://host:port) every
	// delivery goes through unless its endpoint names its own (spec.proxy); empty: direct.
	EgressProxy string
	// AllowCrossNamespaceSources lets an endpoint receive events of other namespaces
	// (spec.sourceNamespaces).
	AllowCrossNamespaceSources bool
	// MaxEventBytes is the largest event payload delivered; larger ones are dead-lettered
	// with reason payload_too_large.
	MaxEventBytes int
	// MetricsSecure serves the controller's and every dispatcher's /metrics over HTTPS to
	// authenticated scrapers only: a bearer token allowed to get /metrics for the controller,
	// the callout and the ingress (metricsauth.ServerOptions), a client certificate of the
	// scraper CA for the dispatchers (metricsauth.ClientCertServerOptions).
	MetricsSecure bool
}

// Default returns the defaults.
func Default() Config {
	return Config{
		NATS:          NATS{URL: nats.DefaultURL},
		Streams:       streams.DefaultConfig(),
		MaxEventBytes: 1 << 20,
		MetricsSecure: true,
	}
}

// AddFlags binds the configuration to flags.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.NATS.URL, "nats-url", c.NATS.URL, "NATS server URLs, comma-separated")
	fs.StringVar(&c.NATS.CredsFile, "nats-creds-file", c.NATS.CredsFile, "NATS .creds file (user JWT and NKey seed)")
	fs.StringVar(&c.NATS.CAFile, "nats-ca-file", c.NATS.CAFile, "PEM CA bundle for the NATS servers' TLS certificates")
	fs.StringVar(&c.NATS.CertFile, "nats-cert-file", c.NATS.CertFile, "PEM client certificate for NATS servers that verify their clients (with --nats-key-file)")
	fs.StringVar(&c.NATS.KeyFile, "nats-key-file", c.NATS.KeyFile, "PEM key of --nats-cert-file")
	fs.StringVar(&c.NATS.TokenFile, "nats-token-file", c.NATS.TokenFile, "Kubernetes token file to connect through the operator's auth callout (a projected ServiceAccount token)")
	fs.StringVar(&c.NATS.CredentialsSecret, "nats-credentials-secret", c.NATS.CredentialsSecret,
		"namespace/name of a Secret (keys creds, user, password, token, ca.crt) mirrored to every dispatcher namespace")
	fs.BoolVar(&c.NATS.AllowPlaintextTokens, FlagAllowPlaintextTokens, c.NATS.AllowPlaintextTokens,
		"send (and, in the controller's auth callout, accept) Kubernetes tokens over connections without TLS: for a loopback demo only")
	fs.BoolVar(&c.NATS.AllowAPIAudienceTokens, FlagAllowAPIAudienceTokens, c.NATS.AllowAPIAudienceTokens,
		"accept (auth callout) or send (kubectl webhooks) Kubernetes tokens of the API server's own audience, which are good against the API server too, when no token of the NATS audience is at hand")

	s := &c.Streams
	fs.StringVar(&s.Names.EventsStream, "events-stream", s.Names.EventsStream, "prefix of the per-namespace events streams: <prefix>_<namespace>")
	fs.StringVar(&s.Names.EventsSubjectPrefix, "events-subject-prefix", s.Names.EventsSubjectPrefix, "first token of event subjects: <prefix>.<namespace>.<event-type>")
	fs.StringVar(&s.Names.DeliveriesStream, "deliveries-stream", s.Names.DeliveriesStream, "prefix of the per-namespace deliveries streams: <prefix>_<namespace>")
	fs.StringVar(&s.Names.AttemptsStream, "attempts-stream", s.Names.AttemptsStream, "prefix of the per-namespace delivery-log streams: <prefix>_<namespace>")
	fs.StringVar(&s.Names.DeadLetterStream, "dead-letter-stream", s.Names.DeadLetterStream, "prefix of the per-namespace dead-letter streams: <prefix>_<namespace>")
	fs.StringVar(&s.Names.Bucket, "kv-bucket", s.Names.Bucket, "prefix of the per-namespace key-value buckets (health, circuit state, leases, replay keys): <prefix>-<namespace>")
	fs.StringVar(&s.Names.InternalPrefix, "internal-subject-prefix", s.Names.InternalPrefix, "first token of the subjects the operator writes")
	fs.Var(bytesFlag{&s.EventsMaxBytes}, "events-max-bytes", "size bound of each namespace's events stream (e.g. 128Mi; 0: unbounded); the oldest events go first")
	fs.Var(bytesFlag{&s.DeliveriesMaxBytes}, "deliveries-max-bytes", "size bound of each namespace's deliveries stream (retries, replays, test deliveries, held events; 0: unbounded; a namespace's WebhookQuota spec.storage.deliveries replaces it); held events stop at 80% of it and wait in the events stream")
	fs.Int64Var(&s.DeliveriesMaxMsgs, "deliveries-max-msgs", s.DeliveriesMaxMsgs, "message bound of each namespace's deliveries stream (0: unbounded); held events stop at 80% of it and wait in the events stream")
	fs.Var(bytesFlag{&s.AttemptsMaxBytes}, "attempts-max-bytes", "size bound of each namespace's delivery log (0: unbounded); the oldest records go first")
	fs.Var(bytesFlag{&s.DeadLetterMaxBytes}, "dead-letter-max-bytes", "size bound of each namespace's dead-letter stream (0: unbounded); when full, new dead letters are refused and their deliveries stay queued")
	fs.Var(bytesFlag{&s.BucketMaxBytes}, "kv-max-bytes", "size bound of each namespace's key-value bucket (0: unbounded)")
	fs.Var(int32BytesFlag{&s.BucketMaxValueSize}, "kv-max-value-size", "largest value in a namespace's key-value bucket (0: unbounded)")
	fs.DurationVar(&s.ReplayKeyTTL, "replay-key-ttl", s.ReplayKeyTTL, "how long a replay's idempotency key is remembered (0: forever)")
	fs.IntVar(&s.Replicas, "stream-replicas", s.Replicas, "replicas of every stream and the bucket")
	fs.Var(placementClusterFlag{&s.Placement}, "stream-placement-cluster", "cluster (of a supercluster) every stream and the bucket are placed in (default: the cluster of the server the controller is connected to)")
	fs.Var(placementTagsFlag{&s.Placement}, "stream-placement-tags", "server tags every stream and the bucket are placed on, comma-separated (e.g. az:a,ssd)")
	fs.Var(storageFlag{&s.Storage}, "stream-storage", "storage of every stream: file or memory")
	fs.DurationVar(&s.EventsMaxAge, "events-max-age", s.EventsMaxAge, "how long published events are kept")
	fs.DurationVar(&s.AttemptsMaxAge, "attempts-max-age", s.AttemptsMaxAge, "how long the delivery log is kept")
	fs.DurationVar(&s.DeadLetterMaxAge, "dead-letter-max-age", s.DeadLetterMaxAge, "how long dead letters are kept; 0 keeps them until removed")
	fs.IntVar(&s.MaxConsumers, "max-consumers", s.MaxConsumers, "consumer limit of the events and deliveries streams (one per endpoint)")
	fs.DurationVar(&s.DuplicateWindow, "duplicate-window", s.DuplicateWindow, "de-duplication window of events and deliveries")

	fs.BoolVar(&c.AllowHTTP, "allow-http", c.AllowHTTP, "allow http:// endpoint URLs (https is required otherwise)")
	fs.Var(cidrsFlag{&c.AllowedCIDRs}, "allowed-cidrs", "private, loopback or link-local ranges endpoints may reach anyway, comma-separated (e.g. 10.20.0.0/16); each opens only what lies in the blocked range it names, so 0.0.0.0/0 and ::/0 open nothing")
	fs.Var(cidrsFlag{&c.BlockedCIDRs}, "blocked-cidrs", "ranges endpoints may never reach besides the built-in private, loopback, link-local, metadata and NAT64 ranges, whatever --allowed-cidrs opens, comma-separated (e.g. a cluster's IPv6 pod and Service ranges 2600:1f18:abcd::/56, its NAT64 prefix); an IPv4 range is refused in its IPv6 forms too")
	fs.StringVar(&c.EgressProxy, "egress-proxy", c.EgressProxy, "HTTP CONNECT proxy every delivery (and token request) goes through unless its endpoint names spec.proxy: http://host:port or https://host:port; the outbound guard still checks each receiver's address, resolved by the dispatcher before it asks the proxy for a tunnel to it")
	fs.BoolVar(&c.AllowCrossNamespaceSources, "allow-cross-namespace-sources", c.AllowCrossNamespaceSources, "let endpoints receive events of other namespaces (spec.sourceNamespaces)")
	fs.IntVar(&c.MaxEventBytes, "max-event-bytes", c.MaxEventBytes, "largest event delivered; larger ones are dead-lettered as payload_too_large")
	fs.BoolVar(&c.MetricsSecure, "metrics-secure", c.MetricsSecure, "serve /metrics over HTTPS to authenticated scrapers: a bearer token that may get the /metrics non-resource URL (TokenReview, SubjectAccessReview), or for a dispatcher a client certificate of the scraper CA (--metrics-client-ca-file); false serves plain HTTP to anyone (the controller's dispatchers follow)")
}

// Outbound is the outbound guard's policy: what endpoints may reach (internal/netguard), the
// one the controller checks URLs with and the dispatchers connect through.
func (c *Config) Outbound() netguard.Policy {
	return netguard.Policy{AllowHTTP: c.AllowHTTP, Allowed: c.AllowedCIDRs, Blocked: c.BlockedCIDRs}
}

// DispatcherArgs renders the settings a dispatcher needs as flags. NATS secrets are not
// included: they reach dispatchers through a mounted Secret and environment variables.
func (c *Config) DispatcherArgs() []string {
	s := c.Streams
	args := []string{
		"--nats-url=" + c.NATS.URL,
		"--events-stream=" + s.Names.EventsStream,
		"--events-subject-prefix=" + s.Names.EventsSubjectPrefix,
		"--deliveries-stream=" + s.Names.DeliveriesStream,
		"--attempts-stream=" + s.Names.AttemptsStream,
		"--dead-letter-stream=" + s.Names.DeadLetterStream,
		"--kv-bucket=" + s.Names.Bucket,
		"--internal-subject-prefix=" + s.Names.InternalPrefix,
		"--max-event-bytes=" + strconv.Itoa(c.MaxEventBytes),
		"--metrics-secure=" + strconv.FormatBool(c.MetricsSecure),
	}
	if c.AllowHTTP {
		args = append(args, "--allow-http")
	}
	if len(c.AllowedCIDRs) > 0 {
		args = append(args, "--allowed-cidrs="+cidrsFlag{&c.AllowedCIDRs}.String())
	}
	if len(c.BlockedCIDRs) > 0 {
		args = append(args, "--blocked-cidrs="+cidrsFlag{&c.BlockedCIDRs}.String())
	}
	if c.EgressProxy != "" {
		args = append(args, "--egress-proxy="+c.EgressProxy)
	}
	if c.AllowCrossNamespaceSources {
		args = append(args, "--allow-cross-namespace-sources")
	}
	if c.NATS.AllowPlaintextTokens {
		args = append(args, "--"+FlagAllowPlaintextTokens)
	}
	return args
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if strings.TrimSpace(c.NATS.URL) == "" {
		errs = append(errs, errors.New("--nats-url is required"))
	}
	if err := CheckURLs(c.NATS.URL); err != nil {
		errs = append(errs, fmt.Errorf("--nats-url: %w", err))
	}
	if (c.NATS.CertFile == "") != (c.NATS.KeyFile == "") {
		errs = append(errs, errors.New("--nats-cert-file and --nats-key-file go together"))
	}
	if c.Streams.Replicas < 1 || c.Streams.Replicas > 5 {
		errs = append(errs, fmt.Errorf("--stream-replicas must be 1 to 5, not %d", c.Streams.Replicas))
	}
	if c.MaxEventBytes < 1024 {
		errs = append(errs, fmt.Errorf("--max-event-bytes must be at least 1024, not %d", c.MaxEventBytes))
	}
	if err := c.Streams.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Streams.MaxConsumers < 1 {
		errs = append(errs, errors.New("--max-consumers must be positive"))
	}
	if c.EgressProxy != "" {
		if _, err := egressproxy.Parse(c.EgressProxy); err != nil {
			errs = append(errs, fmt.Errorf("--egress-proxy: %w", err))
		}
	}
	if c.NATS.CredentialsSecret != "" && len(strings.Split(c.NATS.CredentialsSecret, "/")) != 2 {
		errs = append(errs, fmt.Errorf("--nats-credentials-secret must be namespace/name, not %q", c.NATS.CredentialsSecret))
	}
	return errors.Join(errs...)
}

// CheckURLs refuses server URLs that hold credentials (user-info): they would travel in
// process arguments, Deployment specs and logs. Credentials go in NATS_USER/NATS_PASSWORD, a
// .creds file or a token file instead.
func CheckURLs(urls string) error {
	for _, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil {
			// Not a URL nats.go can parse either; do not echo it (it may hold a secret).
			return errors.New("a server URL does not parse")
		}
		if u.User != nil {
			u.User = nil
			return fmt.Errorf("%s: credentials in the URL are refused (they would show in arguments and logs); use NATS_USER/NATS_PASSWORD, NATS_TOKEN, a .creds file or a token file", u.Redacted())
		}
	}
	return nil
}

// TLS is the client TLS configuration of the flags: nil when no CA or certificate is given.
func (n *NATS) TLS() (*tls.Config, error) {
	if n.CAFile == "" && n.CertFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if n.CAFile != "" {
		pem, err := os.ReadFile(n.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading --nats-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--nats-ca-file %s holds no PEM certificate", n.CAFile)
		}
		cfg.RootCAs = pool
	}
	if n.CertFile != "" {
		certFile, keyFile := n.CertFile, n.KeyFile
		if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			return nil, fmt.Errorf("--nats-cert-file and --nats-key-file: %w", err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			return &c, err
		}
	}
	return cfg, nil
}

// RefusedMessage is what a connection logs (controller-runtime's logger, name "nats") when
// the server refuses it an operation: a permission it lacks.
const RefusedMessage = "NATS refused an operation"

// Connect connects to NATS as name, reconnecting forever, with credentials from the flags
// and the environment. The returned connection must be closed by the caller.
func (c *Config) Connect(name string, extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(true),
		nats.PingInterval(10 * time.Second),
		nats.MaxPingsOutstanding(3),
		nats.ReconnectBufSize(64 << 20),
		// A permission the server refused is a bug or an attack: say so in the log.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				ctrllog.Log.WithName("nats").Info(RefusedMessage, "connection", name, "error", err.Error())
			}
		}),
	}
	if c.NATS.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(c.NATS.CredsFile))
	}
	if u, p := os.Getenv(EnvNATSUser), os.Getenv(EnvNATSPassword); u != "" {
		opts = append(opts, nats.UserInfo(u, p))
	}
	if t := os.Getenv(EnvNATSToken); t != "" {
		opts = append(opts, nats.Token(t))
	}
	if tc, err := c.NATS.TLS(); err != nil {
		return nil, nil, err
	} else if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	if f := c.NATS.TokenFile; f != "" {
		if _, err := readToken(f); err != nil {
			return nil, nil, err
		}
		// The file is read again at every (re)connection: the kubelet renews it. While the
		// callout is unavailable (no controller runs) the server refuses the connection;
		// keep trying instead of giving up after the same refusal twice.
		opts = append(opts, natsauth.ClientOptions(func() string {
			t, _ := readToken(f)
			return t
		}, c.NATS.Namespace)...)
		opts = append(opts, nats.IgnoreAuthErrorAbort())
	}
	opts = append(opts, extra...)
	if c.NATS.tokenInClear(opts) && !c.NATS.AllowPlaintextTokens {
		return nil, nil, fmt.Errorf("refusing to send a Kubernetes token to %s without TLS (anyone on the path could replay it): give --nats-ca-file or a tls:// URL, or --%s for a loopback demo",
			c.NATS.URL, FlagAllowPlaintextTokens)
	}
	nc, err := nats.Connect(c.NATS.URL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to NATS at %s: %w", c.NATS.URL, err)
	}
	if nc.IsConnected() {
		// The server tells a connection its account's payload limit (a tenant's is lower than
		// the server's) in an INFO that follows the first PONG: after one more round trip
		// MaxPayload is that limit, which writers size their messages by.
		_ = nc.FlushTimeout(natsauth.ConnectTimeout)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// tokenInClear reports whether a connection with opts would send a Kubernetes token (a token
// handler, as natsauth.ClientOptions sets; static NATS tokens are nats.Token) without
// requiring TLS: neither a TLS option (nats.Secure, RootCAs, ClientCert) nor a tls:// URL for
// every server makes the client refuse a server that does not do TLS.
func (n *NATS) tokenInClear(opts []nats.Option) bool {
	o := nats.GetDefaultOptions()
	for _, opt := range opts {
		if opt != nil {
			_ = opt(&o)
		}
	}
	if o.TokenHandler == nil || o.Secure {
		return false
	}
	for _, raw := range strings.Split(n.URL, ",") {
		if raw = strings.TrimSpace(raw); raw == "" {
			continue
		}
		if u, err := url.Parse(raw); err != nil || !strings.EqualFold(u.Scheme, "tls") && !strings.EqualFold(u.Scheme, "wss") {
			return true
		}
	}
	return false
}

// readToken reads a token file, bounded.
func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading --nats-token-file: %w", err)
	}
	if len(b) > natsauth.MaxTokenBytes {
		return "", fmt.Errorf("--nats-token-file %s is longer than %d bytes", file, natsauth.MaxTokenBytes)
	}
	return strings.TrimSpace(string(b)), nil
}

// BytesVar binds p to a flag holding a size in bytes, written as a Kubernetes quantity (64Mi,
// 1G, 4096).
func BytesVar(fs *pflag.FlagSet, p *int64, name, usage string) { fs.Var(bytesFlag{p}, name, usage) }

// bytesFlag is a size in bytes, written as a Kubernetes quantity (128Mi, 1G, 4096).
type bytesFlag struct{ v *int64 }

func (f bytesFlag) String() string {
	if f.v == nil {
		return "0"
	}
	return resource.NewQuantity(*f.v, resource.BinarySI).String()
}

func (f bytesFlag) Set(s string) error {
	n, err := parseBytes(s, math.MaxInt64)
	if err == nil {
		*f.v = n
	}
	return err
}

func (bytesFlag) Type() string { return "bytes" }

// int32BytesFlag is bytesFlag for a size that fits 32 bits.
type int32BytesFlag struct{ v *int32 }

func (f int32BytesFlag) String() string {
	if f.v == nil {
		return "0"
	}
	return resource.NewQuantity(int64(*f.v), resource.BinarySI).String()
}

func (f int32BytesFlag) Set(s string) error {
	n, err := parseBytes(s, math.MaxInt32)
	if err == nil {
		*f.v = int32(n)
	}
	return err
}

func (int32BytesFlag) Type() string { return "bytes" }

func parseBytes(s string, limit int64) (int64, error) {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size (e.g. 128Mi, 1Gi, 4096): %w", s, err)
	}
	n, ok := q.AsInt64()
	if !ok || n < 0 || n > limit {
		return 0, fmt.Errorf("%q: want a whole number of bytes from 0 to %d", s, limit)
	}
	return n, nil
}

type storageFlag struct{ s *jetstream.StorageType }

func (f storageFlag) String() string {
	if f.s == nil || *f.s == jetstream.FileStorage {
		return "file"
	}
	return "memory"
}

func (f storageFlag) Set(v string) error {
	switch strings.ToLower(v) {
	case "file":
		*f.s = jetstream.FileStorage
	case "memory":
		*f.s = jetstream.MemoryStorage
	default:
		return fmt.Errorf("storage must be file or memory, not %q", v)
	}
	return nil
}

func (storageFlag) Type() string { return "storage" }

// placementClusterFlag and placementTagsFlag set the two halves of the streams' placement,
// which stays nil while neither is given.
type placementClusterFlag struct{ p **jetstream.Placement }

func (f placementClusterFlag) String() string {
	if f.p == nil || *f.p == nil {
		return ""
	}
	return (*f.p).Cluster
}

func (f placementClusterFlag) Set(v string) error {
	v = strings.TrimSpace(v)
	if strings.ContainsAny(v, " \t.*>") {
		return fmt.Errorf("a cluster name has no spaces, dots or wildcards: %q", v)
	}
	placement(f.p).Cluster = v
	return nil
}

func (placementClusterFlag) Type() string { return "cluster" }

type placementTagsFlag struct{ p **jetstream.Placement }

func (f placementTagsFlag) String() string {
	if f.p == nil || *f.p == nil {
		return ""
	}
	return strings.Join((*f.p).Tags, ",")
}

func (f placementTagsFlag) Set(v string) error {
	var tags []string
	for _, t := range strings.Split(v, ",") {
		if t = strings.TrimSpace(t); t != "" {
			tags = append(tags, t)
		}
	}
	placement(f.p).Tags = tags
	return nil
}

func (placementTagsFlag) Type() string { return "tags" }

// placement is *p, created when nil.
func placement(p **jetstream.Placement) *jetstream.Placement {
	if *p == nil {
		*p = &jetstream.Placement{}
	}
	return *p
}

type cidrsFlag struct{ p *[]netip.Prefix }

func (f cidrsFlag) String() string {
	if f.p == nil {
		return ""
	}
	s := make([]string, len(*f.p))
	for i, p := range *f.p {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (f cidrsFlag) Set(v string) error {
	var out []netip.Prefix
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			a, aerr := netip.ParseAddr(part)
			if aerr != nil {
				return fmt.Errorf("%q is neither a CIDR nor an address", part)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	*f.p = out
	return nil
}

func (cidrsFlag) Type() string { return "cidrs" }
