package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/webhook-operator/webhook-operator/internal/deliveries"
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
	cur, err := deliveries.ParseCursor(lo.after)
	if err != nil {
		return usagef("--after %q is not a cursor of this log (they look like c4.1234.0.56.78.90.0)", lo.after)
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

// readLog reads one page of an endpoint's log with the product's one rule for a delivery's
// state (internal/deliveries).
func readLog(ctx context.Context, o *Options, ns, name string, lo *logOptions, cur deliveries.Cursor) (Page[LogEntry], error) {
	page := Page[LogEntry]{Data: []LogEntry{}}
	nc, js, err := o.JetStream(ctx)
	if err != nil {
		return page, err
	}
	r := &deliveries.Reader{NC: nc, JS: js, Streams: o.NATS.Streams, Now: o.Now}
	q := deliveries.Query{Namespace: ns, Endpoint: name, State: lo.status, Limit: lo.limit, Cursor: cur, Attempts: lo.attempts}
	if len(lo.patterns) > 0 {
		q.Endpoints = []deliveries.Endpoint{{Name: name, Patterns: lo.patterns}}
	}
	p, err := r.Read(ctx, q)
	if errors.Is(err, deliveries.ErrNoStreams) {
		return page, o.streamError(err, "the streams of namespace "+ns)
	}
	var broad *deliveries.TooBroadError
	if errors.As(err, &broad) {
		return page, usagef("%v", err)
	}
	if err != nil {
		return page, err
	}
	for _, e := range p.Entries {
		page.Data = append(page.Data, logEntryOf(e, lo.attempts))
	}
	if p.HasMore {
		page.HasMore, page.NextCursor = true, p.Next.String()
	}
	if p.Unreadable > 0 {
		writeLine(o.IO.ErrOut, "warning: skipped %d unreadable delivery-log records", p.Unreadable)
	}
	for _, w := range p.Warnings {
		writeLine(o.IO.ErrOut, "warning: %s", w)
	}
	return page, nil
}

// logEntryOf is an entry as the log prints it.
func logEntryOf(e deliveries.Entry, attemptsView bool) LogEntry {
	out := LogEntry{ID: e.ID, Status: e.Status, EventID: e.EventID, EventType: e.EventType, Attempts: e.Attempts, Time: e.Time,
		CreatedAt: e.CreatedAt, LastAttemptAt: e.LastAttemptAt, NextAttemptAt: e.NextAttemptAt, LastResponse: e.LastResponse,
		LatencyMS: e.LatencyMS, LatencyUS: e.LatencyUS, Test: e.Test, Reason: e.Reason, DeadLetterReason: e.DeadLetterReason,
		ReplayOfID: e.ReplayOfID, Cursor: e.Cursor.String()}
	if attemptsView {
		out.Attempt = e.Attempt
		out.RequestHeaders = e.RequestHeaders
	}
	return out
}
