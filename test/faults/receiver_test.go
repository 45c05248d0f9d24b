package faults

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// behaviour is how a receiver answers. The zero value accepts everything at once.
type behaviour struct {
	// FailRatio of requests are answered 503 (without Retry-After).
	FailRatio float64
	// MaxLatency: every request waits a random time up to it before the answer.
	MaxLatency time.Duration
	// HangRatio of requests hang for Hang (past the endpoint's timeout) and are then failed.
	HangRatio float64
	Hang      time.Duration
	// Down answers every request 503.
	Down bool
}

// receiver is a webhook receiver on loopback that misbehaves on purpose. It verifies every
// request's Standard Webhooks signature and records each webhook-id it accepted: when it
// first did (for the delay from publish) and how often (duplicates). A hung or failed request
// does not count as received.
type receiver struct {
	URL string

	srv *http.Server
	wh  *standardwebhooks.Webhook
	beh atomic.Pointer[behaviour]

	requests, refused, hung, badSignatures atomic.Int64

	mu    sync.Mutex
	first map[string]time.Time
	count map[string]int
}

// newReceiver starts a receiver verifying with the Standard Webhooks secret (whsec_...).
func newReceiver(secret string) (*receiver, error) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{URL: "http://" + l.Addr().String() + "/hooks", wh: wh, first: map[string]time.Time{}, count: map[string]int{}}
	r.beh.Store(&behaviour{})
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = r.srv.Serve(l) }()
	return r, nil
}

// set changes how the receiver answers from now on.
func (r *receiver) set(b behaviour) { r.beh.Store(&b) }

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.requests.Add(1)
	b := r.beh.Load()
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	if err != nil {
		http.Error(w, "reading the body", http.StatusBadRequest)
		return
	}
	if err := r.wh.Verify(body, req.Header); err != nil {
		r.badSignatures.Add(1)
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	if b.HangRatio > 0 && rand.Float64() < b.HangRatio {
		r.hung.Add(1)
		select {
		case <-req.Context().Done():
		case <-time.After(b.Hang):
		}
		http.Error(w, "hung on purpose", http.StatusServiceUnavailable)
		return
	}
	if b.MaxLatency > 0 {
		t := time.NewTimer(rand.N(b.MaxLatency))
		select {
		case <-req.Context().Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	if b.Down || (b.FailRatio > 0 && rand.Float64() < b.FailRatio) {
		r.refused.Add(1)
		http.Error(w, "failing on purpose", http.StatusServiceUnavailable)
		return
	}
	id := req.Header.Get("webhook-id")
	now := time.Now()
	r.mu.Lock()
	if r.count[id] == 0 {
		r.first[id] = now
	}
	r.count[id]++
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// receipt is what the receiver knows of one event id.
type receipt struct {
	first time.Time
	count int
}

// receipts copies what was received so far.
func (r *receiver) receipts() map[string]receipt {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]receipt, len(r.count))
	for id, n := range r.count {
		out[id] = receipt{first: r.first[id], count: n}
	}
	return out
}

// unique is how many distinct event ids were received.
func (r *receiver) unique() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.count)
}

func (r *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}
