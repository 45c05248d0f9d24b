package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Request is one request a Receiver got.
type Request struct {
	// At is when it arrived.
	At time.Time
	// Path is the URL path it was sent to: several endpoints may share one receiver under
	// different paths.
	Path string
	// RemoteAddr is the client's address as the receiver saw it (host:port).
	RemoteAddr string
	Header     http.Header
	Body       []byte
	// ID is its webhook-id (the event id) and Attempt its webhook-attempt.
	ID      string
	Attempt int
	// Signed is true when its signature verified with a secret the receiver knows.
	Signed bool
	// Status is the status answered; 0 while the answer is pending or when the client gave up.
	Status int
}

// Response is how a Receiver answers a request.
type Response struct {
	// Status is the status code; 0 means 200.
	Status int
	Header http.Header
	Body   string
	// Delay holds the answer back this long, or until the client gives up: a slow or hanging
	// receiver.
	Delay time.Duration
}

// Responder decides the answer to a request whose signature verified (or to every request
// of a receiver that knows no secret). It may block: the request waits for it.
type Responder func(Request) Response

// Failing answers every request 503 Service Unavailable without Retry-After, so deliveries
// retry and dead-letter.
func Failing(Request) Response {
	return Response{Status: http.StatusServiceUnavailable, Body: "failing on purpose"}
}

// Behaviour is how a receiver misbehaves on purpose (Misbehave). The zero value accepts every
// request at once.
type Behaviour struct {
	// FailRatio of requests are answered 503 (without Retry-After).
	FailRatio float64
	// MaxLatency: every request waits a random time up to it before the answer.
	MaxLatency time.Duration
	// HangRatio of requests hang for Hang (past the endpoint's timeout, so that the client
	// gives up) and are then failed.
	HangRatio float64
	Hang      time.Duration
	// Down answers every request 503.
	Down bool
}

// Misbehave answers as b says; what is not failed or hung is accepted with 204 No Content.
func Misbehave(b Behaviour) Responder {
	return func(Request) Response {
		if b.HangRatio > 0 && rand.Float64() < b.HangRatio {
			return Response{Status: http.StatusServiceUnavailable, Body: "hung on purpose", Delay: b.Hang}
		}
		var latency time.Duration
		if b.MaxLatency > 0 {
			latency = rand.N(b.MaxLatency)
		}
		if b.Down || (b.FailRatio > 0 && rand.Float64() < b.FailRatio) {
			return Response{Status: http.StatusServiceUnavailable, Body: "failing on purpose", Delay: latency}
		}
		return Response{Status: http.StatusNoContent, Delay: latency}
	}
}

// SigningSecrets returns the Standard Webhooks secrets (whsec_...) a receiver verifies with,
// e.g. read from an endpoint's signing Secret.
type SigningSecrets func(ctx context.Context) ([]string, error)

// ReceiverOptions configure a Receiver.
type ReceiverOptions struct {
	// Secrets are read when a request's signature verifies with none of the secrets known so
	// far (the endpoint's Secret may have been created or rotated since). Trust adds fixed ones.
	Secrets SigningSecrets
	// Respond answers; nil answers 200 {"received":true}.
	Respond Responder
	// Path is the URL's path; default /webhooks. Every path is served.
	Path string
	// KeepRequests is how many of the most recent requests Requests keeps, with their bodies
	// (0: 10,000; negative: none, for a receiver taking thousands of requests a second whose
	// test reads only counts and receipts).
	KeepRequests int
	// MaxIDs is how many event ids Receipts, Received and RequestsByID track (0: 1,000,000;
	// negative: none, for a receiver whose test keeps its own records in its Responder;
	// Stats still counts everything).
	MaxIDs int
}

// ReceiverStats count what a receiver got.
type ReceiverStats struct {
	// Requests is every request received.
	Requests int
	// Accepted counts requests answered with a 2xx; Unique the distinct webhook-ids among
	// them, so Accepted-Unique are duplicates (at-least-once redeliveries).
	Accepted, Unique int
	// Refused counts requests the Responder answered with a failure.
	Refused int
	// BadSignatures counts requests whose signature did not verify (answered 401).
	BadSignatures int
	// Abandoned counts requests whose client gave up before the answer (a Delay).
	Abandoned int
	// Untracked counts accepted requests of event ids beyond the receiver's bound on ids.
	Untracked int
	// Waiting is how many requests are being held back by a Delay right now.
	Waiting int
}

// Receipt is what a receiver knows of one event id it accepted.
type Receipt struct {
	// First is when a request of it was first accepted.
	First time.Time
	// Count is how often it was accepted (more than 1: redelivered).
	Count int
}

// What a receiver keeps, so that a long-running demo does not grow without bound: the most
// recent requests (at most so many, with at most so many body bytes in all), and receipts of
// at most so many event ids.
const (
	receiverMaxLogged      = 10_000
	receiverMaxLoggedBytes = 64 << 20
	receiverMaxIDs         = 1_000_000
	receiverMaxBody        = 16 << 20
)

// Receiver is a webhook receiver on loopback: a real HTTP server for the tests, the fault
// suite and the demo. When it knows secrets it verifies every request's Standard Webhooks
// signature (webhook-id, webhook-timestamp, webhook-signature) with the library of the
// standard's authors and answers 401 to one that does not verify; it answers the others as
// its Responder says. It records the requests it got and, per event id (webhook-id), how often
// and since when it accepted it.
type Receiver struct {
	url     string
	addr    string
	secrets SigningSecrets
	respond atomic.Pointer[Responder]
	// closing ends every Delay at once when the receiver closes.
	closing   chan struct{}
	closeOnce sync.Once

	// srvMu guards srv, which Down and Up replace.
	srvMu sync.Mutex
	srv   *http.Server

	// maxLogged, maxLoggedBytes and maxIDs bound what is kept (receiverMax*).
	maxLogged, maxLoggedBytes, maxIDs int

	mu        sync.Mutex
	trusted   []string
	keys      []*standardwebhooks.Webhook
	log       []*Request
	logBytes  int
	stats     ReceiverStats
	receipts  map[string]*Receipt
	firstSeen []string
	// byID counts the requests of each webhook-id, whatever their answer.
	byID map[string]int
}

// NewReceiver starts a receiver on 127.0.0.1; Close stops it.
func NewReceiver(o ReceiverOptions) (*Receiver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	if o.Path == "" {
		o.Path = "/webhooks"
	}
	addr := l.Addr().String()
	r := &Receiver{url: "http://" + addr + o.Path, addr: addr, secrets: o.Secrets, receipts: map[string]*Receipt{}, byID: map[string]int{},
		closing: make(chan struct{}), maxLogged: bound(o.KeepRequests, receiverMaxLogged), maxLoggedBytes: receiverMaxLoggedBytes,
		maxIDs: bound(o.MaxIDs, receiverMaxIDs)}
	r.SetResponder(o.Respond)
	r.serve(l)
	return r, nil
}

// bound is an option's bound: def when 0, none when negative.
func bound(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// serve serves on l until Down or Close.
func (r *Receiver) serve(l net.Listener) {
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	r.srvMu.Lock()
	r.srv = srv
	r.srvMu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

// StartReceiver starts a receiver that stops when the test ends.
func StartReceiver(t testing.TB, o ReceiverOptions) *Receiver {
	t.Helper()
	r, err := NewReceiver(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// URL is where the receiver listens, e.g. http://127.0.0.1:41234/webhooks.
func (r *Receiver) URL() string { return r.url }

// Addr is the receiver's host and port, e.g. 127.0.0.1:41234.
func (r *Receiver) Addr() string { return r.addr }

// URLWithPath is the receiver's URL with another path (it serves every path; Request.Path
// tells them apart).
func (r *Receiver) URLWithPath(path string) string { return "http://" + r.addr + path }

// Down closes the listener and every connection, so that clients see refused connections,
// until Up.
func (r *Receiver) Down() {
	r.srvMu.Lock()
	defer r.srvMu.Unlock()
	_ = r.srv.Close()
}

// Up listens again on the same address after Down, trying for up to 5s while the address is
// still taken.
func (r *Receiver) Up() error {
	return Poll(5*time.Second, func() error {
		l, err := net.Listen("tcp", r.addr)
		if err != nil {
			return fmt.Errorf("receiver: listening again on %s: %w", r.addr, err)
		}
		r.serve(l)
		return nil
	})
}

// Trust adds secrets (whsec_...) to verify signatures with.
func (r *Receiver) Trust(secrets ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trusted = append(r.trusted, secrets...)
	r.keys = nil // parsed again on the next request
}

// SetResponder changes how the receiver answers from now on; nil answers 200.
func (r *Receiver) SetResponder(f Responder) {
	if f == nil {
		f = func(Request) Response { return Response{Body: `{"received":true}`} }
	}
	r.respond.Store(&f)
}

// ServeHTTP handles one delivery.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, receiverMaxBody))
	if err != nil {
		http.Error(w, "reading the body", http.StatusBadRequest)
		return
	}
	attempt, _ := strconv.Atoi(req.Header.Get("webhook-attempt"))
	in := &Request{At: time.Now(), Path: req.URL.Path, RemoteAddr: req.RemoteAddr, Header: req.Header.Clone(), Body: body, ID: req.Header.Get("webhook-id"), Attempt: attempt}
	verr := r.verify(req.Context(), in)
	r.record(in)
	if verr != nil {
		r.answered(in, http.StatusUnauthorized, true)
		http.Error(w, "signature: "+verr.Error(), http.StatusUnauthorized)
		return
	}
	resp := (*r.respond.Load())(*in)
	if resp.Status == 0 {
		resp.Status = http.StatusOK
	}
	if resp.Delay > 0 && !r.wait(req.Context(), resp.Delay) {
		r.answered(in, 0, false)
		return
	}
	r.answered(in, resp.Status, false)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.Status)
	_, _ = io.WriteString(w, resp.Body)
}

// wait holds an answer back for d, and reports false when the client gave up first. The
// receiver closing ends the wait at once.
func (r *Receiver) wait(ctx context.Context, d time.Duration) bool {
	r.mu.Lock()
	r.stats.Waiting++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.stats.Waiting--
		r.mu.Unlock()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-r.closing:
		return true
	case <-t.C:
		return true
	}
}

// verify checks the signature with the known secrets, reading them again once when none
// matches. Without any secret nothing is verified.
func (r *Receiver) verify(ctx context.Context, in *Request) error {
	r.mu.Lock()
	keys, known := r.keys, len(r.trusted) > 0 || r.secrets != nil
	r.mu.Unlock()
	if !known {
		return nil
	}
	if in.ID == "" {
		return errors.New("no webhook-id header")
	}
	for _, k := range keys {
		if k.Verify(in.Body, in.Header) == nil {
			in.Signed = true
			return nil
		}
	}
	keys, err := r.readKeys(ctx)
	if err != nil {
		return err
	}
	var last error = errors.New("no signing secret")
	for _, k := range keys {
		if last = k.Verify(in.Body, in.Header); last == nil {
			in.Signed = true
			return nil
		}
	}
	return last
}

// readKeys parses the trusted secrets and those Secrets returns now.
func (r *Receiver) readKeys(ctx context.Context) ([]*standardwebhooks.Webhook, error) {
	r.mu.Lock()
	secrets := append([]string(nil), r.trusted...)
	r.mu.Unlock()
	if r.secrets != nil {
		more, err := r.secrets(ctx)
		if err != nil {
			return nil, fmt.Errorf("reading the signing secret: %w", err)
		}
		secrets = append(secrets, more...)
	}
	keys := make([]*standardwebhooks.Webhook, 0, len(secrets))
	for _, s := range secrets {
		k, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			return nil, fmt.Errorf("the signing secret is not a Standard Webhooks secret: %w", err)
		}
		keys = append(keys, k)
	}
	r.mu.Lock()
	r.keys = keys
	r.mu.Unlock()
	return keys, nil
}

// record logs a request as it arrives, dropping the oldest beyond the bounds. The log is
// compacted once it holds a quarter more than its bound, so that a receiver at its bound does
// not copy the whole log on every request.
func (r *Receiver) record(in *Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.Requests++
	if _, ok := r.byID[in.ID]; ok || len(r.byID) < r.maxIDs {
		r.byID[in.ID]++
	}
	if r.maxLogged == 0 {
		return
	}
	r.log = append(r.log, in)
	r.logBytes += len(in.Body)
	if len(r.log) <= r.maxLogged+r.maxLogged/4 && r.logBytes <= r.maxLoggedBytes {
		return
	}
	drop := 0
	for len(r.log)-drop > r.maxLogged || (r.logBytes > r.maxLoggedBytes && len(r.log)-drop > 1) {
		r.logBytes -= len(r.log[drop].Body)
		drop++
	}
	if drop > 0 {
		r.log = append(r.log[:0:0], r.log[drop:]...)
	}
}

// answered counts a request's answer: status 0 when its client gave up, badSignature when
// it was refused for its signature.
func (r *Receiver) answered(in *Request, status int, badSignature bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in.Status = status
	switch {
	case status == 0:
		r.stats.Abandoned++
	case badSignature:
		r.stats.BadSignatures++
	case status < 200 || status > 299:
		r.stats.Refused++
	default:
		r.stats.Accepted++
		rc := r.receipts[in.ID]
		if rc == nil {
			if len(r.receipts) >= r.maxIDs {
				r.stats.Untracked++
				return
			}
			rc = &Receipt{First: in.At}
			r.receipts[in.ID] = rc
			r.firstSeen = append(r.firstSeen, in.ID)
			r.stats.Unique++
		}
		rc.Count++
	}
}

// Stats returns the counts so far.
func (r *Receiver) Stats() ReceiverStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Requests returns the requests received, oldest first (the most recent KeepRequests when
// there were more), with the status answered so far.
func (r *Receiver) Requests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	log := r.log
	if len(log) > r.maxLogged {
		log = log[len(log)-r.maxLogged:]
	}
	out := make([]Request, len(log))
	for i, in := range log {
		out[i] = *in
	}
	return out
}

// Received lists the webhook-ids accepted, each once, in the order they were first accepted.
func (r *Receiver) Received() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.firstSeen...)
}

// Count is how many times the event id was accepted (more than 1: redelivered).
func (r *Receiver) Count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rc := r.receipts[id]; rc != nil {
		return rc.Count
	}
	return 0
}

// RequestsByID counts the requests received for each webhook-id, whatever their answer
// (refused, bad signatures and abandoned ones too), for as many ids as receipts are kept.
func (r *Receiver) RequestsByID() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.byID)
}

// Receipts copies what was accepted so far, by event id.
func (r *Receiver) Receipts() map[string]Receipt {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]Receipt, len(r.receipts))
	for id, rc := range r.receipts {
		out[id] = *rc
	}
	return out
}

// Body is the body of the first accepted request of the event id still in the log, or nil.
func (r *Receiver) Body(id string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, in := range r.log {
		if in.ID == id && in.Status >= 200 && in.Status <= 299 {
			return in.Body
		}
	}
	return nil
}

// Close stops the receiver: answers held back by a Delay go out at once, and requests in
// progress get at most 5s before they are cut.
func (r *Receiver) Close() error {
	r.closeOnce.Do(func() { close(r.closing) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.srvMu.Lock()
	srv := r.srv
	r.srvMu.Unlock()
	if err := srv.Shutdown(ctx); err != nil {
		return srv.Close()
	}
	return nil
}

// SecretKey reads the signing secret from key of the Secret namespace/name: the one an
// endpoint's spec.signing.secretRef names, or the one the controller generated
// (status.signingSecretName, key "secret").
func SecretKey(c client.Reader, namespace, name, key string) SigningSecrets {
	return func(ctx context.Context) ([]string, error) {
		s := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, s); err != nil {
			return nil, err
		}
		v, ok := s.Data[key]
		if !ok {
			return nil, fmt.Errorf("secret %s/%s has no key %q", namespace, name, key)
		}
		return []string{string(v)}, nil
	}
}
