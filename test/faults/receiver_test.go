package faults

import (
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
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

// receiver is the tests' webhook receiver (testenv.Receiver: it verifies every request's
// Standard Webhooks signature and records when it first accepted each webhook-id and how
// often) misbehaving on purpose as its behaviour says. A hung or failed request does not
// count as received.
type receiver struct {
	*testenv.Receiver
	beh  atomic.Pointer[behaviour]
	hung atomic.Int64
}

// newReceiver starts a receiver verifying with the Standard Webhooks secret (whsec_...).
func newReceiver(secret string) (*receiver, error) {
	r := &receiver{}
	r.beh.Store(&behaviour{})
	rcv, err := testenv.NewReceiver(testenv.ReceiverOptions{Respond: r.respond, Path: "/hooks"})
	if err != nil {
		return nil, err
	}
	rcv.Trust(secret)
	r.Receiver = rcv
	return r, nil
}

// set changes how the receiver answers from now on.
func (r *receiver) set(b behaviour) { r.beh.Store(&b) }

func (r *receiver) respond(testenv.Request) testenv.Response {
	b := r.beh.Load()
	if b.HangRatio > 0 && rand.Float64() < b.HangRatio {
		r.hung.Add(1)
		return testenv.Response{Status: http.StatusServiceUnavailable, Body: "hung on purpose", Delay: b.Hang}
	}
	var latency time.Duration
	if b.MaxLatency > 0 {
		latency = rand.N(b.MaxLatency)
	}
	if b.Down || (b.FailRatio > 0 && rand.Float64() < b.FailRatio) {
		return testenv.Response{Status: http.StatusServiceUnavailable, Body: "failing on purpose", Delay: latency}
	}
	return testenv.Response{Status: http.StatusNoContent, Delay: latency}
}

// unique is how many distinct event ids were received.
func (r *receiver) unique() int { return r.Stats().Unique }

// receipts copies what was received so far.
func (r *receiver) receipts() map[string]testenv.Receipt { return r.Receipts() }

func (r *receiver) close() { _ = r.Close() }
