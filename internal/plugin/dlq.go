package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
)

// DeadLetterItem is a dead letter as dlq list and dlq show report it: the record, where it is
// stored and, for show, the payload.
type DeadLetterItem struct {
	records.DeadLetter
	// Subject and Sequence locate it in the dead-letter stream; StoredAt is when it was stored.
	Subject  string    `json:"subject"`
	Sequence uint64    `json:"sequence"`
	StoredAt time.Time `json:"storedAt"`
	// PayloadBytes is the size of the stored payload.
	PayloadBytes int `json:"payloadBytes"`
	// Payload is the event's body: JSON as is, anything else as a string (dlq show only).
	Payload json.RawMessage `json:"payload,omitempty"`
}

func newDLQCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, inspect and purge dead letters",
		Long: `Dead letters are deliveries given up: attempts exhausted, endpoint disabled or deleted,
payload too large. They are kept until removed (no 30-day window), can be replayed with
` + "`kubectl webhooks replay`" + ` and removed with ` + "`kubectl webhooks dlq purge`" + `.`,
	}
	cmd.AddCommand(newDLQListCommand(o), newDLQShowCommand(o), newDLQPurgeCommand(o))
	return cmd
}

type dlqListOptions struct {
	limit int
	after string
}

func newDLQListCommand(o *Options) *cobra.Command {
	lo := &dlqListOptions{}
	cmd := &cobra.Command{
		Use:   "list [endpoint]",
		Short: "List dead letters of an endpoint or of the whole namespace, newest first",
		Example: `  kubectl webhooks dlq list orders
  kubectl webhooks dlq list --limit 100 --after whdl_...
  kubectl webhooks dlq list orders -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			return lo.run(ctx, o, name)
		}),
	}
	cmd.Flags().IntVar(&lo.limit, "limit", DefaultLimit, "dead letters per page, 1 to 100")
	cmd.Flags().StringVar(&lo.after, "after", "", "continue after this dead letter's delivery id (the last one of the previous page)")
	return cmd
}

func (lo *dlqListOptions) run(ctx context.Context, o *Options, name string) error {
	if lo.limit < 1 || lo.limit > MaxLimit {
		return usagef("--limit must be between 1 and %d, not %d", MaxLimit, lo.limit)
	}
	if lo.after != "" {
		if err := checkDeliveryID("--after", lo.after); err != nil {
			return err
		}
	}
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	var epErr error
	if name != "" {
		if _, epErr = o.GetEndpoint(ctx, ns, name); epErr != nil && ExitCode(epErr) != ExitNotFound {
			return epErr
		}
	}
	st, err := o.openDLQ(ctx, ns)
	if err != nil {
		return err
	}
	names := o.Set(ns)
	filter := names.DeadLetterFilter(name)
	var before uint64
	if lo.after != "" {
		at := names.DeadLetterIDFilter(lo.after)
		if name != "" {
			at = names.DeadLetterSubject(name, lo.after)
		}
		m, err := st.Last(ctx, at)
		if errors.Is(err, streamread.ErrNotFound) {
			return notFoundf("--after %s: no such dead letter in %s (removed?)", lo.after, where(ns, name))
		}
		if err != nil {
			return err
		}
		before = m.Seq
	}
	page := Page[DeadLetterItem]{Data: []DeadLetterItem{}}
	rd := st.Backward(filter, before, lo.limit+1)
	unreadable := 0
	for {
		m, err := rd.Next(ctx)
		if err != nil {
			return err
		}
		if m == nil {
			break
		}
		item, err := deadLetterItem(m, false)
		if err != nil {
			unreadable++
			continue
		}
		if len(page.Data) == lo.limit {
			page.HasMore = true
			page.NextCursor = page.Data[len(page.Data)-1].DeliveryID
			break
		}
		page.Data = append(page.Data, item)
	}
	if unreadable > 0 {
		writeLine(o.IO.ErrOut, "warning: skipped %d unreadable dead letters", unreadable)
	}
	if epErr != nil {
		if len(page.Data) == 0 && lo.after == "" {
			return epErr
		}
		writeLine(o.IO.ErrOut, "warning: %v; showing its dead letters still kept", epErr)
	}
	if len(page.Data) == 0 && o.Output == OutputTable {
		writeLine(o.IO.ErrOut, "No dead letters in %s%s.", where(ns, name), map[bool]string{true: " after " + lo.after, false: ""}[lo.after != ""])
		return nil
	}
	now := o.Now()
	return o.print(page, func(w io.Writer) {
		deadLetterTable(w, page.Data, now)
		if page.HasMore {
			writeLine(w, "")
			cmd := "kubectl webhooks dlq list"
			if name != "" {
				cmd += " " + name
			}
			writeLine(w, "More dead letters: %s --after %s", cmd, page.NextCursor)
		}
	})
}

// deadLetterTable lists dead letters, one row each.
func deadLetterTable(w io.Writer, items []DeadLetterItem, now time.Time) {
	row(w, "ID", "ENDPOINT", "EVENT", "EVENT ID", "REASON", "ATTEMPTS", "LAST STATUS", "DEAD-LETTERED", "REPLAY OF")
	for _, d := range items {
		row(w, d.DeliveryID, d.Endpoint, orDash(d.EventType), orDash(d.EventID), d.Reason, strconv.Itoa(len(d.Attempts)),
			lastStatus(d.DeadLetter), ago(d.DeadLetteredAt, now), orDash(d.ReplayOf))
	}
}

func where(ns, name string) string {
	if name == "" {
		return "namespace " + ns
	}
	return ns + "/" + name
}

func lastStatus(d records.DeadLetter) string {
	if r := d.LastResponse; r != nil {
		if r.StatusCode != 0 {
			return strconv.Itoa(r.StatusCode)
		}
		if r.Error != "" {
			return short(r.Error, 30)
		}
	}
	if n := len(d.Attempts); n > 0 {
		a := d.Attempts[n-1]
		if a.StatusCode != 0 {
			return strconv.Itoa(a.StatusCode)
		}
		return orDash(a.Reason)
	}
	return "-"
}

func (o *Options) openDLQ(ctx context.Context, ns string) (*streamread.Stream, error) {
	nc, js, err := o.JetStream(ctx)
	if err != nil {
		return nil, err
	}
	st, err := streamread.Open(ctx, nc, js, o.Set(ns).DeadLetterStream())
	if err != nil {
		return nil, o.streamError(err, "the dead-letter stream "+o.Set(ns).DeadLetterStream())
	}
	return st, nil
}

// deadLetterItem reads a dead-letter message.
func deadLetterItem(m *streamread.Msg, withPayload bool) (DeadLetterItem, error) {
	dl, err := records.ParseDeadLetter(m.Header)
	if err != nil {
		return DeadLetterItem{}, fmt.Errorf("dead letter at sequence %d: %w", m.Seq, err)
	}
	item := DeadLetterItem{DeadLetter: dl, Subject: m.Subject, Sequence: m.Seq, StoredAt: m.Time.UTC(), PayloadBytes: len(m.Data)}
	if withPayload {
		item.Payload = payloadJSON(m.Data)
	}
	return item, nil
}

// payloadJSON is b itself when it is JSON (in UTF-8, as JSON must be), else b as a JSON string.
func payloadJSON(b []byte) json.RawMessage {
	if len(b) > 0 && json.Valid(b) && utf8.Valid(b) {
		return json.RawMessage(b)
	}
	s, _ := json.Marshal(string(b))
	return s
}

func newDLQShowCommand(o *Options) *cobra.Command {
	return &cobra.Command{
		Use:     "show <delivery-id>",
		Short:   "Show one dead letter: reason, every attempt, last response, headers and payload",
		Example: `  kubectl webhooks dlq show whdl_0123456789abcdefghjkmnpqrs -n shop`,
		Args:    cobra.ExactArgs(1),
		RunE: o.run(func(ctx context.Context, args []string) error {
			return runDLQShow(ctx, o, args[0])
		}),
	}
}

// findDeadLetter finds a dead letter by delivery id in a namespace, whatever its endpoint.
func (o *Options) findDeadLetter(ctx context.Context, st *streamread.Stream, ns, id string) (*streamread.Msg, error) {
	if err := checkDeliveryID("the delivery id", id); err != nil {
		return nil, err
	}
	m, err := st.Last(ctx, o.Set(ns).DeadLetterIDFilter(id))
	if errors.Is(err, streamread.ErrNotFound) {
		return nil, notFoundf("dead letter %s not found in namespace %s", id, ns)
	}
	return m, err
}

func runDLQShow(ctx context.Context, o *Options, id string) error {
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	st, err := o.openDLQ(ctx, ns)
	if err != nil {
		return err
	}
	m, err := o.findDeadLetter(ctx, st, ns, id)
	if err != nil {
		return err
	}
	item, err := deadLetterItem(m, true)
	if err != nil {
		return err
	}
	return o.print(item, func(w io.Writer) { describeDeadLetter(w, item, m.Data) })
}

func describeDeadLetter(w io.Writer, d DeadLetterItem, payload []byte) {
	row(w, "Delivery:", d.DeliveryID)
	row(w, "Endpoint:", d.Namespace+"/"+d.Endpoint)
	row(w, "Event:", fmt.Sprintf("%s (%s)", orDash(d.EventID), orDash(d.EventType)))
	row(w, "Event time:", ts(d.EventTime))
	if d.EventSeq > 0 {
		row(w, "Event sequence:", strconv.FormatUint(d.EventSeq, 10))
	}
	row(w, "Reason:", d.Reason)
	if d.Message != "" {
		row(w, "Message:", d.Message)
	}
	row(w, "Created:", ts(d.CreatedAt))
	row(w, "Dead-lettered:", ts(d.DeadLetteredAt))
	if d.ReplayOf != "" {
		row(w, "Replay of:", d.ReplayOf)
	}
	// A line without a tab ends the label column, so the attempts get columns of their own.
	writeLine(w, "Attempts (%d):", len(d.Attempts))
	if len(d.Attempts) > 0 {
		row(w, "  #", "TIME", "STATUS", "LATENCY", "ERROR")
		for _, a := range d.Attempts {
			status := "-"
			if a.StatusCode != 0 {
				status = strconv.Itoa(a.StatusCode)
			}
			errText := a.Reason
			if a.Error != "" {
				errText = strings.TrimSpace(a.Reason + ": " + a.Error)
			}
			row(w, "  "+strconv.Itoa(a.N), ts(a.Time), status, latency(a.LatencyMS, a.LatencyUS), orDash(short(errText, 80)))
		}
	}
	if r := d.LastResponse; r != nil {
		status := "-"
		if r.StatusCode != 0 {
			status = strconv.Itoa(r.StatusCode)
		}
		writeLine(w, "Last response: status %s", status)
		if r.Error != "" {
			writeLine(w, "  Error: %s", r.Error)
		}
		if r.Body != "" {
			cut := ""
			if r.Truncated {
				cut = " (cut at 2 KB)"
			}
			writeLine(w, "  Body%s:", cut)
			writeBlock(w, "    ", untab(r.Body))
		}
	}
	if len(d.Headers) > 0 {
		writeLine(w, "Headers:")
		keys := make([]string, 0, len(d.Headers))
		for k := range d.Headers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			for _, v := range d.Headers[k] {
				writeLine(w, "  %s: %s", k, v)
			}
		}
	}
	if d.PayloadRemoved != "" {
		writeLine(w, "Payload: %s", payloadRemovedText(d.DeadLetter))
		return
	}
	cut := ""
	if d.PayloadTruncated {
		cut = ", truncated: cannot be replayed"
	}
	writeLine(w, "Payload (%d bytes%s):", len(payload), cut)
	body := untab(string(payload))
	if json.Valid(payload) {
		if b, err := json.MarshalIndent(json.RawMessage(payload), "", "  "); err == nil {
			body = string(b)
		}
	}
	writeBlock(w, "  ", body)
	writeLine(w, "")
	writeLine(w, "Replay it with: kubectl webhooks replay %s --id %s -n %s", d.Endpoint, d.DeliveryID, d.Namespace)
}

// payloadRemovedText says why a dead letter no longer has its payload.
func payloadRemovedText(d records.DeadLetter) string {
	what := "the payload was removed"
	switch d.PayloadRemoved {
	case records.PayloadExpired:
		what = "the payload has expired"
	case records.PayloadErased:
		what = "the payload was erased"
	}
	if d.PayloadRemovedAt != nil {
		what += " on " + ts(*d.PayloadRemovedAt)
	}
	return what + " (" + records.PayloadRemovedReason(d.PayloadRemoved) + "); the attempt history stays, and it cannot be replayed"
}

// untab keeps a block of text (a body) from shifting the columns of the tab writer it is
// printed through, and readable: its tabs become spaces rather than escapes.
func untab(s string) string { return strings.ReplaceAll(s, "\t", "    ") }

// checkDeliveryID checks that id can name a dead letter: one subject token. Delivery ids are
// whdl_... (records.DeliveryID); the dispatcher names an undecodable delivery invalid-<seq>.
func checkDeliveryID(what, id string) error {
	if id == "" || len(id) > 255 || strings.ContainsAny(id, ".*> \t\r\n") {
		return usagef("%s %q is not a delivery id (whdl_...)", what, id)
	}
	return nil
}
