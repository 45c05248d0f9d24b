package faults

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
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
	if err != nil || f.Duplicates > 0 {
		logDuplicates(t, tn, endpoint, rcv, 5)
	}
	return h
}

// logDuplicates logs, for up to n events the receiver accepted more than once, what the
// delivery log holds of them: each record with its log message's sequence, message id and
// size (a batch holds several records), so a duplicate's cause can be read.
func logDuplicates(t *testing.T, tn *tenant, endpoint string, rcv *testenv.Receiver, n int) {
	t.Helper()
	dups := map[string]int{}
	for id, r := range rcv.Receipts() {
		if r.Count > 1 && len(dups) < n {
			dups[id] = r.Count
		}
	}
	if len(dups) == 0 {
		return
	}
	ctx := t.Context()
	nc, js, err := tn.st.ConnectAdmin(nats.Timeout(5*time.Second), nats.MaxReconnects(0))
	if err != nil {
		t.Logf("reading the delivery log: %v", err)
		return
	}
	defer nc.Close()
	names := streams.DefaultNames().For(tn.ns)
	st, err := streamread.Open(ctx, nc, js, names.AttemptsStream())
	if err != nil {
		t.Logf("reading the delivery log: %v", err)
		return
	}
	lines := map[string][]string{}
	read, recs := 0, 0
	for from := st.FirstSeq; ; {
		batch, err := st.Forward(ctx, names.AttemptsSubjects()[0], from, 256)
		if err != nil {
			t.Logf("reading the delivery log: %v", err)
			return
		}
		for _, m := range batch {
			read++
			rs := records.LogRecords(m.Data)
			recs += len(rs)
			for _, r := range rs {
				if _, ok := dups[r.EventID]; ok && r.Endpoint == endpoint {
					lines[r.EventID] = append(lines[r.EventID], fmt.Sprintf("seq %d (%d records, id %s, stored %s): %s attempt %d at %s",
						m.Seq, len(rs), m.Header.Get(records.HeaderMsgID), m.Time.Format("15:04:05.000"), r.State, r.Attempt, r.Time.Format("15:04:05.000")))
				}
			}
		}
		if len(batch) == 0 || batch[len(batch)-1].Seq >= st.LastSeq {
			break
		}
		from = batch[len(batch)-1].Seq + 1
	}
	t.Logf("the delivery log of %s: %d messages, %d records read (sequences %d..%d)", tn.ns, read, recs, st.FirstSeq, st.LastSeq)
	for id, count := range dups {
		t.Logf("accepted %d times: %s; its log:\n  %s", count, id, strings.Join(lines[id], "\n  "))
	}
}
