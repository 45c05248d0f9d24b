package faults

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
	"github.com/webhook-operator/webhook-operator/internal/testenv"
)

// figures are the outcome of one scenario's accounting check.
type figures struct {
	Scenario string
	// Events published (acknowledged by JetStream).
	Events int
	// Received: events the receiver accepted at least once.
	Received int
	// DeadLettered: events not received that are in the dead-letter stream with a reason.
	DeadLettered int
	// Missing: neither; must be 0.
	Missing int
	// Duplicates: accepted requests beyond the first per event id.
	Duplicates int
	// Reasons counts every dead letter of the scenario's events by reason (received or not).
	Reasons map[string]int
	// LongestDelay from publish to first receipt.
	LongestDelay time.Duration
	// RunTime of the scenario, from the first publish to the end of the check.
	RunTime time.Duration
	// Faults says what was done to the system.
	Faults string
	// MissingIDs are some of the missing events, for the failure message.
	MissingIDs []string
	// Samples describe a few dead letters: event, reason and every attempt.
	Samples []string
}

// deadLetters reads every dead letter of the tenant's namespace: event id to the reasons it
// was dead-lettered with (one per delivery).
func deadLetters(ctx context.Context, tn *tenant) (map[string][]string, error) {
	dls, err := readDeadLetters(ctx, tn)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, dl := range dls {
		out[dl.EventID] = append(out[dl.EventID], dl.Reason)
	}
	return out, nil
}

// readDeadLetters reads every dead letter of the tenant's namespace, oldest first.
func readDeadLetters(ctx context.Context, tn *tenant) ([]records.DeadLetter, error) {
	nc, js, err := tn.st.ConnectAdmin(nats.Timeout(5*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	names := streams.DefaultNames().For(tn.ns)
	st, err := streamread.Open(ctx, nc, js, names.DeadLetterStream())
	if err != nil {
		return nil, err
	}
	filter := names.DeadLetterFilter("")
	var out []records.DeadLetter
	from := st.FirstSeq
	for {
		batch, err := st.Forward(ctx, filter, from, 256)
		if err != nil {
			return nil, err
		}
		for _, m := range batch {
			dl, err := records.ParseDeadLetter(m.Header)
			if err != nil {
				return nil, fmt.Errorf("dead letter at sequence %d: %w", m.Seq, err)
			}
			out = append(out, dl)
		}
		if len(batch) == 0 || batch[len(batch)-1].Seq >= st.LastSeq {
			return out, nil
		}
		from = batch[len(batch)-1].Seq + 1
	}
}

// account compares what was published with what the receiver got and what was dead-lettered
// in the tenant's namespace.
func account(ctx context.Context, scenario string, tn *tenant, published map[string]time.Time, rcvs ...*testenv.Receiver) (figures, error) {
	f := figures{Scenario: scenario, Events: len(published), Reasons: map[string]int{}}
	all, err := readDeadLetters(ctx, tn)
	if err != nil {
		return f, err
	}
	dls := map[string][]string{}
	for _, dl := range all {
		dls[dl.EventID] = append(dls[dl.EventID], dl.Reason)
		if _, ok := published[dl.EventID]; ok && len(f.Samples) < 5 && dl.Reason == records.ReasonExhausted {
			f.Samples = append(f.Samples, describeDeadLetter(dl))
		}
	}
	got := map[string]testenv.Receipt{}
	for _, r := range rcvs {
		maps.Copy(got, r.Receipts())
	}
	for id, at := range published {
		if r, ok := got[id]; ok {
			f.Received++
			f.Duplicates += r.Count - 1
			if d := r.First.Sub(at); d > f.LongestDelay {
				f.LongestDelay = d
			}
		}
		for _, reason := range dls[id] {
			f.Reasons[reason]++
		}
		if _, ok := got[id]; ok {
			continue
		}
		if slices.ContainsFunc(dls[id], func(r string) bool { return r != "" }) {
			f.DeadLettered++
			continue
		}
		f.Missing++
		if len(f.MissingIDs) < 20 {
			f.MissingIDs = append(f.MissingIDs, id)
		}
	}
	sort.Strings(f.MissingIDs)
	return f, nil
}

// describeDeadLetter says what happened to a delivery: its reason and every attempt.
func describeDeadLetter(dl records.DeadLetter) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s, published %s):", dl.EventID, dl.Reason, dl.EventTime.Format("15:04:05.000"))
	for _, a := range dl.Attempts {
		fmt.Fprintf(&b, " #%d %s %d %s;", a.N, a.Time.Format("15:04:05.000"), a.StatusCode, a.Reason)
	}
	return b.String()
}

// settle runs the accounting check until nothing is missing, or until nothing has changed for
// quiet, or timeout passed, and returns the last figures.
func settle(ctx context.Context, scenario string, tn *tenant, published map[string]time.Time, quiet, timeout time.Duration, rcvs ...*testenv.Receiver) (figures, error) {
	deadline := time.Now().Add(timeout)
	lastChange, last := time.Now(), -1
	for {
		f, err := account(ctx, scenario, tn, published, rcvs...)
		if err != nil {
			return f, err
		}
		if f.Missing == 0 {
			return f, nil
		}
		if f.Missing != last {
			last, lastChange = f.Missing, time.Now()
		}
		if time.Since(lastChange) > quiet || time.Now().After(deadline) {
			return f, nil
		}
		select {
		case <-ctx.Done():
			return f, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// check records the figures and fails the test when an event is missing.
func check(t *testing.T, f figures) {
	t.Helper()
	results.add(f)
	t.Logf("%s: %d events, %d received, %d dead-lettered, %d missing, %d duplicates, longest delay %s, run time %s; dead letters by reason %v; faults: %s",
		f.Scenario, f.Events, f.Received, f.DeadLettered, f.Missing, f.Duplicates, f.LongestDelay.Round(time.Millisecond), f.RunTime.Round(time.Millisecond), f.Reasons, f.Faults)
	for _, d := range f.Samples {
		t.Logf("dead letter %s", d)
	}
	if f.Missing > 0 {
		t.Errorf("%s: %d of %d events are neither received nor dead-lettered, e.g. %v", f.Scenario, f.Missing, f.Events, f.MissingIDs)
	}
}

// resultTable collects every scenario's figures for the summary printed at the end.
type resultTable struct {
	mu   sync.Mutex
	rows []figures
}

func (r *resultTable) add(f figures) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rows = append(r.rows, f)
}

func (r *resultTable) print(w io.Writer, full bool, total time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.rows) == 0 {
		return
	}
	form := "reduced form (make test)"
	if full {
		form = "full form (make test-faults)"
	}
	fmt.Fprintf(w, "\nfault suite, %s, %s in all\n", form, total.Round(time.Second))
	fmt.Fprintf(w, "%-26s %7s %9s %8s %8s %6s %9s %9s  %s\n", "scenario", "events", "received", "dead-l.", "missing", "dups", "max delay", "run time", "dead letters by reason")
	for _, f := range r.rows {
		reasons := make([]string, 0, len(f.Reasons))
		for k, v := range f.Reasons {
			reasons = append(reasons, fmt.Sprintf("%s=%d", k, v))
		}
		sort.Strings(reasons)
		fmt.Fprintf(w, "%-26s %7d %9d %8d %8d %6d %9s %9s  %s\n", f.Scenario, f.Events, f.Received, f.DeadLettered, f.Missing, f.Duplicates,
			f.LongestDelay.Round(10*time.Millisecond), f.RunTime.Round(100*time.Millisecond), strings.Join(reasons, " "))
	}
	for _, f := range r.rows {
		fmt.Fprintf(w, "  %s: %s\n", f.Scenario, f.Faults)
	}
}
