package plugin

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/webhook-operator/webhook-operator/internal/match"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
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
	// patterns are the endpoint's event types (its pending events are on the events stream).
	patterns []string
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
  pending      waiting in the events stream or the deliveries stream
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
// the attempts stream (and how many entries of the message just below it were shown: a
// message of the delivery log may hold several records), the deliveries, the scheduled
// retries and the events stream (0: from the newest).
type logCursor struct {
	a       uint64
	aShown  int
	d, r, e uint64
}

func (c logCursor) String() string {
	return fmt.Sprintf("c3.%d.%d.%d.%d.%d", c.a, c.aShown, c.d, c.r, c.e)
}

func parseLogCursor(s string) (logCursor, error) {
	var c logCursor
	if s == "" {
		return c, nil
	}
	bad := usagef("--after %q is not a cursor of this log (they look like c3.1234.0.56.78.90)", s)
	parts := strings.Split(s, ".")
	n := map[string]int{"c1": 3, "c2": 4, "c3": 5}[parts[0]]
	if n == 0 || len(parts) != n+1 {
		return c, bad
	}
	v := make([]uint64, n)
	for i := range v {
		var err error
		if v[i], err = strconv.ParseUint(parts[i+1], 10, 64); err != nil {
			return c, bad
		}
	}
	switch parts[0] {
	case "c1": // before a message could hold several records, and before the events stream
		c.a, c.d, c.r = v[0], v[1], v[2]
	case "c2":
		c.a, c.aShown, c.d, c.r = v[0], int(min(v[1], 1<<16)), v[2], v[3]
	default:
		c.a, c.aShown, c.d, c.r, c.e = v[0], int(min(v[1], 1<<16)), v[2], v[3], v[4]
	}
	return c, nil
}

// logSource is one ordered source of log entries: a backward reader and what it keeps.
type logSource struct {
	rd *streamread.Backward
	// keep turns a message into its entries, newest first (kept entries only).
	keep func(ctx context.Context, m *streamread.Msg) ([]LogEntry, error)
	head *LogEntry
	// rest are the entries of the message being read after head; seq is its sequence and
	// taken how many of its entries were shown.
	rest  []LogEntry
	seq   uint64
	taken int
	// skipSeq and skip: the first message read (at skipSeq) had skip entries shown on an
	// earlier page.
	skipSeq uint64
	skip    int
	// floor ends the source at a message at or below it, or after maxScan messages (0: none).
	floor, maxScan, scanned uint64
	ended                   bool
}

// one makes a keep function of one that keeps at most one entry per message.
func one(f func(ctx context.Context, m *streamread.Msg) (LogEntry, bool, error)) func(context.Context, *streamread.Msg) ([]LogEntry, error) {
	return func(ctx context.Context, m *streamread.Msg) ([]LogEntry, error) {
		e, ok, err := f(ctx, m)
		if !ok || err != nil {
			return nil, err
		}
		return []LogEntry{e}, nil
	}
}

// peek finds the source's next kept entry.
func (s *logSource) peek(ctx context.Context) (*LogEntry, error) {
	for s.head == nil {
		if len(s.rest) > 0 {
			s.head, s.rest = &s.rest[0], s.rest[1:]
			break
		}
		if s.ended {
			return nil, nil
		}
		m, err := s.rd.Next(ctx)
		if err != nil || m == nil {
			return nil, err
		}
		s.scanned++
		if m.Seq <= s.floor || s.maxScan > 0 && s.scanned > s.maxScan {
			s.ended = true
			return nil, nil
		}
		es, err := s.keep(ctx, m)
		if err != nil {
			return nil, err
		}
		s.seq, s.taken = m.Seq, 0
		if m.Seq == s.skipSeq {
			s.taken = min(s.skip, len(es))
			es = es[s.taken:]
		}
		s.skipSeq = 0
		if len(es) > 0 {
			s.head, s.rest = &es[0], es[1:]
		}
	}
	return s.head, nil
}

// take consumes the head.
func (s *logSource) take() {
	s.head = nil
	s.taken++
}

// bound is where a continuation of this source starts: below the entry not yet shown (within
// its message, after the entries of it already shown).
func (s *logSource) bound() (uint64, int) {
	if s.head != nil || len(s.rest) > 0 {
		return s.seq + 1, s.taken
	}
	return s.rd.Bound(), 0
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
	ep, epErr := o.GetEndpoint(ctx, ns, name)
	if epErr != nil && ExitCode(epErr) != ExitNotFound {
		return epErr
	}
	if epErr == nil {
		lo.patterns = streams.EventPatterns(&ep.Spec)
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
	open    func(ctx context.Context) (*streamread.Backward, error)
	rd      *streamread.Backward
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
		recs := records.LogRecords(m.Data)
		for i := len(recs) - 1; i >= 0; i-- { // newest first
			if _, ok := r.newest[recs[i].DeliveryID]; !ok {
				r.newest[recs[i].DeliveryID] = recs[i]
			}
		}
	}
}

// readLog reads one page of an endpoint's log. Its sources (finished deliveries from the
// delivery log, live ones from the events stream and the deliveries stream, scheduled retries
// from the deliveries stream) are read
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

	var attempts *streamread.Stream
	openAttempts := func(ctx context.Context) (*streamread.Stream, error) {
		if attempts != nil {
			return attempts, nil
		}
		st, err := streamread.Open(ctx, nc, js, names.AttemptsStream())
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
		srcA = &logSource{rd: st.Backward(names.AttemptSubject(name), cur.a, want), keep: func(_ context.Context, m *streamread.Msg) ([]LogEntry, error) {
			recs := records.LogRecords(m.Data)
			if len(recs) == 0 {
				unreadable++
			}
			var out []LogEntry
			for i := len(recs) - 1; i >= 0; i-- { // newest first
				rec := recs[i]
				if status != "" && rec.State != status {
					continue
				}
				if !lo.attempts && rec.State != records.StateSucceeded && rec.State != records.StateDeadLetter {
					// An intermediate attempt: the delivery's current state is newer.
					continue
				}
				out = append(out, entryOfRecord(rec, m, lo.attempts))
			}
			return out, nil
		}}
		if cur.aShown > 0 {
			srcA.skipSeq, srcA.skip = cur.a-1, cur.aShown
		}
	}
	if useD || useR {
		st, err := streamread.Open(ctx, nc, js, names.DeliveriesStream())
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
			recent := &recentAttempts{open: func(ctx context.Context) (*streamread.Backward, error) {
				st, err := openAttempts(ctx)
				if err != nil {
					return nil, err
				}
				return st.Backward(names.AttemptSubject(name), 0, 64), nil
			}}
			srcD = &logSource{rd: st.Backward(names.DeliverySubject(name), cur.d, want), keep: one(func(ctx context.Context, m *streamread.Msg) (LogEntry, bool, error) {
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
			})}
		}
		if useR {
			srcR = &logSource{rd: st.Backward(names.RetryFilter(name), cur.r, want), keep: one(func(_ context.Context, m *streamread.Msg) (LogEntry, bool, error) {
				return entryOfDelivery(m, records.StateFailed), true, nil
			})}
		}
	}
	var srcE *logSource
	if useD && len(lo.patterns) > 0 {
		if srcE, err = eventsSource(ctx, o, ns, name, lo, cur, want, openAttempts, now); err != nil {
			return page, err
		}
	}
	cursorNow := func() logCursor {
		c := cur
		if srcA != nil {
			c.a, c.aShown = srcA.bound()
		}
		if srcD != nil {
			c.d, _ = srcD.bound()
		}
		if srcR != nil {
			c.r, _ = srcR.bound()
		}
		if srcE != nil {
			c.e, _ = srcE.bound()
		}
		return c
	}
	sources := []*logSource{srcD, srcR, srcE, srcA}
	// A delivery held or scheduled for a retry has a copy on the deliveries stream, newer than
	// its event (which stays unsettled until the copy is stored): the copy is listed.
	seen := map[string]bool{}
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
		best.take()
		if e.ID != "" && !lo.attempts {
			if seen[e.ID] {
				continue
			}
			seen[e.ID] = true
		}
		e.Cursor = cursorNow().String()
		page.Data = append(page.Data, e)
	}
	if unreadable > 0 {
		writeLine(o.IO.ErrOut, "warning: skipped %d unreadable delivery-log records", unreadable)
	}
	return page, nil
}

// maxEventsScan bounds how many events of the namespace one page reads looking for an
// endpoint's pending ones (the others are other endpoints').
const maxEventsScan = 20000

// eventsSource lists the events waiting for the endpoint on its namespace's events stream,
// above what its consumer there settled: pending (not yet handed out) or attempting.
func eventsSource(ctx context.Context, o *Options, ns, name string, lo *logOptions, cur logCursor, want int,
	openAttempts func(context.Context) (*streamread.Stream, error), now time.Time) (*logSource, error) {
	nc, js, err := o.JetStream(ctx)
	if err != nil {
		return nil, err
	}
	names := o.Set(ns)
	cons, err := js.Consumer(ctx, names.EventsStream(), names.EndpointConsumer(name))
	if streams.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the consumer of %s/%s: %w", ns, name, err)
	}
	info := cons.CachedInfo()
	if info.NumPending == 0 && info.NumAckPending == 0 {
		return nil, nil
	}
	delivered, ackFloor := info.Delivered.Stream, info.AckFloor.Stream
	st, err := streamread.Open(ctx, nc, js, names.EventsStream())
	if err != nil {
		return nil, o.streamError(err, "the events stream "+names.EventsStream())
	}
	recent := &recentAttempts{open: func(ctx context.Context) (*streamread.Backward, error) {
		st, err := openAttempts(ctx)
		if err != nil {
			return nil, err
		}
		return st.Backward(names.AttemptSubject(name), 0, 64), nil
	}}
	status := lo.status
	return &logSource{rd: st.Backward(names.EventsFilter(), cur.e, want), floor: ackFloor, maxScan: maxEventsScan,
		keep: one(func(ctx context.Context, m *streamread.Msg) (LogEntry, bool, error) {
			typ, ok := names.EventType(m.Subject)
			if !ok || !slices.ContainsFunc(lo.patterns, func(p string) bool { return match.Match(p, typ) }) {
				return LogEntry{}, false, nil
			}
			state := records.StatePending
			if m.Seq <= delivered {
				state = records.StateAttempting
			}
			if status != "" && status != state && state == records.StatePending {
				return LogEntry{}, false, nil
			}
			meta, _, _ := records.EventDelivery(m.Subject, o.NATS.Streams.Names.EventsSubjectPrefix, names.EventsStream(), m.Seq, m.Time, m.Header, ns, name)
			e := LogEntry{ID: meta.DeliveryID, Status: state, EventID: meta.EventID, EventType: meta.EventType, Time: m.Time.UTC()}
			created := m.Time.UTC()
			e.CreatedAt = &created
			if state == records.StateAttempting {
				rec, err := recent.latest(ctx, e.ID, m.Time)
				if err != nil {
					return e, false, err
				}
				if rec != nil && (rec.State == records.StateSucceeded || rec.State == records.StateDeadLetter) {
					return e, false, nil // settled, its acknowledgement not yet counted
				}
				inFlight(&e, rec, now)
			}
			return e, status == "" || e.Status == status, nil
		})}, nil
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
func entryOfRecord(rec records.LogRecord, m *streamread.Msg, attemptsView bool) LogEntry {
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
func entryOfDelivery(m *streamread.Msg, state string) LogEntry {
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
