package localstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SigningSecret finds the Standard Webhooks secrets (whsec_...) a receiver verifies with.
type SigningSecret func(ctx context.Context) ([]string, error)

// SecretKey reads the signing secret from key of the Secret namespace/name: the one an
// endpoint's spec.signing.secretRef names, or the one the controller generated
// (status.signingSecretName, key "secret").
func SecretKey(c client.Reader, namespace, name, key string) SigningSecret {
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

// ReceiverStats count what a receiver got.
type ReceiverStats struct {
	// Requests is every request received.
	Requests int
	// Accepted counts requests answered with success; Unique the distinct webhook-ids among
	// them, so Accepted-Unique are duplicates (at-least-once redeliveries).
	Accepted, Unique int
	// Refused counts requests answered with a failure on purpose.
	Refused int
	// BadSignatures counts requests whose signature did not verify (answered 401).
	BadSignatures int
}

// Receiver is a webhook receiver on loopback, for the demo and the end-to-end tests. A
// verifying receiver checks every request's Standard Webhooks signature (webhook-id,
// webhook-timestamp, webhook-signature) with the library of the standard's authors, answers
// 200 and counts the events by webhook-id; while failing it answers 503 instead.
type Receiver struct {
	// URL is where the receiver listens, e.g. http://127.0.0.1:41234/webhooks.
	URL string

	secret  SigningSecret
	failing atomic.Bool
	srv     *http.Server

	mu       sync.Mutex
	keys     []*standardwebhooks.Webhook
	stats    ReceiverStats
	accepted map[string]int
	order    []string
	bodies   map[string][]byte
}

// NewReceiver starts a receiver that verifies signatures with secret (nil: no verification)
// and succeeds.
func NewReceiver(secret SigningSecret) (*Receiver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Receiver{URL: "http://" + l.Addr().String() + "/webhooks", secret: secret,
		accepted: map[string]int{}, bodies: map[string][]byte{}}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(l) }()
	return r, nil
}

// NewFailingReceiver starts a receiver that fails on purpose: it answers every request with
// 503 Service Unavailable (without Retry-After), so deliveries to it retry and dead-letter.
func NewFailingReceiver() (*Receiver, error) {
	r, err := NewReceiver(nil)
	if err != nil {
		return nil, err
	}
	r.SetFailing(true)
	return r, nil
}

// SetFailing makes the receiver answer 503 (true) or succeed (false).
func (r *Receiver) SetFailing(f bool) { r.failing.Store(f) }

// ServeHTTP handles one delivery.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 16<<20))
	r.mu.Lock()
	r.stats.Requests++
	r.mu.Unlock()
	if err != nil {
		http.Error(w, "reading the body", http.StatusBadRequest)
		return
	}
	if r.secret != nil {
		if err := r.verify(req.Context(), body, req.Header); err != nil {
			r.mu.Lock()
			r.stats.BadSignatures++
			r.mu.Unlock()
			http.Error(w, "signature: "+err.Error(), http.StatusUnauthorized)
			return
		}
	}
	if r.failing.Load() {
		r.mu.Lock()
		r.stats.Refused++
		r.mu.Unlock()
		http.Error(w, "failing on purpose", http.StatusServiceUnavailable)
		return
	}
	id := req.Header.Get("webhook-id")
	r.mu.Lock()
	r.stats.Accepted++
	if r.accepted[id] == 0 {
		r.order = append(r.order, id)
		r.bodies[id] = body
		r.stats.Unique++
	}
	r.accepted[id]++
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"received":true}`)
}

// verify checks the signature with the known secrets, reading them again once when none
// matches (the endpoint's secret may have been created or rotated since).
func (r *Receiver) verify(ctx context.Context, body []byte, h http.Header) error {
	if h.Get("webhook-id") == "" {
		return errors.New("no webhook-id header")
	}
	r.mu.Lock()
	keys := r.keys
	r.mu.Unlock()
	for _, k := range keys {
		if k.Verify(body, h) == nil {
			return nil
		}
	}
	secrets, err := r.secret(ctx)
	if err != nil {
		return fmt.Errorf("reading the signing secret: %w", err)
	}
	keys = keys[:0:0]
	for _, s := range secrets {
		k, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			return fmt.Errorf("the signing secret is not a Standard Webhooks secret: %w", err)
		}
		keys = append(keys, k)
	}
	r.mu.Lock()
	r.keys = keys
	r.mu.Unlock()
	var last error = errors.New("no signing secret")
	for _, k := range keys {
		if last = k.Verify(body, h); last == nil {
			return nil
		}
	}
	return last
}

// Stats returns the counts so far.
func (r *Receiver) Stats() ReceiverStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Received lists the webhook-ids accepted, each once, in the order they first arrived.
func (r *Receiver) Received() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.order...)
}

// Count is how many times the event id was accepted (more than 1: redelivered).
func (r *Receiver) Count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted[id]
}

// Body is the body first accepted for the event id.
func (r *Receiver) Body(id string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodies[id]
}

// Close stops the receiver.
func (r *Receiver) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.srv.Shutdown(ctx)
}
