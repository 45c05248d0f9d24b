package plugin

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
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
	// Cursor continues the log after this entry (--after): set on the last entry of a page
	// that has more (the page's nextCursor, the data API's continue token).
	Cursor string `json:"cursor,omitempty"`
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
  pending      waiting in the events stream or the deliveries stream
  attempting   handed to a dispatcher, in flight
  failed       an attempt failed; the next one is scheduled (NEXT ATTEMPT)
  succeeded    delivered
  dead_letter  given up; see ` + "`kubectl webhooks dlq show <id>`" + `
Finished deliveries come from the delivery log (kept 30 days); live ones from the
deliveries stream. --attempts lists every attempt instead (status after that attempt).
Pages hold --limit entries (1-100, default 25); continue with --after <cursor>.

The log is read through the data API (webhookdeliveries of data.webhook-operator.io, the
ClusterRole webhook-operator-viewer): no NATS connection. Response bodies and request
headers are payloads, read with their own grant: kubectl get --raw
/apis/data.webhook-operator.io/v1alpha1/namespaces/<ns>/webhookdeliveries/<id>/payload`,
		Example: `  kubectl webhooks log orders
  kubectl webhooks log orders --status failed --limit 100
  kubectl webhooks log orders --after <nextCursor of the previous page> -o json
  kubectl webhooks log orders --attempts`,
		Args: cobra.ExactArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error { return lo.run(ctx, o, args[0]) }),
	}
	f := cmd.Flags()
	f.StringVar(&lo.status, "status", "", "only deliveries in this status: pending, attempting, succeeded, failed or dead_letter")
	f.IntVar(&lo.limit, "limit", DefaultLimit, "entries per page, 1 to 100")
	f.StringVar(&lo.after, "after", "", "continue after this cursor (printed at the end of a page: the same log, --status and --attempts)")
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
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	_, epErr := o.GetEndpoint(ctx, ns, name)
	if epErr != nil && ExitCode(epErr) != ExitNotFound {
		return epErr
	}
	page, err := readLog(ctx, o, ns, name, lo)
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

// readLog reads one page of an endpoint's log through the data API (webhookdeliveries of the
// endpoint, newest first; with --attempts, its view=attempts).
func readLog(ctx context.Context, o *Options, ns, name string, lo *logOptions) (Page[LogEntry], error) {
	page := Page[LogEntry]{Data: []LogEntry{}}
	sel := fields.Set{datav1alpha1.FieldEndpoint: name}
	if lo.status != "" {
		sel[datav1alpha1.FieldState] = string(records.APIState(lo.status))
	}
	if lo.attempts {
		sel[datav1alpha1.FieldView] = datav1alpha1.ViewAttempts
	}
	var list datav1alpha1.WebhookDeliveryList
	what := fmt.Sprintf("the delivery log of %s/%s (%s)", ns, name, datav1alpha1.ResourceDeliveries)
	if err := o.listData(ctx, ns, datav1alpha1.ResourceDeliveries, dataList{fields: sel, limit: lo.limit, cont: lo.after}, &list); err != nil {
		if lo.after != "" && apierrors.IsBadRequest(err) {
			return page, usagef("--after: %v", dataError(err, "get/list", what, ns))
		}
		return page, dataError(err, "get/list", what, ns)
	}
	for i := range list.Items {
		page.Data = append(page.Data, logEntryOf(&list.Items[i], lo.attempts))
	}
	if list.Continue != "" {
		page.HasMore, page.NextCursor = true, list.Continue
		page.Data[len(page.Data)-1].Cursor = list.Continue
	}
	return page, nil
}

// logEntryOf is a delivery of the data API as the log prints it.
func logEntryOf(d *datav1alpha1.WebhookDelivery, attemptsView bool) LogEntry {
	st := &d.Status
	out := LogEntry{ID: d.Name, Status: records.LogStatus(st.State), EventID: d.Spec.EventID, EventType: d.Spec.EventType, Attempts: int(st.Attempts),
		Time: st.Time.UTC(), Test: d.Spec.Test, Reason: st.Reason, DeadLetterReason: st.DeadLetterReason, ReplayOfID: d.Spec.ReplayOf}
	// The API's creation time is the delivery's when its record says, else the time it
	// reached its state (to the second): only the former is a creation time of its own.
	if c := d.CreationTimestamp.UTC(); !d.CreationTimestamp.IsZero() && !c.Equal(out.Time.Truncate(time.Second)) {
		out.CreatedAt = &c
	}
	out.LastAttemptAt = utcp(st.LastAttemptTime)
	out.NextAttemptAt = utcp(st.NextAttemptTime)
	if r := st.LastResponse; r != nil {
		out.LastResponse = &records.Response{StatusCode: int(r.StatusCode), Error: r.Error, Truncated: r.BodyTruncated}
	}
	if us := st.LatencyMicroseconds; us != nil {
		ms := *us / 1000
		out.LatencyMS = &ms
		// Records written before microseconds existed have whole milliseconds, which the API
		// gives as microseconds: those print as milliseconds, as they always did.
		if *us%1000 != 0 {
			v := *us
			out.LatencyUS = &v
		}
	}
	if attemptsView {
		out.Attempt = int(st.Attempts)
	}
	return out
}

func utcp(t *metav1.Time) *time.Time {
	if t == nil {
		return nil
	}
	v := t.UTC()
	return &v
}
