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

// SecretIngressURLKey is the key of the operator's Secret holding the ingress's URL (the
// chart writes it when ingress.enabled).
const SecretIngressURLKey = "ingress-url"

// publishHTTP publishes one event through the ingress's JSON form: the producer headers of h
// (the event time and trace context as the ingress takes them), the body as data (JSON only).
func (p *publishOptions) publishHTTP(ctx context.Context, o *Options, ns, eventType, id string, h nats.Header, body []byte) error {
	if !strings.Contains(strings.ToLower(p.contentType), "json") {
		return usagef("--via http publishes JSON data (the ingress's JSON form); for --content-type %s publish a CloudEvent in binary mode to the ingress's /cloudevents, or use --via nats", p.contentType)
	}
	base, where, err := p.ingressBase(ctx, o)
	if err != nil {
		return err
	}
	token, err := p.bearer(ctx, o)
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
	url := strings.TrimSuffix(base, "/") + "/v1/namespaces/" + ns + "/events"
	if req.URL, err = req.URL.Parse(url); err != nil {
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

// ingressBase finds the ingress: --ingress-url, $WEBHOOK_INGRESS_URL, or the operator's Secret.
func (p *publishOptions) ingressBase(ctx context.Context, o *Options) (string, string, error) {
	if p.ingressURL != "" {
		return p.ingressURL, "--ingress-url", nil
	}
	if v := o.Getenv(EnvIngressURL); v != "" {
		return v, "$" + EnvIngressURL, nil
	}
	c, err := o.Client()
	if err != nil {
		return "", "", err
	}
	var s corev1.Secret
	where := fmt.Sprintf("Secret %s/%s", o.OperatorNamespace, NATSSecretName)
	if err := c.Get(ctx, client.ObjectKey{Namespace: o.OperatorNamespace, Name: NATSSecretName}, &s); err != nil {
		return "", "", fmt.Errorf("no ingress URL: pass --ingress-url or set %s, or let the plugin read %s: %w", EnvIngressURL, where, err)
	}
	u := strings.TrimSpace(string(s.Data[SecretIngressURLKey]))
	if u == "" {
		return "", "", fmt.Errorf("no ingress URL: %s has no key %s (is the chart's ingress.enabled on?); pass --ingress-url", where, SecretIngressURLKey)
	}
	return u, where, nil
}

// bearer is the token sent to the ingress: --ingress-token-file, else the kubeconfig user's.
func (p *publishOptions) bearer(ctx context.Context, o *Options) (string, error) {
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
	token, err := KubeBearerToken(ctx, rc)
	if err != nil {
		return "", err
	}
	if token == "" {
		return "", refusedf("the ingress wants a bearer token, and your kubeconfig user authenticates otherwise: pass --ingress-token-file, e.g. from `kubectl create token <serviceaccount> --audience %s`", ingress.DefaultAudience)
	}
	return token, nil
}

func (p *publishOptions) httpClient() (*http.Client, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
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
	return &http.Client{Transport: t, Timeout: 30 * time.Second}, nil
}
