// Package attempt makes one HTTP attempt of a delivery: the request (the producer's forwarded
// headers, the endpoint's, its transformation's and the dispatcher's own, signed as sent; a
// CloudEvent or a chat message when the endpoint asks for one), the endpoint's transport (the
// outbound guard on every address dialled, the egress proxy, mTLS, bounded response headers),
// and what the attempt came to (decide.Outcome), bounded whatever the receiver answers.
package attempt

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/internal/egressproxy"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/version"
)

// Header values shared by every request (the transport never modifies them).
var (
	jsonContentType = []string{"application/json"}
	userAgent       = []string{version.UserAgent()}
)

// Request is one attempt to make.
type Request struct {
	Meta        records.DeliveryMeta
	Attempt     int // 1-based
	Body        []byte
	ContentType string
	TraceParent string
	TraceState  string
	// Forward are the producer's headers that reach the receiver (records.ForwardedHeaders).
	Forward http.Header
	// Extra are the headers the endpoint's transformation set (canonical names): they replace
	// spec.headers of the same name, never a Secret-sourced one nor the dispatcher's own.
	Extra http.Header
	// Authorization is the header of spec.auth's token; empty without auth.
	Authorization string
}

// NewTransport builds the HTTP transport of an endpoint: keep-alive connections bounded by
// maxInFlight, the outbound guard checking every address actually dialled (through the egress
// proxy, if any: dialFunc), response headers
// bounded (records.MaxResponseHeaderBytes), and mTLS.
func NewTransport(guard netguard.Policy, proxy *egressproxy.Proxy, maxInFlight int, tlsConfig *tls.Config) *http.Transport {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		Proxy:                 nil, // never an environment proxy; the egress proxy is dialFunc's
		DialContext:           dialFunc(guard, proxy, d),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   maxInFlight,
		MaxConnsPerHost:       maxInFlight,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		// A receiver's headers are read into memory: bounded far below Go's 10 MiB default.
		MaxResponseHeaderBytes: records.MaxResponseHeaderBytes,
	}
	if tlsConfig != nil {
		t.TLSClientConfig = tlsConfig.Clone()
	}
	return t
}

// NewClient wraps a transport; redirects are never followed (a 3xx is a failure).
func NewClient(t *http.Transport) *http.Client {
	return &http.Client{
		Transport:     t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// responseBufs hold the kept start of a response body while it is read.
var responseBufs = sync.Pool{New: func() any { b := make([]byte, records.MaxResponseBody+1); return &b }}

// maxDrain is how much of a response body is read past the kept 2 KB so the connection can be
// reused; a longer body closes the connection instead.
const maxDrain = 64 << 10

// Send makes one attempt. It never panics on bad input and always returns an outcome.
func Send(ctx context.Context, client *http.Client, ep *endpoint.Config, r *Request, now time.Time) (o decide.Outcome) {
	o = decide.Outcome{Start: now}
	// o is the named result, so the latency set here is the one returned (with an unnamed
	// result the deferred write came after the copy, and every latency read 0).
	defer func() { o.Latency = time.Since(o.Start) }()
	if ep.ConfigError != nil {
		o.Reason, o.Err = records.FailConfig, ep.ConfigError.Error()
		return o
	}
	if err := ep.URLBlocked; err != nil {
		o.Reason, o.Err = records.FailBlockedAddress, err.Error()
		return o
	}
	ctx, cancel := context.WithTimeout(ctx, ep.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(r.Body))
	if err != nil {
		o.Reason, o.Err = records.FailRequest, err.Error()
		return o
	}
	h := requestHeaders(ep, r, now)
	req.Header = h
	o.Sent = redactedHeaders(h, ep.SecretHeaderNames)

	// Straight to the transport: the client would follow no redirect (NewClient) and has no
	// timeout or cookies of its own, and its copies of the request's URL and headers per
	// attempt are garbage on the hot path. (Its errors named the method and URL: the
	// transport's do not, so no URL reaches the delivery log.)
	resp, err := client.Transport.RoundTrip(req)
	if err != nil {
		o.Reason, o.Err = classify(ctx, err)
		return o
	}
	o.StatusCode = resp.StatusCode
	bp := responseBufs.Get().(*[]byte)
	buf := *bp
	n, _ := io.ReadFull(resp.Body, buf)
	o.Body, o.Truncated = records.CutBody(buf[:n]) // a copy
	responseBufs.Put(bp)
	if n > records.MaxResponseBody {
		_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	}
	resp.Body.Close()
	switch {
	case ep.SuccessCode(resp.StatusCode):
		o.Success = true
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		o.Reason, o.Err = records.FailRedirect, "redirects are not followed: "+records.Bound(resp.Header.Get("Location"), records.MaxErrorText)
	default:
		o.Reason = records.FailStatusCode
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
			o.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		}
	}
	return o
}

// requestHeaders are the headers of an attempt: the producer's forwarded ones, the endpoint's,
// its transformation's, and the dispatcher's own (Standard Webhooks id, timestamp and signature, attempt, event type,
// time, source namespace and sequence, trace context), later ones winning.
func requestHeaders(ep *endpoint.Config, r *Request, now time.Time) http.Header {
	h := make(http.Header, len(ep.Headers)+len(r.Forward)+16)
	// The dispatcher's own values share one array: one allocation, not one per header.
	vals := make([]string, 0, 12)
	one := func(v string) []string {
		vals = append(vals, v)
		return vals[len(vals)-1 : len(vals) : len(vals)]
	}
	for k, v := range r.Forward { // first: the endpoint's headers and the dispatcher's own win
		h[k] = v
	}
	for k, v := range ep.Headers {
		h[k] = v
	}
	for k, v := range r.Extra {
		if !ep.SecretHeaderNames[k] {
			h[k] = v
		}
	}
	ts := now
	id := r.Meta.WebhookID()
	attempt := strconv.Itoa(r.Attempt)
	if r.ContentType == "" {
		h["Content-Type"] = jsonContentType
	} else {
		h["Content-Type"] = one(r.ContentType)
	}
	h["User-Agent"] = userAgent
	h[records.SendID] = one(id)
	h[records.SendTimestamp] = one(strconv.FormatInt(ts.Unix(), 10))
	if ep.Signer != nil {
		h[records.SendSignature] = one(ep.Signer.Sign(id, ts, r.Body))
	}
	h[records.SendAttempt] = one(attempt)
	h[records.SendEventType] = one(r.Meta.EventType)
	if !r.Meta.EventTime.IsZero() {
		h[records.SendEventTime] = one(r.Meta.EventTime.UTC().Format(time.RFC3339Nano))
	}
	h[records.SendSourceNamespace] = one(r.Meta.Origin())
	if r.Meta.EventSeq > 0 {
		// Counted in the events stream of the namespace above: one counter per namespace.
		h[records.SendSequence] = one(strconv.FormatUint(r.Meta.EventSeq, 10))
	}
	if r.Meta.ReplayOf != "" {
		h[records.SendReplayOf] = one(r.Meta.ReplayOf)
	}
	h[records.SendLegacyEventID] = h[records.SendID]
	h[records.SendLegacyAttempt] = h[records.SendAttempt]
	if r.TraceParent != "" {
		h[records.HeaderTraceParent] = one(r.TraceParent)
		if r.TraceState != "" {
			h[records.HeaderTraceState] = one(r.TraceState)
		}
	}
	if r.Authorization != "" {
		h["Authorization"] = one(r.Authorization)
	}
	return h
}

// classify names why a request failed without a response.
func classify(ctx context.Context, err error) (string, string) {
	msg := err.Error()
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var recErr tls.RecordHeaderError
	var alert tls.AlertError
	switch {
	case strings.Contains(msg, "net/http: invalid header field"):
		// The client refused to build the request: nothing reached the receiver.
		return records.FailRequest, msg
	case errors.Is(err, egressproxy.ErrProxy):
		// The proxy failed (its own address refused included): not the receiver's doing.
		return records.FailProxy, msg
	case errors.Is(err, netguard.ErrBlocked):
		return records.FailBlockedAddress, msg
	case strings.Contains(msg, "server response headers exceeded") || strings.Contains(msg, "response header list larger than") ||
		strings.Contains(msg, "header list too large"):
		// Over MaxResponseHeaderBytes (HTTP/1.1, or HTTP/2's header list).
		return records.FailResponseHeaders, "the response headers are larger than the " + strconv.Itoa(records.MaxResponseHeaderBytes) + " bytes the dispatcher reads"
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return records.FailTimeout, "no response within the timeout"
	case errors.As(err, &dnsErr):
		return records.FailDNS, msg
	case errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr) || errors.As(err, &recErr) || errors.As(err, &alert) || strings.Contains(msg, "tls: "):
		return records.FailTLS, msg
	case errors.Is(err, syscall.ECONNREFUSED):
		return records.FailConnRefused, msg
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return records.FailConnReset, msg
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return records.FailTimeout, msg
	}
	return records.FailNetwork, msg
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent or unreadable.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		if s > 7*24*3600 {
			s = 7 * 24 * 3600
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// redactedHeaders copies the request headers for the delivery log with signatures and
// Secret-sourced values removed.
func redactedHeaders(h http.Header, secret map[string]bool) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) == 0 {
			continue
		}
		switch {
		case secret[k] || strings.EqualFold(k, "Authorization"):
			out[k] = "[redacted]"
		case strings.EqualFold(k, records.SendSignature):
			out[k] = "[redacted]"
		default:
			out[k] = v[0]
		}
	}
	return out
}

// dialFunc connects an endpoint's transport: through its egress proxy when it has one (the
// guard checks the destination's resolved address before the proxy is asked for a tunnel to
// it), otherwise directly with the guard checking every address connected to.
func dialFunc(guard netguard.Policy, proxy *egressproxy.Proxy, d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if proxy == nil {
		return guard.DialContext(d)
	}
	return (&egressproxy.Dialer{Guard: guard, Proxy: proxy, Dialer: d, UserAgent: version.UserAgent()}).DialContext
}
