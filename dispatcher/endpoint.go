package dispatcher

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/signing"
)

// endpointConfig is everything a worker needs to deliver to one endpoint, resolved from the
// WebhookEndpoint, its RetryPolicy and its Secrets. It is immutable: a change builds a new one.
type endpointConfig struct {
	Namespace  string
	Name       string
	UID        string
	Generation int64
	Created    time.Time

	URL       string
	parsedURL *url.URL
	// URLBlocked is the outbound guard's verdict on the literal URL (scheme, literal address),
	// computed once; every attempt fails with it, as blocked_address, without a request.
	URLBlocked error
	EventTypes []string
	Sources    []string // other namespaces whose events this endpoint receives

	Timeout     time.Duration
	SuccessCode func(int) bool
	Policy      policy.Policy
	PolicyName  string
	Signer      *signing.Signer
	// Headers are static and Secret-sourced headers, in canonical form.
	Headers http.Header
	// SecretHeaderNames are headers whose values must never be logged.
	SecretHeaderNames map[string]bool
	// secretValues are Secret-sourced values scrubbed from anything stored (a receiver may echo
	// them back in a response body).
	secretValues []string
	TLS          *tls.Config

	RateLimit   float64 // requests per second; 0 = none
	Burst       int
	MaxInFlight int
	PerKey      bool
	KeyHeader   string
	KeyJSONPath []string
	Suspend     bool
	Deleting    bool

	// SecretsFingerprint names the Secrets read and their resourceVersions.
	SecretsFingerprint string

	// EnabledAt is the re-enable annotation's time.
	EnabledAt time.Time
	// ConfigError, when set, fails every attempt with reason "configuration" (e.g. a missing
	// Secret) instead of sending an unsigned or wrong request.
	ConfigError error
}

// secretGetter reads one Secret of the namespace.
type secretGetter func(name string) (*corev1.Secret, error)

// resolveEndpoint builds an endpoint's configuration. Problems with referenced objects do not
// fail the build: they become ConfigError, so deliveries fail visibly with a reason.
func resolveEndpoint(ep *v1alpha1.WebhookEndpoint, rp *v1alpha1.RetryPolicy, getSecret secretGetter) *endpointConfig {
	c := &endpointConfig{
		Namespace:         ep.Namespace,
		Name:              ep.Name,
		UID:               string(ep.UID),
		Generation:        ep.Generation,
		Created:           ep.CreationTimestamp.Time,
		URL:               ep.Spec.URL,
		Timeout:           10 * time.Second,
		MaxInFlight:       50,
		Suspend:           ep.Spec.Suspend,
		Deleting:          !ep.DeletionTimestamp.IsZero(),
		Headers:           http.Header{},
		SecretHeaderNames: map[string]bool{},
		Sources:           ep.Spec.SourceNamespaces,
	}
	for _, t := range ep.Spec.EventTypes {
		c.EventTypes = append(c.EventTypes, string(t))
	}
	var read []string
	inner := getSecret
	getSecret = func(name string) (*corev1.Secret, error) {
		s, err := inner(name)
		if err == nil {
			read = append(read, name+"@"+s.ResourceVersion)
		} else {
			read = append(read, name+"@missing")
		}
		return s, err
	}
	defer func() { c.SecretsFingerprint = strings.Join(read, ",") }()
	var errs []string
	fail := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }

	u, err := url.Parse(ep.Spec.URL)
	if err != nil || u.Host == "" {
		fail("url %q is not an absolute URL", ep.Spec.URL)
	}
	c.parsedURL = u
	if ep.Spec.Timeout != nil && ep.Spec.Timeout.Duration > 0 {
		c.Timeout = ep.Spec.Timeout.Duration
	}
	c.SuccessCode = successFunc(ep.Spec.SuccessStatusCodes)
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

	// Retry policy.
	c.Policy, c.PolicyName = policy.Default(), policy.DefaultName
	if ref := ep.Spec.RetryPolicyRef; ref != nil {
		c.PolicyName = ref.Name
		if rp == nil {
			fail("retry policy %q not found", ref.Name)
		} else if p, err := policy.FromSpec(&rp.Spec); err != nil {
			fail("retry policy %q: %v", ref.Name, err)
		} else {
			c.Policy = p
		}
	}

	// Signing: the referenced Secret, or the one the controller generates.
	sref := v1alpha1.SecretKeySelector{Name: ep.Name + "-signing", Key: "secret"}
	var prevRef *v1alpha1.SecretKeySelector
	if s := ep.Spec.Signing; s != nil {
		sref = s.SecretRef
		if s.PreviousSecretRef != nil && (s.RotationEndsAt == nil || time.Now().Before(s.RotationEndsAt.Time)) {
			prevRef = s.PreviousSecretRef
		}
	}
	if cur, err := readSigningSecret(getSecret, sref); err != nil {
		fail("signing secret: %v", err)
	} else {
		var prev *signing.Secret
		if prevRef != nil {
			p, err := readSigningSecret(getSecret, *prevRef)
			if err != nil {
				fail("previous signing secret: %v", err)
			} else {
				prev = &p
			}
		}
		c.Signer = signing.NewSigner(cur, prev)
	}

	for _, h := range ep.Spec.Headers {
		c.Headers.Set(h.Name, h.Value)
	}
	for _, hf := range ep.Spec.HeadersFrom {
		v, err := secretValue(getSecret, hf.SecretKeyRef)
		if err != nil {
			fail("header %s: %v", hf.Name, err)
			continue
		}
		val := strings.TrimSpace(string(v))
		c.Headers.Set(hf.Name, val)
		c.SecretHeaderNames[http.CanonicalHeaderKey(hf.Name)] = true
		if len(val) >= 6 {
			c.secretValues = append(c.secretValues, val)
			if _, after, ok := strings.Cut(val, " "); ok && len(after) >= 6 {
				c.secretValues = append(c.secretValues, after) // "Bearer <token>": the token alone too
			}
		}
	}

	if t := ep.Spec.TLS; t != nil {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if t.ClientCertificateSecretRef != nil {
			s, err := getSecret(t.ClientCertificateSecretRef.Name)
			if err != nil {
				fail("client certificate: %v", err)
			} else if cert, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
				fail("client certificate in Secret %s: %v", s.Name, err)
			} else {
				tc.Certificates = []tls.Certificate{cert}
			}
		}
		if t.CABundleSecretRef != nil {
			pem, err := secretValue(getSecret, *t.CABundleSecretRef)
			if err != nil {
				fail("CA bundle: %v", err)
			} else {
				pool, err := x509.SystemCertPool()
				if err != nil || pool == nil {
					pool = x509.NewCertPool()
				}
				if !pool.AppendCertsFromPEM(pem) {
					fail("CA bundle in Secret %s holds no PEM certificate", t.CABundleSecretRef.Name)
				}
				tc.RootCAs = pool
			}
		}
		c.TLS = tc
	}
	if len(errs) > 0 {
		c.ConfigError = fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return c
}

func readSigningSecret(get secretGetter, ref v1alpha1.SecretKeySelector) (signing.Secret, error) {
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

func secretValue(get secretGetter, ref v1alpha1.SecretKeySelector) ([]byte, error) {
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

// successFunc returns the success test: the listed codes, or any 2xx.
func successFunc(codes []int32) func(int) bool {
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

// sameTransport reports whether two configurations can share an HTTP transport.
func sameTransport(a, b *endpointConfig) bool {
	if a == nil || b == nil {
		return false
	}
	return a.MaxInFlight == b.MaxInFlight && a.TLS == nil && b.TLS == nil && a.Timeout == b.Timeout
}

// scrub removes Secret-sourced values from text that will be stored.
func (c *endpointConfig) scrub(s string) string {
	for _, v := range c.secretValues {
		if strings.Contains(s, v) {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return s
}
