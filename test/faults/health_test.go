package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// healthCounts are an endpoint's status counts next to what the receiver and the dead-letter
// stream say, once they agree or a bound passed.
type healthCounts struct {
	Endpoint string
	// StatusDelivered and StatusDeadLettered are status.health.delivered and .deadLettered.
	StatusDelivered, StatusDeadLettered int64
	// Received is how many distinct events the receiver accepted; DeadLettered how many dead
	// letters the endpoint has.
	Received, DeadLettered int64
}

func (h healthCounts) equal() bool {
	return h.StatusDelivered == h.Received && h.StatusDeadLettered == h.DeadLettered
}

// checkHealthCounts waits until the endpoint's status counts equal the receiver's distinct
// receipts and the endpoint's dead letters, exactly, after every fault of a scenario: the
// counts are a fold of the durable delivery log, so no crash may falsify them. It logs the
// scenario's sent / received / duplicates / counted figures.
func checkHealthCounts(t *testing.T, tn *tenant, endpoint string, rcv *testenv.Receiver, f figures, timeout time.Duration) healthCounts {
	t.Helper()
	var h healthCounts
	err := testenv.Poll(timeout, func() error {
		h = healthCounts{Endpoint: endpoint, Received: int64(rcv.Stats().Unique)}
		dls, err := readDeadLetters(t.Context(), tn)
		if err != nil {
			return err
		}
		for _, dl := range dls {
			if dl.Endpoint == endpoint {
				h.DeadLettered++
			}
		}
		ep, err := tn.endpoint(endpoint)
		if err != nil {
			return err
		}
		if hl := ep.Status.Health; hl != nil {
			h.StatusDelivered, h.StatusDeadLettered = hl.Delivered, hl.DeadLettered
		}
		if !h.equal() {
			return fmt.Errorf("%s: status delivered %d, dead-lettered %d; receiver %d distinct, %d dead letters",
				endpoint, h.StatusDelivered, h.StatusDeadLettered, h.Received, h.DeadLettered)
		}
		return nil
	})
	t.Logf("%s, endpoint %s: sent %d, received %d distinct, %d duplicates at the receiver, counted delivered %d; dead letters %d, counted dead-lettered %d",
		f.Scenario, endpoint, f.Events, h.Received, f.Duplicates, h.StatusDelivered, h.DeadLettered, h.StatusDeadLettered)
	if err != nil {
		t.Errorf("status counts differ from the durable record after the faults: %v", err)
	}
	return h
}
