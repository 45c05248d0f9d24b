package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/webhook-operator/webhook-operator/internal/plugin/jsread"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Limits of a page (seed 002: 1 to 100, default 25).
const (
	DefaultLimit = 25
	MaxLimit     = 100
)

// LogEntry is one row of the delivery log: a delivery and its current state, or, with
// --attempts, one attempt.
type LogEntry struct {
	// ID is the delivery id (whdl_...).
	ID string `json:"id"`
	// Status: pending, attempting, succeeded, failed or dead_letter.
	Status    string `json:"status"`
	EventID   string `json:"eventId,omitempty"`
	EventType string `json:"eventType,omitempty"`
	// Attempts already completed (0 to the policy's maximum).
	Attempts int `json:"attempts"`
	// Attempt is the attempt's number, in the attempts view.
	Attempt int `json:"attempt,omitempty"`
	// Time the delivery reached this status (when it was stored in its stream).
	Time          time.Time  `json:"time"`
	CreatedAt     *time.Time `json:"createdAt,omitempty"`
	LastAttemptAt *time.Time `json:"lastAttemptAt,omitempty"`
	NextAttemptAt *time.Time `json:"nextAttemptAt,omitempty"`
	// LastResponse of the last attempt: status code, body (2 KB) or error.
	LastResponse *records.Response `json:"lastResponse,omitempty"`
	LatencyMS    *int64            `json:"latencyMs,omitempty"`
	// LatencyUS is the same in microseconds; absent for records written before it existed.
	LatencyUS *int64 `json:"latencyUs,omitempty"`
	// Test is true for a one-shot test delivery (kubectl webhooks test).
	Test bool `json:"test,omitempty"`
	// Reason of the last failure (status_code, timeout, ...).
	Reason           string `json:"reason,omitempty"`
	DeadLetterReason string `json:"deadLetterReason,omitempty"`
	ReplayOfID       string `json:"replayOfId,omitempty"`
	// RequestHeaders as sent (attempts view), secrets redacted by the dispatcher.
	RequestHeaders map[string]string `json:"requestHeaders,omitempty"`
	// Cursor continues the log after this entry (--after).
	Cursor string `json:"cursor"`
}

type logOptions struct {
	status   string
	limit    int
	after    string
	attempts bool
}

func newLogCommand(o *Options) *cobra.Command {
	lo := &logOptions{}
	cmd := &cobra.Command{
		Use:   "log <endpoint>",
		Short: "Show an endpoint's delivery log, newest first",
		Long: `Show an endpoint's deliveries, newest first, each with its current status:
  pending      waiting in the deliveries stream
  attempting   handed to a dispatcher, in flight
  failed       an attempt failed; the next one is scheduled (NEXT ATTEMPT)
  succeeded    delivered
  dead_letter  given up; see ` + "`kubectl webhooks dlq show <id>`" + `
Finished deliveries come from the delivery log (kept 30 days); live ones from the
deliveries stream. --attempts lists every attempt instead (status after that attempt).
Pages hold --limit entries (1-100, default 25); continue with --after <cursor>.`,
		Example: `  kubectl webhooks log orders
  kubectl webhooks log orders --status failed --limit 100
  kubectl webhooks log orders --after c1.1234.56.78 -o json
  kubectl webhooks log orders --attempts`,
		Args: cobra.ExactArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error { return lo.run(ctx, o, args[0]) }),
	}
	f := cmd.Flags()
	f.StringVar(&lo.status, "status", "", "only deliveries in this status: pending, attempting, succeeded, failed or dead_letter")
	f.IntVar(&lo.limit, "limit", DefaultLimit, "entries per page, 1 to 100")
	f.StringVar(&lo.after, "after", "", "continue after this cursor (printed at the end of a page, or an entry's cursor)")
	f.BoolVar(&lo.attempts, "attempts", false, "list every attempt from the delivery log instead of one entry per delivery")
	return cmd
}

// logCursor holds where each source of the log stands: the exclusive upper sequence bound of
// the attempts stream, the deliveries and the scheduled retries (0: from the newest).
type logCursor struct{ a, d, r uint64 }

func (c logCursor) String() string { return fmt.Sprintf("c1.%d.%d.%d", c.a, c.d, c.r) }

func parseLogCursor(s string) (logCursor, error) {
	var c logCursor
	if s == "" {
		return c, nil
	}
	parts := strings.Split(s, ".")
	if len(parts) != 4 || parts[0] != "c1" {
		return c, usagef("--after %q is not a cursor of this log (they look like c1.1234.56.78)", s)
	}
	var err error
	var v [3]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(parts[i+1], 10, 64); err != nil {
			return c, usagef("--after %q is not a cursor of this log (they look like c1.1234.56.78)", s)
		}
	}
	return logCursor{v[0], v[1], v[2]}, nil
}

// logSource is one ordered source of log entries: a backward reader and what it keeps.
type logSource struct {
	rd   *jsread.Backward
	keep func(ctx context.Context, m *jsread.Msg) (LogEntry, bool, error)
	head *LogEntry
	seq  uint64
}

// peek finds the source's next kept entry.
func (s *logSource) peek(ctx context.Context) (*LogEntry, error) {
	for s.head == nil {
		m, err := s.rd.Next(ctx)
		if err != nil || m == nil {
			return nil, err
		}
		e, ok, err := s.keep(ctx, m)
		if err != nil {
			return nil, err
		}
		if ok {
			s.head, s.seq = &e, m.Seq
		}
	}
	return s.head, nil
}

// bound is where a continuation of this source starts: below the entry not yet shown.
func (s *logSource) bound() uint64 {
	if s.head != nil {
		return s.seq + 1
	}
	return s.rd.Bound()
}

func (lo *logOptions) run(ctx context.Context, o *Options, name string) error {
	if lo.limit < 1 || lo.limit > MaxLimit {
		return usagef("--limit must be between 1 and %d, not %d", MaxLimit, lo.limit)
	}
	switch lo.status {
	case "", records.StatePending, records.StateAttempting, records.StateSucceeded, records.StateFailed, records.StateDeadLetter:
	default:
		return usagef("--status must be one of pending, attempting, succeeded, failed, dead_letter; not %q", lo.status)
	}
	if lo.attempts && (lo.status == records.StatePending || lo.status == records.StateAttempting) {
		return usagef("--attempts lists attempts already made: %s deliveries have none yet; drop --attempts", lo.status)
	}
	cur, err := parseLogCursor(lo.after)
	if err != nil {
		return err
	}
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	_, epErr := o.GetEndpoint(ctx, ns, name)
	if epErr != nil && ExitCode(epErr) != ExitNotFound {
		return epErr
	}
	page, err := readLog(ctx, o, ns, name, lo, cur)
	if err != nil {
		return err
	}
	if epErr != nil {
		if len(page.Data) == 0 && lo.after == "" {
			return epErr
		}
		writeLine(o.IO.ErrOut, "warning: %v; showing what the streams still hold", epErr)
	}
	if len(page.Data) == 0 && o.Output == OutputTable {
		what := "deliveries"
		if lo.status != "" {
			what = lo.status + " deliveries"
		}
		if lo.attempts {
			what = strings.Replace(what, "deliveries", "attempts", 1)
		}
		suffix := ""
		if lo.after != "" {
			suffix = " after this cursor"
		}
		writeLine(o.IO.ErrOut, "No %s in the log of %s/%s%s.", what, ns, name, suffix)
		return nil
	}
	return o.print(page, func(w io.Writer) {
		if lo.attempts {
			row(w, "ID", "ATTEMPT", "STATUS", "EVENT", "RESPONSE", "LATENCY", "TIME", "NEXT ATTEMPT")
		} else {
			row(w, "ID", "STATUS", "ATTEMPTS", "EVENT", "LAST RESPONSE", "LATENCY", "TIME", "NEXT ATTEMPT")
		}
		for _, e := range page.Data {
			lat := "-"
			if e.LatencyMS != nil {
				lat = latency(*e.LatencyMS, deref(e.LatencyUS))
			}
			if lo.attempts {
				row(w, e.ID, strconv.Itoa(e.Attempt), e.Status, orDash(e.EventType), responseCell(e), lat, ts(e.Time), tsp(e.NextAttemptAt))
			} else {
				row(w, e.ID, e.Status, strconv.Itoa(e.Attempts), orDash(e.EventType), responseCell(e), lat, ts(e.Time), tsp(e.NextAttemptAt))
			}
		}
		if page.HasMore {
			writeLine(w, "")
			writeLine(w, "More entries: kubectl webhooks log %s --after %s", name, page.NextCursor)
		}
	})
}

func responseCell(e LogEntry) string {
	r := e.LastResponse
	if r == nil {
		return "-"
	}
	switch {
	case r.StatusCode != 0 && e.Reason != "" && e.Reason != records.FailStatusCode:
		return fmt.Sprintf("%d %s", r.StatusCode, e.Reason)
	case r.StatusCode != 0:
		return strconv.Itoa(r.StatusCode)
	case r.Error != "":
		return short(r.Error, 40)
	case e.Reason != "":
		return e.Reason
	}
	return "-"
}

// maxRecentScan bounds how many recent delivery-log records are read to describe in-flight
// deliveries.
const maxRecentScan = 2000

// recentAttempts finds the newest delivery-log record of in-flight deliveries. A delivery
// retried in place (short waits, and every retry of a PerKey endpoint) stays in flight on its
// delivery subject while its failed attempt is already logged: without its record it would
// look like a first attempt in progress.
type recentAttempts struct {
	open    func(ctx context.Context) (*jsread.Backward, error)
	rd      *jsread.Backward
	newest  map[string]records.LogRecord
	reached time.Time
	scanned int
	done    bool
}

// latest returns the newest record of delivery id stored after since, if one is found within
// the scan bound.
func (r *recentAttempts) latest(ctx context.Context, id string, since time.Time) (*records.LogRecord, error) {
	if r.rd == nil && !r.done {
		rd, err := r.open(ctx)
		if err != nil {
			return nil, err
		}
		r.rd, r.newest = rd, map[string]records.LogRecord{}
	}
	for {
		if rec, ok := r.newest[id]; ok {
			return &rec, nil
		}
		if r.done || r.scanned >= maxRecentScan || (!r.reached.IsZero() && r.reached.Before(since)) {
			return nil, nil
		}
		m, err := r.rd.Next(ctx)
		if err != nil {
			return nil, err
		}
		if m == nil {
			r.done = true
			continue
		}
		r.scanned++
		r.reached = m.Time
		var rec records.LogRecord
		if json.Unmarshal(m.Data, &rec) != nil {
			continue
		}
		if _, ok := r.newest[rec.DeliveryID]; !ok {
			r.newest[rec.DeliveryID] = rec
		}
	}
}

// readLog reads one page of an endpoint's log. Its sources (finished deliveries from the
// delivery log, live ones and scheduled retries from the deliveries stream) are read
// backwards from the cursor and merged newest first by the time their messages were stored.
func readLog(ctx context.Context, o *Options, ns, name string, lo *logOptions, cur logCursor) (Page[LogEntry], error) {
	page := Page[LogEntry]{Data: []LogEntry{}}
	nc, js, err := o.JetStream(ctx)
	if err != nil {
		return page, err
	}
	names := o.Set(ns)
	want := lo.limit + 1
	now := o.Now()
	status := lo.status
	useA := lo.attempts || status == "" || status == records.StateSucceeded || status == records.StateDeadLetter
	useD := !lo.attempts && (status == "" || status == records.StatePending || status == records.StateAttempting || status == records.StateFailed)
	useR := !lo.attempts && (status == "" || status == records.StateFailed)

	var attempts *jsread.Stream
	openAttempts := func(ctx context.Context) (*jsread.Stream, error) {
		if attempts != nil {
			return attempts, nil
		}
		st, err := jsread.Open(ctx, nc, js, names.AttemptsStream())
		if err != nil {
			return nil, o.streamError(err, "the delivery log stream "+names.AttemptsStream())
		}
		attempts = st
		return st, nil
	}
	unreadable := 0
	var srcA, srcD, srcR *logSource
	if useA {
		st, err := openAttempts(ctx)
		if err != nil {
			return page, err
		}
		srcA = &logSource{rd: st.Backward(names.AttemptSubject(name), cur.a, want), keep: func(_ context.Context, m *jsread.Msg) (LogEntry, bool, error) {
			var rec records.LogRecord
			if err := json.Unmarshal(m.Data, &rec); err != nil {
				unreadable++
				return LogEntry{}, false, nil
			}
			if status != "" && rec.State != status {
				return LogEntry{}, false, nil
			}
			if !lo.attempts && rec.State != records.StateSucceeded && rec.State != records.StateDeadLetter {
				// An intermediate attempt: the delivery's current state is newer.
				return LogEntry{}, false, nil
			}
			return entryOfRecord(rec, m, lo.attempts), true, nil
		}}
	}
	if useD || useR {
		st, err := jsread.Open(ctx, nc, js, names.DeliveriesStream())
		if err != nil {
			return page, o.streamError(err, "the deliveries stream "+names.DeliveriesStream())
		}
		if useD {
			var delivered, ackFloor uint64
			cons, err := js.Consumer(ctx, names.DeliveriesStream(), names.EndpointConsumer(name))
			switch {
			case err == nil:
				info := cons.CachedInfo()
				delivered, ackFloor = info.Delivered.Stream, info.AckFloor.Stream
			case !streams.IsNotFound(err):
				return page, fmt.Errorf("reading the consumer of %s/%s: %w", ns, name, err)
			}
			recent := &recentAttempts{open: func(ctx context.Context) (*jsread.Backward, error) {
				st, err := openAttempts(ctx)
				if err != nil {
					return nil, err
				}
				return st.Backward(names.AttemptSubject(name), 0, 64), nil
			}}
			srcD = &logSource{rd: st.Backward(names.DeliverySubject(name), cur.d, want), keep: func(ctx context.Context, m *jsread.Msg) (LogEntry, bool, error) {
				state := records.StatePending
				if m.Seq <= delivered && m.Seq > ackFloor {
					state = records.StateAttempting
				}
				if state == records.StatePending && status != "" && status != state {
					return LogEntry{}, false, nil
				}
				e := entryOfDelivery(m, state)
				if state == records.StateAttempting {
					rec, err := recent.latest(ctx, e.ID, m.Time)
					if err != nil {
						return e, false, err
					}
					inFlight(&e, rec, now)
				}
				return e, status == "" || e.Status == status, nil
			}}
		}
		if useR {
			srcR = &logSource{rd: st.Backward(names.RetryFilter(name), cur.r, want), keep: func(_ context.Context, m *jsread.Msg) (LogEntry, bool, error) {
				return entryOfDelivery(m, records.StateFailed), true, nil
			}}
		}
	}
	cursorNow := func() logCursor {
		c := cur
		if srcA != nil {
			c.a = srcA.bound()
		}
		if srcD != nil {
			c.d = srcD.bound()
		}
		if srcR != nil {
			c.r = srcR.bound()
		}
		return c
	}
	sources := []*logSource{srcD, srcR, srcA}
	for {
		var best *logSource
		for _, s := range sources {
			if s == nil {
				continue
			}
			e, err := s.peek(ctx)
			if err != nil {
				return page, err
			}
			if e != nil && (best == nil || e.Time.After(best.head.Time)) {
				best = s
			}
		}
		if best == nil {
			break
		}
		if len(page.Data) == lo.limit {
			page.HasMore = true
			page.NextCursor = page.Data[len(page.Data)-1].Cursor
			break
		}
		e := *best.head
		best.head = nil
		e.Cursor = cursorNow().String()
		page.Data = append(page.Data, e)
	}
	if unreadable > 0 {
		writeLine(o.IO.ErrOut, "warning: skipped %d unreadable delivery-log records", unreadable)
	}
	return page, nil
}

// inFlight completes an in-flight delivery's entry with its newest logged attempt: a failed
// attempt whose retry is still ahead makes the delivery failed (retried in place), otherwise
// it is attempting, with the attempts made so far.
func inFlight(e *LogEntry, rec *records.LogRecord, now time.Time) {
	if rec == nil || rec.Attempt < e.Attempts {
		return
	}
	e.Attempts = rec.Attempt
	t := rec.Time.UTC()
	e.LastAttemptAt = &t
	e.setLatency(rec.LatencyMS, rec.LatencyUS)
	resp := rec.Response
	e.LastResponse = &resp
	e.Reason = rec.Reason
	if rec.State == records.StateFailed && rec.NextAttemptAt != nil && rec.NextAttemptAt.After(now) {
		e.Status = records.StateFailed
		next := rec.NextAttemptAt.UTC()
		e.NextAttemptAt = &next
	}
}

// setLatency sets the entry's latency: whole milliseconds, and microseconds when the record
// has them.
func (e *LogEntry) setLatency(ms, us int64) {
	e.LatencyMS = &ms
	e.LatencyUS = nil
	if us > 0 {
		e.LatencyUS = &us
	}
}

// entryOfRecord is a delivery-log record as an entry.
func entryOfRecord(rec records.LogRecord, m *jsread.Msg, attemptsView bool) LogEntry {
	e := LogEntry{
		ID:               rec.DeliveryID,
		Status:           rec.State,
		EventID:          rec.EventID,
		EventType:        rec.EventType,
		Attempts:         rec.Attempt,
		Time:             m.Time.UTC(),
		NextAttemptAt:    rec.NextAttemptAt,
		Reason:           rec.Reason,
		DeadLetterReason: rec.DeadLetterReason,
		ReplayOfID:       rec.ReplayOf,
		Test:             rec.Test,
	}
	if attemptsView {
		e.Attempt = rec.Attempt
		e.RequestHeaders = rec.RequestHeaders
	}
	if !rec.Time.IsZero() {
		t := rec.Time.UTC()
		e.LastAttemptAt = &t
	}
	if rec.Attempt > 0 {
		e.setLatency(rec.LatencyMS, rec.LatencyUS)
	}
	if rec.Response != (records.Response{}) {
		resp := rec.Response
		e.LastResponse = &resp
	}
	return e
}

// entryOfDelivery is a message of the deliveries stream (a delivery or a scheduled retry) as
// an entry in state.
func entryOfDelivery(m *jsread.Msg, state string) LogEntry {
	meta := records.ParseDeliveryMeta(m.Header)
	e := LogEntry{
		ID:         meta.DeliveryID,
		Status:     state,
		EventID:    meta.EventID,
		EventType:  meta.EventType,
		Attempts:   meta.Attempts,
		Time:       m.Time.UTC(),
		ReplayOfID: meta.ReplayOf,
		Test:       meta.Test,
	}
	if !meta.Created.IsZero() {
		t := meta.Created.UTC()
		e.CreatedAt = &t
	}
	if n := len(meta.History); n > 0 {
		last := meta.History[n-1]
		t := last.Time.UTC()
		e.LastAttemptAt = &t
		e.setLatency(last.LatencyMS, last.LatencyUS)
		e.Reason = last.Reason
		e.LastResponse = &records.Response{StatusCode: last.StatusCode, Error: last.Error}
		if e.Attempts < n {
			e.Attempts = n
		}
	}
	if at, ok := scheduledAt(m.Header.Get("Nats-Schedule")); ok {
		e.NextAttemptAt = &at
	}
	return e
}

// scheduledAt reads a one-shot message schedule ("@at <RFC 3339 time>").
func scheduledAt(v string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(v), "@at ")
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(rest))
	if err != nil {
		return time.Time{}, false
	}
	return t.UTC(), true
}
