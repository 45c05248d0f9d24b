package plugin

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/webhook-operator/webhook-operator/internal/ingress"
	"github.com/webhook-operator/webhook-operator/internal/natsauth"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// EnvIngressURL is read for the ingress's URL when --ingress-url is not given.
const EnvIngressURL = "WEBHOOK_INGRESS_URL"

// Keys of the operator's Secret about the ingress (the chart writes them when
// ingress.enabled): its URL, and the audience of the tokens it accepts.
const (
	SecretIngressURLKey      = "ingress-url"
	SecretIngressAudienceKey = "ingress-token-audience"
)

// publishHTTP publishes one event through the ingress's JSON form: the producer headers of h
// (the event time and trace context as the ingress takes them), the body as data (JSON only).
func (p *publishOptions) publishHTTP(ctx context.Context, o *Options, ns, eventType, id string, h nats.Header, body []byte) error {
	if !strings.Contains(strings.ToLower(p.contentType), "json") {
		return usagef("--via http publishes JSON data (the ingress's JSON form); for --content-type %s publish a CloudEvent in binary mode to the ingress's /cloudevents, or use --via nats", p.contentType)
	}
	base, where, audience, err := p.ingressBase(ctx, o)
	if err != nil {
		return err
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || u.Scheme != "https" && u.Scheme != "http" {
		return usagef("the ingress URL %q (from %s) is not an http:// or https:// URL", base, where)
	}
	if u.Scheme == "http" && !p.ingressPlaintext {
		return refusedf("refusing to send a bearer token to %s without TLS (from %s; anyone on the path could replay it): use the ingress's https:// URL (the chart's ingress.tls.existingSecret) with --ingress-ca-file, or --ingress-allow-plaintext-tokens for a loopback demo", base, where)
	}
	token, err := p.bearer(ctx, o, audience)
	if err != nil {
		return err
	}
	ev := ingress.Event{ID: id, Type: eventType, Data: json.RawMessage(body)}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "", nil)
	if err != nil {
		return err
	}
	for k, v := range h {
		switch {
		case k == records.HeaderMsgID || k == records.HeaderContentType:
		case strings.EqualFold(k, records.HeaderEventTime):
			ev.Time = v[0]
		case strings.EqualFold(k, records.HeaderTraceParent) || strings.EqualFold(k, records.HeaderTraceState):
			req.Header.Set(strings.ToLower(k), v[0])
		default:
			if ev.Headers == nil {
				ev.Headers = map[string]string{}
			}
			ev.Headers[k] = v[0]
		}
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if req.URL, err = u.Parse(strings.TrimSuffix(u.Path, "/") + "/v1/namespaces/" + ns + "/events"); err != nil {
		return usagef("the ingress URL %q (from %s): %v", base, where, err)
	}
	req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(payload)), int64(len(payload))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	hc, err := p.httpClient()
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("publishing through the ingress at %s (from %s): %w", base, where, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		// Never followed: a redirect would take the token where the ingress says.
		return fmt.Errorf("the ingress at %s answered %d, a redirect to %q, which kubectl webhooks does not follow with a token: pass the URL the ingress is served at as --ingress-url",
			base, resp.StatusCode, records.Bound(resp.Header.Get("Location"), 256))
	}
	if resp.StatusCode != http.StatusAccepted {
		msg := fmt.Errorf("the ingress at %s answered %d: %s", base, resp.StatusCode, ingress.ErrorOf(b))
		switch resp.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
			return &Error{Code: ExitRefused, Err: msg}
		case http.StatusNotFound:
			return &Error{Code: ExitNotFound, Err: msg}
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return &Error{Code: ExitUsage, Err: msg}
		}
		return msg
	}
	var r ingress.Result
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("the ingress's answer: %w", err)
	}
	set := o.Set(ns)
	res := PublishResult{EventID: id, EventType: eventType, Namespace: ns, Subject: set.EventSubject(eventType), Stream: r.Stream, Sequence: r.Sequence, Duplicate: r.Duplicate}
	return o.print(res, func(w io.Writer) {
		if res.Duplicate {
			writeLine(w, "event %s was already published (stream %s sequence %d): duplicate, nothing new stored (through the ingress)", res.EventID, res.Stream, res.Sequence)
			return
		}
		writeLine(w, "published event %s (%s) through the ingress to %s: stream %s sequence %d", res.EventID, res.EventType, res.Subject, res.Stream, res.Sequence)
	})
}

// ingressBase finds the ingress: --ingress-url, $WEBHOOK_INGRESS_URL, or the operator's Secret;
// it returns where it found it and the audience of the tokens it accepts
// (--ingress-token-audience, the Secret's, else ingress.DefaultAudience).
func (p *publishOptions) ingressBase(ctx context.Context, o *Options) (base, where, audience string, err error) {
	audience = p.ingressAudience
	if audience == "" {
		audience = ingress.DefaultAudience
	}
	if p.ingressURL != "" {
		return p.ingressURL, "--ingress-url", audience, nil
	}
	if v := o.Getenv(EnvIngressURL); v != "" {
		return v, "$" + EnvIngressURL, audience, nil
	}
	c, err := o.Client()
	if err != nil {
		return "", "", "", err
	}
	var s corev1.Secret
	where = fmt.Sprintf("Secret %s/%s", o.OperatorNamespace, NATSSecretName)
	if err := c.Get(ctx, client.ObjectKey{Namespace: o.OperatorNamespace, Name: NATSSecretName}, &s); err != nil {
		return "", "", "", fmt.Errorf("no ingress URL: pass --ingress-url or set %s, or let the plugin read %s: %w", EnvIngressURL, where, err)
	}
	u := strings.TrimSpace(string(s.Data[SecretIngressURLKey]))
	if u == "" {
		return "", "", "", fmt.Errorf("no ingress URL: %s has no key %s (is the chart's ingress.enabled on?); pass --ingress-url", where, SecretIngressURLKey)
	}
	if a := strings.TrimSpace(string(s.Data[SecretIngressAudienceKey])); a != "" && p.ingressAudience == "" {
		audience = a
	}
	return u, where, audience, nil
}

// bearer is the token sent to the ingress: --ingress-token-file, else one of audience
// requested for the kubeconfig's ServiceAccount, else, only with
// --ingress-allow-api-audience-tokens, the kubeconfig user's own.
func (p *publishOptions) bearer(ctx context.Context, o *Options, audience string) (string, error) {
	if p.ingressToken != "" {
		b, err := os.ReadFile(p.ingressToken)
		if err != nil {
			return "", usagef("--ingress-token-file: %v", err)
		}
		if len(b) > natsauth.MaxTokenBytes {
			return "", usagef("--ingress-token-file %s is longer than %d bytes", p.ingressToken, natsauth.MaxTokenBytes)
		}
		return strings.TrimSpace(string(b)), nil
	}
	rc, err := o.Kube.ToRESTConfig()
	if err != nil {
		return "", fmt.Errorf("reading the kubeconfig: %w", err)
	}
	ns, _ := o.Namespace()
	src, err := newAudienceToken(ctx, rc, audience)
	if err == nil {
		return src.token(), nil
	}
	if !p.ingressAPIToken {
		return "", refusedf("kubectl webhooks sends the ingress a token of its audience %s, never the token your kubeconfig uses for the API server (it would be good there too, for whoever sees it): %v. "+
			"Pass --ingress-token-file with a token of that audience (e.g. `kubectl create token <serviceaccount> -n %s --audience %s > token`), "+
			"or --ingress-allow-api-audience-tokens where the ingress also accepts the API server's audience", audience, err, ns, audience)
	}
	token, kerr := KubeBearerToken(ctx, rc)
	if kerr != nil {
		return "", kerr
	}
	if token == "" {
		return "", refusedf("the ingress wants a bearer token, and your kubeconfig user authenticates otherwise: pass --ingress-token-file, e.g. from `kubectl create token <serviceaccount> --audience %s`", audience)
	}
	return token, nil
}

// httpClient reaches the ingress: no proxy but --ingress-proxy-url (whatever HTTPS_PROXY
// says: a proxy sees the token), no redirect followed, --ingress-ca-file trusted.
func (p *publishOptions) httpClient() (*http.Client, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	if p.ingressProxy != "" {
		u, err := url.Parse(p.ingressProxy)
		if err != nil || u.Host == "" {
			return nil, usagef("--ingress-proxy-url %q is not a URL", p.ingressProxy)
		}
		t.Proxy = http.ProxyURL(u)
	}
	if p.ingressCA != "" {
		pem, err := os.ReadFile(p.ingressCA)
		if err != nil {
			return nil, usagef("--ingress-ca-file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("--ingress-ca-file %s holds no PEM certificate", p.ingressCA)
		}
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: t, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}, nil
}
