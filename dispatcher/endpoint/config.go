// Package endpoint resolves a WebhookEndpoint, its RetryPolicy and its Secrets into the
// configuration every stage of the dispatcher reads (Config). A Config is immutable: a change
// builds a new one, which the dispatcher hands to the route table and to the endpoint's
// worker.
package endpoint

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/chatformat"
	"github.com/webhook-operator/webhook-operator/internal/cloudevent"
	"github.com/webhook-operator/webhook-operator/internal/consent"
	"github.com/webhook-operator/webhook-operator/internal/egressproxy"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/names"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/receiverauth"
	"github.com/webhook-operator/webhook-operator/internal/signing"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Config is everything a worker needs to deliver to one endpoint, resolved from the
// WebhookEndpoint, its RetryPolicy and its Secrets. It is immutable: a change builds a new one.
type Config struct {
	Namespace  string
	Name       string
	UID        string
	Generation int64
	Created    time.Time

	URL string
	// URLSecret says the URL came from a Secret (spec.urlFrom): it is never shown, and its
	// path, query and host are scrubbed from anything stored.
	URLSecret bool
	// URLBlocked is the outbound guard's verdict on the literal URL (scheme, literal address),
	// computed once; every attempt fails with it, as blocked_address, without a request.
	URLBlocked error
	EventTypes []string
	Sources    []string // other namespaces whose events this endpoint receives

	Timeout     time.Duration
	SuccessCode func(int) bool
	// Policy is the retry policy, shared and never changed: every endpoint without
	// retryPolicyRef holds the same one.
	Policy     *policy.Policy
	PolicyName string
	Signer     *signing.Signer
	// Headers are static and Secret-sourced headers, in canonical form (nil: none).
	Headers http.Header
	// SecretHeaderNames are headers whose values must never be logged (nil: none).
	SecretHeaderNames map[string]bool
	// secretValues are Secret-sourced values scrubbed from anything stored (a receiver may echo
	// them back in a response body).
	secretValues []string
	TLS          *tls.Config
	// Auth is spec.auth resolved; nil without it. A worker keeps one token source while the
	// settings stay the same (receiverauth.Same).
	Auth *receiverauth.Settings
	// Proxy is the egress proxy: the endpoint's own, else the installation's (set by the
	// dispatcher); nil: direct.
	Proxy *egressproxy.Proxy

	RateLimit   float64 // requests per second; 0 = none
	Burst       int
	MaxInFlight int
	PerKey      bool
	KeyHeader   string
	KeyJSONPath []string
	Suspend     bool
	// Lane is how its deliveries reach the dispatcher (streams.LaneOf).
	Lane streams.Lane
	// SharedSince is when a shared-lane endpoint joined the shared lane (status.sharedSince;
	// zero: not yet, nothing is delivered to it there). Draining are its own consumers
	// ("<stream>/<consumer>") it still reads, for the events stored before, until the
	// controller deletes them (status.drainingConsumers).
	SharedSince time.Time
	Draining    []string
	// Deleting says the endpoint is being deleted: its dispatcher dead-letters what is still
	// queued for it (endpoint_deleted) and events stored after DeletedAt are not its own.
	Deleting  bool
	DeletedAt time.Time
	// CloudEvents is the content mode of spec.format CloudEvents; empty: the raw body.
	CloudEvents cloudevent.Mode
	// Chat is spec.format Slack or Teams: the body is a chat message written from the event;
	// empty otherwise.
	Chat chatformat.Kind

	// SecretsFingerprint names the Secrets read and their resourceVersions.
	SecretsFingerprint string
	// RotationEndsAt is when the signing secret's rotation ends (spec.signing.rotationEndsAt),
	// when it has not yet: the Signer stops signing with the previous secret then, and the
	// configuration is resolved again, without it.
	RotationEndsAt time.Time

	// Filter and Transform are the compiled spec.filter and spec.transform; nil without one.
	// A worker evaluates the filter on each event it takes from the events stream, and the
	// transformation on each attempt. One that does not compile is a ConfigError (the controller reports it as
	// InvalidFilter or InvalidTransform) and is nil.
	Filter    *expr.Filter
	Transform *expr.Transform

	// EnabledAt is the re-enable annotation's time.
	EnabledAt time.Time
	// ConfigError, when set, fails every attempt with reason "configuration" (e.g. a missing
	// Secret) instead of sending an unsigned or wrong request.
	ConfigError error
}

// SecretGetter reads one Secret of the namespace.
type SecretGetter func(name string) (*corev1.Secret, error)

// Resolve builds an endpoint's configuration. Problems with referenced objects do not
// fail the build: they become ConfigError, so deliveries fail visibly with a reason.
func Resolve(ep *v1alpha1.WebhookEndpoint, rp *v1alpha1.RetryPolicy, getSecret SecretGetter) *Config {
	c := &Config{
		Namespace:   ep.Namespace,
		Name:        ep.Name,
		UID:         string(ep.UID),
		Generation:  ep.Generation,
		Created:     ep.CreationTimestamp.Time,
		URL:         ep.Spec.URL,
		Timeout:     10 * time.Second,
		MaxInFlight: 50,
		Suspend:     ep.Spec.Suspend,
		Deleting:    !ep.DeletionTimestamp.IsZero(),
		Sources:     ep.Spec.SourceNamespaces,
		Lane:        streams.LaneOf(&ep.Spec),
		Draining:    ep.Status.DrainingConsumers,
	}
	if t := ep.Status.SharedSince; t != nil {
		c.SharedSince = t.Time
	}
	if c.Deleting {
		c.DeletedAt = ep.DeletionTimestamp.Time
	}
	if ready := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady); ready != nil && ready.Reason == v1alpha1.ReasonQuotaExceeded {
		// Held back by its namespace's WebhookQuota: what arrives for it waits, as for a
		// suspended endpoint (on its own lane its consumers are paused as well).
		c.Suspend = true
	}
	if ready := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionReady); ready != nil && ready.Reason == v1alpha1.ReasonSourceGrantFull {
		// The bus grant cannot hold its source consumers (the controller says so on the
		// endpoint): pulling them would only be refused, and renewing the connection for them
		// would never help. It delivers its own namespace's events.
		c.Sources = nil
	}
	r := &resolution{c: c, getSecret: consenting(ep, getSecret)}
	r.delivery(ep)
	r.policy(ep, rp)
	r.signing(ep)
	r.headers(ep)
	r.tls(ep)
	r.auth(ep)
	r.proxy(ep)
	r.expressions(ep)
	c.SecretsFingerprint = strings.Join(r.read, ",")
	if len(r.errs) > 0 {
		c.ConfigError = fmt.Errorf("%s", strings.Join(r.errs, "; "))
	}
	return c
}

// consenting reads Secrets with get, refusing those that do not consent to ep (see
// consent.Secret): a shared dispatcher may read a Secret because another of its endpoints may
// use it, and must not send it for this one.
func consenting(ep *v1alpha1.WebhookEndpoint, get SecretGetter) SecretGetter {
	return func(name string) (*corev1.Secret, error) {
		s, err := get(name)
		if err != nil {
			return nil, err
		}
		if err := consent.Secret(s, ep, ""); err != nil {
			return nil, fmt.Errorf("Secret %s %w", name, err)
		}
		return s, nil
	}
}

// resolution is one Resolve: the configuration being built, the Secrets read (their
// resourceVersions fingerprint the configuration) and the problems found.
type resolution struct {
	c         *Config
	getSecret SecretGetter
	read      []string
	errs      []string
}

func (r *resolution) fail(format string, a ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, a...))
}

// secret reads one Secret, remembering its version.
func (r *resolution) secret(name string) (*corev1.Secret, error) {
	s, err := r.getSecret(name)
	if err == nil {
		r.read = append(r.read, name+"@"+s.ResourceVersion)
	} else {
		r.read = append(r.read, name+"@missing")
	}
	return s, err
}

// delivery resolves where, what and how fast: URL, event types, timeout, success codes,
// limits, ordering, and the re-enable annotation.
func (r *resolution) delivery(ep *v1alpha1.WebhookEndpoint) {
	c := r.c
	for _, t := range ep.Spec.EventTypes {
		c.EventTypes = append(c.EventTypes, string(t))
	}
	if ep.Spec.URLFrom != nil {
		r.urlFrom(ep)
	} else {
		if u, err := url.Parse(ep.Spec.URL); err != nil || u.Host == "" {
			r.fail("url %q is not an absolute URL", ep.Spec.URL)
		}
	}
	if ep.Spec.Timeout != nil && ep.Spec.Timeout.Duration > 0 {
		c.Timeout = ep.Spec.Timeout.Duration
	}
	c.SuccessCode = SuccessFunc(ep.Spec.SuccessStatusCodes)
	if ep.Spec.MaxInFlight != nil && *ep.Spec.MaxInFlight > 0 {
		c.MaxInFlight = int(*ep.Spec.MaxInFlight)
	}
	if rl := ep.Spec.RateLimit; rl != nil && rl.RequestsPerSecond > 0 {
		c.RateLimit = float64(rl.RequestsPerSecond)
		c.Burst = int(rl.RequestsPerSecond)
		if rl.Burst != nil && *rl.Burst > 0 {
			c.Burst = int(*rl.Burst)
		}
	}
	if f := ep.Spec.Format; f != nil && f.Type == v1alpha1.FormatCloudEvents {
		c.CloudEvents = cloudevent.Binary
		if f.CloudEventsMode == v1alpha1.CloudEventsStructured {
			c.CloudEvents = cloudevent.Structured
		}
	}
	if f := ep.Spec.Format; f != nil && (f.Type == v1alpha1.FormatSlack || f.Type == v1alpha1.FormatTeams) {
		c.Chat = chatformat.Kind(f.Type)
	}
	if o := ep.Spec.Ordering; o != nil && o.Mode == v1alpha1.OrderingPerKey {
		c.PerKey = true
		if o.Key != nil {
			c.KeyHeader = o.Key.Header
			if o.Key.JSONField != "" {
				c.KeyJSONPath = strings.Split(o.Key.JSONField, ".")
			}
		}
	}
	if v := ep.Annotations[v1alpha1.AnnotationEnable]; v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			c.EnabledAt = t
		}
	}
}

// policy resolves the retry policy: the referenced one, or the built-in default.
func (r *resolution) policy(ep *v1alpha1.WebhookEndpoint, rp *v1alpha1.RetryPolicy) {
	c := r.c
	c.Policy, c.PolicyName = defaultPolicy, policy.DefaultName
	if ref := ep.Spec.RetryPolicyRef; ref != nil {
		c.PolicyName = ref.Name
		if rp == nil {
			r.fail("retry policy %q not found", ref.Name)
		} else if p, err := policy.FromSpec(&rp.Spec); err != nil {
			r.fail("retry policy %q: %v", ref.Name, err)
		} else {
			c.Policy = &p
		}
	}
}

// defaultPolicy is the built-in policy every endpoint without retryPolicyRef shares (a copy
// each would be some 250 bytes per idle endpoint).
var defaultPolicy = func() *policy.Policy { p := policy.Default(); return &p }()

// signing resolves the signer: the referenced Secret, or the one the controller generates,
// and the previous one while a rotation lasts.
func (r *resolution) signing(ep *v1alpha1.WebhookEndpoint) {
	sref := v1alpha1.SecretKeySelector{Name: names.SigningSecret(ep.Name), Key: names.SigningSecretKey}
	var prevRef *v1alpha1.SecretKeySelector
	var end time.Time
	if s := ep.Spec.Signing; s != nil {
		sref = s.SecretRef
		if s.PreviousSecretRef != nil && (s.RotationEndsAt == nil || time.Now().Before(s.RotationEndsAt.Time)) {
			prevRef = s.PreviousSecretRef
			if s.RotationEndsAt != nil {
				// The signer ends the rotation on the request's timestamp; the dispatcher
				// resolves the endpoint again then (RotationEndsAt), letting go of the secret.
				end = s.RotationEndsAt.Time
				r.c.RotationEndsAt = end
			}
		}
	}
	cur, err := readSigningSecret(r.secret, sref)
	if err != nil {
		r.fail("signing secret: %v", err)
		return
	}
	var prev *signing.Secret
	if prevRef != nil {
		p, err := readSigningSecret(r.secret, *prevRef)
		if err != nil {
			r.fail("previous signing secret: %v", err)
		} else {
			prev = &p
		}
	}
	r.c.Signer = signing.NewSignerUntil(cur, prev, end)
}

// headers resolves the static and Secret-sourced request headers; Secret values are
// remembered to be scrubbed from anything stored.
func (r *resolution) headers(ep *v1alpha1.WebhookEndpoint) {
	c := r.c
	if n := len(ep.Spec.Headers) + len(ep.Spec.HeadersFrom); n > 0 {
		c.Headers = make(http.Header, n) // none for most endpoints: nil, read as empty
	}
	for _, h := range ep.Spec.Headers {
		c.Headers.Set(h.Name, h.Value)
	}
	for _, hf := range ep.Spec.HeadersFrom {
		v, err := secretValue(r.secret, hf.SecretKeyRef)
		if err != nil {
			r.fail("header %s: %v", hf.Name, err)
			continue
		}
		val := strings.TrimSpace(string(v))
		c.Headers.Set(hf.Name, val)
		if c.SecretHeaderNames == nil {
			c.SecretHeaderNames = map[string]bool{}
		}
		c.SecretHeaderNames[http.CanonicalHeaderKey(hf.Name)] = true
		if len(val) >= 6 {
			c.secretValues = append(c.secretValues, val)
			if _, after, ok := strings.Cut(val, " "); ok && len(after) >= 6 {
				c.secretValues = append(c.secretValues, after) // "Bearer <token>": the token alone too
			}
		}
	}
}

// tls resolves the client certificate and the CA bundle.
func (r *resolution) tls(ep *v1alpha1.WebhookEndpoint) {
	t := ep.Spec.TLS
	if t == nil {
		return
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.ClientCertificateSecretRef != nil {
		s, err := r.secret(t.ClientCertificateSecretRef.Name)
		if err != nil {
			r.fail("client certificate: %v", err)
		} else if cert, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
			r.fail("client certificate in Secret %s: %v", s.Name, err)
		} else {
			tc.Certificates = []tls.Certificate{cert}
		}
	}
	if t.CABundleSecretRef != nil {
		pem, err := secretValue(r.secret, *t.CABundleSecretRef)
		if err != nil {
			r.fail("CA bundle: %v", err)
		} else {
			pool, err := x509.SystemCertPool()
			if err != nil || pool == nil {
				pool = x509.NewCertPool()
			}
			if !pool.AppendCertsFromPEM(pem) {
				r.fail("CA bundle in Secret %s holds no PEM certificate", t.CABundleSecretRef.Name)
			}
			tc.RootCAs = pool
		}
	}
	r.c.TLS = tc
}

// expressions compiles the filter and the transformation (compilations are cached by source,
// so an unchanged expression costs a map lookup).
func (r *resolution) expressions(ep *v1alpha1.WebhookEndpoint) {
	var err error
	if r.c.Filter, err = expr.FilterOf(&ep.Spec); err != nil {
		r.fail("%v", err)
	}
	if r.c.Transform, err = expr.TransformOf(&ep.Spec); err != nil {
		r.fail("%v", err)
	}
}

func readSigningSecret(get SecretGetter, ref v1alpha1.SecretKeySelector) (signing.Secret, error) {
	v, err := secretValue(get, ref)
	if err != nil {
		return signing.Secret{}, err
	}
	s, err := signing.ParseSecret(strings.TrimSpace(string(v)))
	if err != nil {
		return signing.Secret{}, fmt.Errorf("Secret %s key %s: %w", ref.Name, ref.Key, err)
	}
	return s, nil
}

func secretValue(get SecretGetter, ref v1alpha1.SecretKeySelector) ([]byte, error) {
	s, err := get(ref.Name)
	if err != nil {
		return nil, err
	}
	v, ok := s.Data[ref.Key]
	if !ok {
		return nil, fmt.Errorf("Secret %s has no key %s", ref.Name, ref.Key)
	}
	return v, nil
}

// SuccessFunc returns the success test: the listed codes, or any 2xx.
func SuccessFunc(codes []int32) func(int) bool {
	if len(codes) == 0 {
		return func(c int) bool { return c >= 200 && c <= 299 }
	}
	var set [100]bool
	for _, c := range codes {
		if c >= 200 && c <= 299 {
			set[c-200] = true
		}
	}
	return func(c int) bool { return c >= 200 && c <= 299 && set[c-200] }
}

// SameTransport reports whether two configurations can share an HTTP transport.
func SameTransport(a, b *Config) bool {
	if a == nil || b == nil {
		return false
	}
	return a.MaxInFlight == b.MaxInFlight && a.TLS == nil && b.TLS == nil && a.Timeout == b.Timeout && egressproxy.Same(a.Proxy, b.Proxy)
}

// Scrub removes Secret-sourced values from text that will be stored.
func (c *Config) Scrub(s string) string {
	for _, v := range c.secretValues {
		if strings.Contains(s, v) {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return s
}

// Same reports whether b changes nothing a worker uses compared with a. Configurations are
// resolved anew on every resync, so compare what they were built from.
func Same(a, b *Config) bool {
	return a.Generation == b.Generation && a.Suspend == b.Suspend && a.Deleting == b.Deleting && slices.Equal(a.Draining, b.Draining) && a.SharedSince.Equal(b.SharedSince) &&
		a.EnabledAt.Equal(b.EnabledAt) && a.PolicyName == b.PolicyName && reflect.DeepEqual(a.Policy, b.Policy) &&
		errString(a.ConfigError) == errString(b.ConfigError) && a.SecretsFingerprint == b.SecretsFingerprint
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// InScope reports whether a dispatcher serves ep: the dedicated one its own endpoint, the
// shared one (dedicated empty) every endpoint that is not dedicated.
func InScope(ep *v1alpha1.WebhookEndpoint, dedicated string) bool {
	if dedicated != "" {
		return ep.Name == dedicated
	}
	return ep.Spec.Dispatcher == nil || !ep.Spec.Dispatcher.Dedicated
}

// SingleActive reports whether only the holder of the endpoint's partition delivers it: on its
// own lane, PerKey endpoints (no two replicas may hold one key) and rate-limited ones (one
// token bucket is the limit). On the shared lane every replica delivers with its share of the
// limits.
func (c *Config) SingleActive() bool { return c.PerKey || c.RateLimit > 0 }
