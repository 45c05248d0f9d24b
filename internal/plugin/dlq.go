package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"

	"github.com/webhook-operator/webhook-operator/internal/records"
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
	// Payload is the event's body: JSON as is, anything else as a string (dlq show only, with
	// a grant to read payloads).
	Payload json.RawMessage `json:"payload,omitempty"`

	// payloadHidden says why show does not print the payload.
	payloadHidden string
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
  kubectl webhooks dlq list --limit 100 --after <nextCursor of the previous page>
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
	cmd.Flags().StringVar(&lo.after, "after", "", "continue after this cursor (printed at the end of a page: the same list)")
	return cmd
}

func (lo *dlqListOptions) run(ctx context.Context, o *Options, name string) error {
	if lo.limit < 1 || lo.limit > MaxLimit {
		return usagef("--limit must be between 1 and %d, not %d", MaxLimit, lo.limit)
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
	sel := fields.Set{}
	if name != "" {
		sel[datav1alpha1.FieldEndpoint] = name
	}
	var list datav1alpha1.WebhookDeadLetterList
	what := fmt.Sprintf("the dead letters of %s (%s)", where(ns, name), datav1alpha1.ResourceDeadLetters)
	if err := o.listData(ctx, ns, datav1alpha1.ResourceDeadLetters, dataList{fields: sel, limit: lo.limit, cont: lo.after}, &list); err != nil {
		if lo.after != "" && apierrors.IsBadRequest(err) {
			return usagef("--after: %v", dataError(err, "get/list", what, ns))
		}
		return dataError(err, "get/list", what, ns)
	}
	page := Page[DeadLetterItem]{Data: make([]DeadLetterItem, 0, len(list.Items))}
	unreadable := 0
	for i := range list.Items {
		if list.Items[i].Status.Reason == reasonUnreadable {
			unreadable++
			continue
		}
		page.Data = append(page.Data, o.deadLetterItem(&list.Items[i]))
	}
	if list.Continue != "" {
		page.HasMore, page.NextCursor = true, list.Continue
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
		writeLine(o.IO.ErrOut, "No dead letters in %s%s.", where(ns, name), map[bool]string{true: " after this cursor", false: ""}[lo.after != ""])
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

// reasonUnreadable is the reason the data API gives a dead letter whose record could not be
// read.
const reasonUnreadable = "unreadable"

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

// deadLetterItem is a dead letter of the data API as dlq list and show report it (without its
// payload, which is the payload subresource's).
func (o *Options) deadLetterItem(d *datav1alpha1.WebhookDeadLetter) DeadLetterItem {
	st := &d.Status
	dl := records.DeadLetter{DeliveryID: d.Name, EventID: d.Spec.EventID, EventType: d.Spec.EventType, Namespace: d.Namespace,
		Endpoint: d.Spec.Endpoint, Reason: st.Reason, Message: st.Message, PayloadTruncated: st.PayloadTruncated,
		CreatedAt: d.CreationTimestamp.UTC(), DeadLetteredAt: st.DeadLetteredTime.UTC(), ReplayOf: d.Spec.ReplayOf, PayloadRemoved: st.PayloadRemoved,
		Attempts: make([]records.Attempt, 0, len(st.Attempts))}
	if st.EventTime != nil {
		dl.EventTime = st.EventTime.UTC()
	}
	dl.PayloadRemovedAt = utcp(st.PayloadRemovedTime)
	dl.EventSeq = uint64(st.EventSequence)
	for _, a := range st.Attempts {
		dl.Attempts = append(dl.Attempts, records.Attempt{N: int(a.Number), Time: a.Time.UTC(), StatusCode: int(a.StatusCode),
			LatencyMS: a.DurationMicroseconds / 1000, LatencyUS: a.DurationMicroseconds, Reason: a.Reason, Error: a.Error})
	}
	if r := st.LastResponse; r != nil {
		dl.LastResponse = &records.Response{StatusCode: int(r.StatusCode), Error: r.Error, Truncated: r.BodyTruncated}
	}
	return DeadLetterItem{DeadLetter: dl, Subject: o.Set(d.Namespace).DeadLetterSubject(d.Spec.Endpoint, d.Name), Sequence: uint64(st.Sequence),
		StoredAt: st.DeadLetteredTime.UTC(), PayloadBytes: int(st.PayloadBytes)}
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

func runDLQShow(ctx context.Context, o *Options, id string) error {
	if err := checkDeliveryID("the delivery id", id); err != nil {
		return err
	}
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	var d datav1alpha1.WebhookDeadLetter
	if err := o.getData(ctx, ns, datav1alpha1.ResourceDeadLetters, id, "", &d); err != nil {
		if objectNotFound(err) {
			return notFoundf("dead letter %s not found in namespace %s", id, ns)
		}
		return dataError(err, "get/list", "dead letter "+id+" ("+datav1alpha1.ResourceDeadLetters+")", ns)
	}
	item := o.deadLetterItem(&d)
	var payload []byte
	var p datav1alpha1.DeliveryPayload
	err = o.getData(ctx, ns, datav1alpha1.ResourceDeadLetters, id, datav1alpha1.SubresourcePayload, &p)
	switch {
	case apierrors.IsForbidden(err):
		item.payloadHidden = fmt.Sprintf("not shown: reading payloads needs get on %s/%s (%s) in namespace %s, e.g. the ClusterRole webhook-operator-payload-reader",
			datav1alpha1.ResourceDeadLetters, datav1alpha1.SubresourcePayload, datav1alpha1.GroupName, ns)
		writeLine(o.IO.ErrOut, "warning: the payload is %s", item.payloadHidden)
	case err != nil:
		return dataError(err, "get", "the payload of dead letter "+id+" ("+datav1alpha1.ResourceDeadLetters+"/"+datav1alpha1.SubresourcePayload+")", ns)
	default:
		if p.Event != nil {
			payload = bodyBytes(p.Event)
			item.Payload = payloadJSON(payload)
		}
		item.Headers = p.EventHeaders
		if p.Response != nil {
			if item.LastResponse == nil {
				item.LastResponse = &records.Response{}
			}
			item.LastResponse.Body, item.LastResponse.Truncated = string(bodyBytes(p.Response)), p.Response.Truncated
		}
	}
	return o.print(item, func(w io.Writer) { describeDeadLetter(w, item, payload) })
}

// bodyBytes is a stored body of the data API: its JSON or its text.
func bodyBytes(b *datav1alpha1.Body) []byte {
	if b.JSON != nil && len(b.JSON.Raw) > 0 {
		return b.JSON.Raw
	}
	return []byte(b.Text)
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
	if d.payloadHidden != "" {
		writeLine(w, "Payload (%d bytes): %s", d.PayloadBytes, d.payloadHidden)
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
