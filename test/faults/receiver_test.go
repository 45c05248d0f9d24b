package faults

import (
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// newReceiver starts the tests' webhook receiver (testenv.Receiver: it verifies every
// request's Standard Webhooks signature with secret, whsec_..., and records when it first
// accepted each webhook-id and how often). It misbehaves on purpose once given a
// testenv.Misbehave responder; a hung or failed request does not count as received.
func newReceiver(secret string) (*testenv.Receiver, error) {
	rcv, err := testenv.NewReceiver(testenv.ReceiverOptions{Respond: testenv.Misbehave(testenv.Behaviour{}), Path: "/hooks"})
	if err != nil {
		return nil, err
	}
	rcv.Trust(secret)
	return rcv, nil
}
