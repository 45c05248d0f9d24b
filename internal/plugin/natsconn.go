package plugin

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/opconfig"
	"github.com/webhook-operator/webhook-operator/internal/version"
)

// JetStream connects to NATS once, from the first source that says how: the --nats-url flag,
// else NATS_URL, else the operator's Secret. Without NATS credentials (a .creds file, a user or
// a token of NATS itself), it connects as the kubeconfig's user: the Kubernetes bearer token
// (or --nats-token-file) goes to the operator's auth callout with the namespace, which grants
// what Kubernetes RBAC allows there.
func (o *Options) JetStream(ctx context.Context) (*nats.Conn, jetstream.JetStream, error) {
	if o.js != nil {
		return o.nc, o.js, nil
	}
	cfg := o.NATS
	// A command-line tool fails fast instead of waiting for a server to appear.
	extra := []nats.Option{nats.RetryOnFailedConnect(false), nats.MaxReconnects(5), nats.Timeout(natsauth.ConnectTimeout)}
	var sec *natsSecret
	switch {
	case o.flags.Changed("nats-url"):
		o.natsSrc = "--nats-url"
	case o.Getenv(EnvNATSURL) != "":
		o.natsSrc = "$" + EnvNATSURL
		cfg.NATS.URL = o.Getenv(EnvNATSURL)
		if creds := o.Getenv(EnvNATSCreds); creds != "" && !o.flags.Changed("nats-creds-file") {
			cfg.NATS.CredsFile = creds
		}
	default:
		var err error
		if sec, err = o.natsFromSecret(ctx); err != nil {
			return nil, nil, err
		}
		o.natsSrc = fmt.Sprintf("Secret %s/%s", o.OperatorNamespace, NATSSecretName)
		cfg.NATS.URL = sec.url
		extra = append(extra, sec.opts...)
	}
	if err := opconfig.CheckURLs(cfg.NATS.URL); err != nil {
		return nil, nil, usagef("the NATS URL from %s: %v", o.natsSrc, err)
	}
	who, err := o.busIdentity(ctx, &cfg, sec, &extra)
	if err != nil {
		return nil, nil, err
	}
	extra = append(extra, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			writeLine(o.IO.ErrOut, "warning: %v", err)
		}
	}))
	nc, js, err := cfg.Connect("kubectl-webhooks/"+version.Version, extra...)
	if err != nil {
		hint := ""
		switch {
		case errors.Is(err, nats.ErrAuthorization) && who != "":
			hint = fmt.Sprintf("; NATS refused %s: Kubernetes RBAC must allow create on webhookevents (publish) or create on webhookdeliveries (test deliveries) in namespace %s (webhook-operator.io), e.g. the ClusterRole webhook-operator-editor",
				who, cfg.NATS.Namespace)
		case errors.Is(err, nats.ErrAuthorization):
			hint = "; the server wants credentials: a kubeconfig user with a token, --nats-token-file, or NATS credentials"
		case strings.HasPrefix(o.natsSrc, "Secret"):
			hint = "; from outside the cluster, port-forward to NATS and pass --nats-url or set NATS_URL"
		}
		return nil, nil, fmt.Errorf("connecting to NATS at %s (from %s): %w%s", cfg.NATS.URL, o.natsSrc, err, hint)
	}
	o.nc, o.js = nc, js
	return nc, js, nil
}

// busIdentity decides who the connection is. NATS credentials, when given, are used as they
// are. Otherwise the connection carries a Kubernetes token of the NATS audience and asks for
// the command's namespace: --nats-token-file, else one the plugin requests for the kubeconfig's
// ServiceAccount (TokenRequest), else, only with --nats-allow-api-audience-tokens, the token the
// kubeconfig uses for the API server. It returns who that is, for errors.
func (o *Options) busIdentity(ctx context.Context, cfg *opconfig.Config, sec *natsSecret, extra *[]nats.Option) (string, error) {
	if cfg.NATS.CredsFile != "" || os.Getenv(opconfig.EnvNATSUser) != "" || os.Getenv(opconfig.EnvNATSToken) != "" || sec != nil && sec.hasCredentials {
		return "", nil
	}
	ns, err := o.Namespace()
	if err != nil {
		return "", err
	}
	cfg.NATS.Namespace = ns
	if cfg.NATS.TokenFile != "" {
		return "the token of --nats-token-file", nil
	}
	rc, err := o.Kube.ToRESTConfig()
	if err != nil {
		return "", fmt.Errorf("reading the kubeconfig: %w", err)
	}
	token, err := KubeBearerToken(ctx, rc)
	if err != nil {
		return "", err
	}
	if token == "" {
		if sec != nil && sec.kubernetesAuth {
			return "", refusedf("NATS wants a Kubernetes token, and your kubeconfig user authenticates otherwise (a client certificate): "+
				"pass --nats-token-file with a token of an identity allowed in namespace %s, e.g. "+
				"`kubectl create token <serviceaccount> -n %s --audience %s > token`", ns, ns, natsauth.DefaultAudience)
		}
		return "", nil
	}
	audience := natsauth.DefaultAudience
	if sec != nil && sec.audience != "" {
		audience = sec.audience
	}
	src, err := newAudienceToken(ctx, rc, audience)
	who := "your kubeconfig's user"
	tokenFunc := func() string { return token }
	switch {
	case err == nil:
		who = fmt.Sprintf("%s (with a token of audience %s)", src.user, audience)
		tokenFunc = src.token
	case cfg.NATS.AllowAPIAudienceTokens:
		// The kubeconfig's own token, which the API server accepts too: opted in.
		who = fmt.Sprintf("your kubeconfig's user (with its API-server token, which the controller accepts only with --%s)", opconfig.FlagAllowAPIAudienceTokens)
	default:
		return "", refusedf("kubectl webhooks sends NATS a token of audience %s, never the token your kubeconfig uses for the API server (it would be good there too, for whoever sees it): %v. "+
			"Pass --nats-token-file with a token of that audience (e.g. `kubectl create token <serviceaccount> -n %s --audience %s > token`), "+
			"or --%s where the controller also runs with it", audience, err, ns, audience, opconfig.FlagAllowAPIAudienceTokens)
	}
	*extra = append(*extra, natsauth.ClientOptions(tokenFunc, cfg.NATS.Namespace)...)
	return who, nil
}

// audienceToken is a token of one audience for the kubeconfig's ServiceAccount, requested
// again when it nears its expiry (a command may outlive one).
type audienceToken struct {
	cs              kubernetes.Interface
	namespace, name string
	audience, user  string
	mu              sync.Mutex
	current         string
	expires         time.Time
}

// tokenLifetime is what the plugin asks for: the API server's minimum.
const tokenLifetime = 10 * time.Minute

// newAudienceToken requests a token of audience for the kubeconfig's user, when it is a
// ServiceAccount that may request tokens for itself (create on its serviceaccounts/token);
// otherwise it says why not.
func newAudienceToken(ctx context.Context, rc *rest.Config, audience string) (*audienceToken, error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	ssr, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("asking the API server who you are: %w", err)
	}
	ui := ssr.Status.UserInfo
	ns, name, ok := natsauth.Identity{User: ui}.ServiceAccount()
	if !ok {
		return nil, fmt.Errorf("your kubeconfig's user %s is not a ServiceAccount, which could request one", ui.Username)
	}
	t := &audienceToken{cs: cs, namespace: ns, name: name, audience: audience, user: ui.Username}
	if err := t.request(ctx); err != nil {
		return nil, fmt.Errorf("your kubeconfig's ServiceAccount %s/%s cannot request one for itself (create on serviceaccounts/token, resource name %s): %w", ns, name, name, err)
	}
	return t, nil
}

func (t *audienceToken) request(ctx context.Context) error {
	seconds := int64(tokenLifetime / time.Second)
	tr, err := t.cs.CoreV1().ServiceAccounts(t.namespace).CreateToken(ctx, t.name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{t.audience}, ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	t.current, t.expires = tr.Status.Token, tr.Status.ExpirationTimestamp.Time
	return nil
}

// token is the current token, renewed when less than a quarter of its life is left (at a
// reconnection: the authorization ends with the token).
func (t *audienceToken) token() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if time.Until(t.expires) < tokenLifetime/4 {
		ctx, cancel := context.WithTimeout(context.Background(), natsauth.ConnectTimeout/2)
		defer cancel()
		_ = t.request(ctx) // on failure the old token is refused, and the reason logged by the callout
	}
	return t.current
}

// natsSecret is what the operator's NATS Secret says.
type natsSecret struct {
	url  string
	opts []nats.Option
	// hasCredentials: it (or the Secret it names) holds NATS credentials.
	hasCredentials bool
	// kubernetesAuth: the installation authenticates tenants with Kubernetes tokens (auth:
	// kubernetes).
	kubernetesAuth bool
	// audience is the audience of the tokens the auth callout accepts (tokenAudience), when
	// the Secret says.
	audience string
}

// Values of the Secret's key "auth".
const (
	// SecretAuthKubernetes says clients connect with a Kubernetes token through the operator's
	// auth callout.
	SecretAuthKubernetes = "kubernetes"
)

// natsFromSecret reads the operator's NATS Secret: its URL, how to authenticate and the
// options its credentials make.
func (o *Options) natsFromSecret(ctx context.Context) (*natsSecret, error) {
	none := fmt.Sprintf("no NATS connection: pass --nats-url or set %s, or let the plugin read the operator's Secret %s/%s (--operator-namespace)",
		EnvNATSURL, o.OperatorNamespace, NATSSecretName)
	c, err := o.Client()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", none, err)
	}
	var s corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: o.OperatorNamespace, Name: NATSSecretName}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%s: it does not exist", none)
		}
		return nil, fmt.Errorf("%s: %w", none, err)
	}
	sec := &natsSecret{url: strings.TrimSpace(string(s.Data["url"])), kubernetesAuth: strings.TrimSpace(string(s.Data["auth"])) == SecretAuthKubernetes,
		audience: strings.TrimSpace(string(s.Data["tokenAudience"]))}
	if sec.url == "" {
		return nil, fmt.Errorf("%s: it has no key \"url\"", none)
	}
	// The chart names a separate credentials Secret (nats.existingSecret) in credentialsSecret.
	creds, where := s.Data, fmt.Sprintf("Secret %s/%s", o.OperatorNamespace, NATSSecretName)
	if ref := strings.TrimSpace(string(s.Data["credentialsSecret"])); ref != "" && ref != NATSSecretName && !sec.kubernetesAuth {
		ns, name := o.OperatorNamespace, ref
		if before, after, ok := strings.Cut(ref, "/"); ok {
			ns, name = before, after
		}
		var cs corev1.Secret
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cs); err != nil {
			return nil, fmt.Errorf("reading the NATS credentials Secret %s/%s (credentialsSecret of %s): %w", ns, name, where, err)
		}
		creds, where = cs.Data, fmt.Sprintf("Secret %s/%s", ns, name)
	}
	for _, k := range []string{"creds", "user", "token"} {
		sec.hasCredentials = sec.hasCredentials || len(creds[k]) > 0
	}
	if sec.kubernetesAuth {
		// No credential is used: the kubeconfig user's token decides.
		creds = map[string][]byte{"ca.crt": s.Data["ca.crt"], "tls.crt": s.Data["tls.crt"], "tls.key": s.Data["tls.key"]}
		sec.hasCredentials = false
		// The chart names the Secret holding the CA and the client certificate (tlsSecret);
		// who may read it may present the certificate.
		if ref := strings.TrimSpace(string(s.Data["tlsSecret"])); ref != "" {
			var ts corev1.Secret
			if err := c.Get(ctx, client.ObjectKey{Namespace: o.OperatorNamespace, Name: ref}, &ts); err != nil {
				// Servers that do not verify clients need no certificate: go on without.
				writeLine(o.IO.ErrOut, "warning: no NATS client certificate (reading Secret %s/%s: %v); pass --nats-cert-file and --nats-key-file if the server asks for one",
					o.OperatorNamespace, ref, err)
			} else {
				creds["tls.crt"], creds["tls.key"] = ts.Data["tls.crt"], ts.Data["tls.key"]
				if len(creds["ca.crt"]) == 0 {
					creds["ca.crt"] = ts.Data["ca.crt"]
				}
			}
		}
	}
	sec.opts, err = credentialOptions(creds, where)
	return sec, err
}

// credentialOptions are the NATS options of a credentials Secret's keys: creds (a .creds
// file's contents), user and password, token, ca.crt.
func credentialOptions(data map[string][]byte, where string) ([]nats.Option, error) {
	var opts []nats.Option
	if creds := data["creds"]; len(creds) > 0 {
		jwt, seed, err := parseCreds(string(creds))
		if err != nil {
			return nil, fmt.Errorf("%s key creds: %w", where, err)
		}
		opts = append(opts, nats.UserJWTAndSeed(jwt, seed))
	}
	if u := string(data["user"]); u != "" {
		opts = append(opts, nats.UserInfo(u, string(data["password"])))
	}
	if t := string(data["token"]); t != "" {
		opts = append(opts, nats.Token(t))
	}
	var tc *tls.Config
	if ca := data["ca.crt"]; len(ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("%s key ca.crt holds no PEM certificate", where)
		}
		tc = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	// A client certificate for servers that verify their clients: it lets the connection
	// reach the server, the token (or credentials) decide who it is.
	if crt, key := data["tls.crt"], data["tls.key"]; len(crt) > 0 && len(key) > 0 {
		cert, err := tls.X509KeyPair(crt, key)
		if err != nil {
			return nil, fmt.Errorf("%s keys tls.crt and tls.key: %w", where, err)
		}
		if tc == nil {
			tc = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// parseCreds reads a NATS .creds file: the user JWT and the NKey seed, each between
// "-----BEGIN ...-----" and "------END ...------" lines.
func parseCreds(creds string) (jwt, seed string, err error) {
	sc := bufio.NewScanner(strings.NewReader(creds))
	var in string
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "-----BEGIN") && strings.Contains(line, "JWT"):
			in = "jwt"
		case strings.HasPrefix(line, "-----BEGIN") && strings.Contains(line, "SEED"):
			in = "seed"
		case strings.HasPrefix(line, "---"):
			in = ""
		case line == "":
		case in == "jwt" && jwt == "":
			jwt = line
		case in == "seed" && seed == "":
			seed = line
		}
	}
	if jwt == "" || seed == "" {
		return "", "", errors.New("not a NATS .creds file (a user JWT and an NKey seed)")
	}
	return jwt, seed, nil
}
