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

func (h healthCounts) equal() bool { return h.within(0) }

// within says the status counts are the durable record's, or at most over more.
func (h healthCounts) within(over int64) bool {
	return h.StatusDelivered >= h.Received && h.StatusDelivered <= h.Received+over &&
		h.StatusDeadLettered >= h.DeadLettered && h.StatusDeadLettered <= h.DeadLettered+over
}

// checkHealthCounts waits until the endpoint's status counts equal the receiver's distinct
// receipts and the endpoint's dead letters, after every fault of a scenario: the counts are a
// fold of the durable delivery log, so no crash may falsify them.
func checkHealthCounts(t *testing.T, tn *tenant, endpoint string, rcv *testenv.Receiver, timeout time.Duration) healthCounts {
	t.Helper()
	return checkHealthCountsWithin(t, tn, endpoint, rcv, timeout, 0)
}

// checkHealthCountsWithin is checkHealthCounts allowing the status to count up to over more
// deliveries or dead letters than the record holds (never fewer); it reports any excess.
func checkHealthCountsWithin(t *testing.T, tn *tenant, endpoint string, rcv *testenv.Receiver, timeout time.Duration, over int64) healthCounts {
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
		if !h.within(over) {
			return fmt.Errorf("%s: status delivered %d, dead-lettered %d; receiver %d distinct, %d dead letters",
				endpoint, h.StatusDelivered, h.StatusDeadLettered, h.Received, h.DeadLettered)
		}
		return nil
	})
	t.Logf("health counts of %s: status delivered %d / receiver %d distinct; status dead-lettered %d / %d dead letters",
		endpoint, h.StatusDelivered, h.Received, h.StatusDeadLettered, h.DeadLettered)
	if err != nil {
		t.Errorf("status counts differ from the durable record after the faults: %v", err)
	} else if !h.equal() {
		t.Logf("status counts exceed the durable record by %d delivered, %d dead-lettered (allowed here: %d)",
			h.StatusDelivered-h.Received, h.StatusDeadLettered-h.DeadLettered, over)
	}
	return h
}
