// Package replay is webhook-operator's one replay engine. It selects deliveries of one
// endpoint, its dead letters or every outcome the delivery log recorded between two times
// (a recover), and makes each one again as a new delivery of that endpoint only, pointing at
// the original, with the record contract (records.NewDelivery): the event's own headers and
// body, the original's event id (the webhook-id receivers see), a new delivery id.
//
// A replay has a name, its idempotency key, and an owner, the identity of one run of it (the
// WebhookReplay's uid). The id of a replayed delivery is derived from the name and the
// original (records.ReplayDeliveryID), and the namespace's bucket remembers each replay
// (streams.ReplayKey, expiring after the replay-key TTL), so:
//
//   - a delivery is replayed at most once per name: a second replay of the same name, or one
//     created again after the first was deleted, skips it (AlreadyReplayed);
//   - a run that stops between a publish and the record of its progress (a controller
//     restart, a status write that failed) and reads the same deliveries again finds its own
//     earlier work, by its owner, and counts it as Replayed without publishing it again;
//     JetStream's de-duplication of the deterministic delivery id covers the moment between a
//     publish and the bucket's record.
//
// The WebhookReplay reconciler (controllers) runs the engine in bounded batches from a
// cursor it keeps in the WebhookReplay's status; `kubectl webhooks replay` and `recover`
// create WebhookReplays and use ReplayedID to name what a replay makes.
package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Outcome is what became of one selected delivery.
type Outcome string

const (
	// Replayed: a new delivery was created (now, or by this run before it restarted).
	Replayed Outcome = "Replayed"
	// AlreadyReplayed: a replay of the same name made it before; nothing new (skipped).
	AlreadyReplayed Outcome = "AlreadyReplayed"
	// Refused: it cannot be replayed faithfully, e.g. a dead letter whose payload was cut
	// (skipped).
	Refused Outcome = "Refused"
	// Failed: it could not be replayed, e.g. its event is no longer stored.
	Failed Outcome = "Failed"
)

// Skipped reports whether o counts as skipped (not replayed, on purpose).
func (o Outcome) Skipped() bool { return o == AlreadyReplayed || o == Refused }

// Result is the outcome of one selected delivery.
type Result struct {
	// Original is the delivery replayed; DeliveryID the new one (empty when none was made).
	Original   string
	DeliveryID string
	EventID    string
	Outcome    Outcome
	// Message says why it was refused or failed.
	Message string
}

// Selection says which deliveries of an endpoint a replay makes again.
type Selection struct {
	// Endpoint whose deliveries are replayed (in the namespace of the engine's Set).
	Endpoint string
	// FromLog selects from the delivery log (a recover) instead of the dead letters.
	FromLog bool
	// DeliveryIDs selects these dead letters only.
	DeliveryIDs []string
	// Reasons selects dead letters of these reasons only.
	Reasons []string
	// Since and Until bound when a dead letter was dead-lettered, or when an attempt of the log
	// started; zero: unbounded (Until: up to when the replay began).
	Since, Until time.Time
	// Lane is the endpoint's (streams.LaneOf): where its new deliveries are published.
	Lane streams.Lane
}

// SelectionOf is the selection of a WebhookReplay's spec.
func SelectionOf(spec *v1alpha1.WebhookReplaySpec) Selection {
	sel := Selection{Endpoint: spec.EndpointRef.Name, FromLog: spec.Source == v1alpha1.ReplayDeliveryLog, DeliveryIDs: spec.DeliveryIDs}
	for _, r := range spec.Reasons {
		sel.Reasons = append(sel.Reasons, string(r))
	}
	if spec.Since != nil {
		sel.Since = spec.Since.UTC()
	}
	if spec.Until != nil {
		sel.Until = spec.Until.UTC()
	}
	return sel
}

// Run is one run of a replay: Name is its idempotency key (a WebhookReplay's name), Owner
// tells its own earlier work from another's (the WebhookReplay's uid).
type Run struct {
	Name, Owner string
}

// ReplayedID is the id of the delivery a replay named name makes of the delivery original.
func ReplayedID(original, name string) string { return records.ReplayDeliveryID(original, name) }

// Cursor is how far a replay has read: Next is the next position (a stream sequence, or with
// DeliveryIDs the index of the next id), End where it stops (not included).
type Cursor struct {
	Stream    string
	Next, End uint64
}

// Done reports whether nothing is left to read.
func (c Cursor) Done() bool { return c.Next >= c.End }

// Bounds of one batch.
const (
	// MaxBatch is the most deliveries one batch replays.
	MaxBatch = 500
	// maxScan is the most stored messages one batch reads, selected or not, so a batch over
	// a stream that holds mostly other endpoints' or unselected messages still ends soon.
	maxScan = 4096
	// readBatch is how many messages one read asks for.
	readBatch = 256
	// attemptSlack is how much later than its start an attempt's record may be written (an
	// attempt lasts at most 120s): reading the log stops at Until plus this.
	attemptSlack = 5 * time.Minute
)

// Engine replays the deliveries of one namespace's endpoints.
type Engine struct {
	// JS is a JetStream connection allowed to read the namespace's dead letters, delivery log
	// and events, read and write its bucket, and publish its deliveries.
	JS jetstream.JetStream
	// Set is the namespace's streams.
	Set streams.Set
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

func (e *Engine) now() time.Time {
	if e.Now != nil {
		return e.Now().UTC()
	}
	return time.Now().UTC()
}

// ErrStreamMissing wraps a missing stream or bucket of the namespace.
var ErrStreamMissing = errors.New("a stream of the namespace is missing")

func (e *Engine) open(ctx context.Context, name string) (*streamread.Stream, error) {
	st, err := streamread.Open(ctx, e.JS.Conn(), e.JS, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: %w", ErrStreamMissing, err)
	}
	return st, err
}

// Begin fixes what a replay reads: the stream, where it starts (Since) and where it ends
// (the stream's last message now, so nothing that happens while it runs is selected).
func (e *Engine) Begin(ctx context.Context, sel Selection) (Cursor, error) {
	if len(sel.DeliveryIDs) > 0 {
		return Cursor{Stream: e.Set.DeadLetterStream(), End: uint64(len(sel.DeliveryIDs))}, nil
	}
	name, filter := e.Set.DeadLetterStream(), e.Set.DeadLetterFilter(sel.Endpoint)
	if sel.FromLog {
		name, filter = e.Set.AttemptsStream(), e.Set.AttemptSubject(sel.Endpoint)
	}
	st, err := e.open(ctx, name)
	if err != nil {
		return Cursor{}, err
	}
	c := Cursor{Stream: name, Next: st.FirstSeq, End: st.LastSeq + 1}
	if st.LastSeq == 0 {
		c.Next = c.End
		return c, nil
	}
	if !sel.Since.IsZero() {
		first, err := st.ForwardFrom(ctx, filter, sel.Since, 1)
		if err != nil {
			return Cursor{}, err
		}
		c.Next = c.End
		if len(first) > 0 {
			c.Next = first[0].Seq
		}
	}
	return c, nil
}

// Batch is what one call of Next did.
type Batch struct {
	// Results of the deliveries selected, in order.
	Results []Result
	// Cursor after them.
	Cursor Cursor
}

// Next replays at most max selected deliveries from cur on (more only when one message of the
// delivery log holds more than max selected records), reading at most a few thousand
// stored messages. It returns what it did even with an error: the cursor then stops before
// the delivery that could not be handled (NATS unreachable, a publish that failed), so a later
// call from it goes on without losing or repeating anything.
func (e *Engine) Next(ctx context.Context, sel Selection, run Run, cur Cursor, max int) (Batch, error) {
	b := Batch{Cursor: cur}
	if cur.Done() || max <= 0 {
		return b, nil
	}
	max = min(max, MaxBatch)
	w, err := e.writer(ctx, sel, run)
	if err != nil {
		return b, err
	}
	switch {
	case len(sel.DeliveryIDs) > 0:
		err = e.byID(ctx, sel, w, &b, max)
	default:
		err = e.scan(ctx, sel, w, &b, max)
	}
	return b, err
}

// byID replays dead letters named by id, from the cursor's index.
func (e *Engine) byID(ctx context.Context, sel Selection, w *writer, b *Batch, max int) error {
	st, err := e.open(ctx, e.Set.DeadLetterStream())
	if err != nil {
		return err
	}
	for !b.Cursor.Done() && len(b.Results) < max {
		id := sel.DeliveryIDs[b.Cursor.Next]
		m, err := st.Last(ctx, e.Set.DeadLetterSubject(sel.Endpoint, id))
		var res Result
		switch {
		case errors.Is(err, streamread.ErrNotFound):
			res = Result{Original: id, Outcome: Failed, Message: e.notFound(ctx, st, sel.Endpoint, id)}
		case err != nil:
			return err
		default:
			if res, err = w.deadLetter(ctx, m); err != nil {
				return err
			}
		}
		b.Results = append(b.Results, res)
		b.Cursor.Next++
	}
	return nil
}

// notFound explains why a dead letter named by id is not the endpoint's.
func (e *Engine) notFound(ctx context.Context, st *streamread.Stream, endpoint, id string) string {
	if m, err := st.Last(ctx, e.Set.DeadLetterIDFilter(id)); err == nil {
		if dl, perr := records.ParseDeadLetter(m.Header); perr == nil {
			return fmt.Sprintf("dead letter %s belongs to endpoint %q, not %q: a replay only targets the endpoint it was dead-lettered for", id, dl.Endpoint, endpoint)
		}
	}
	return fmt.Sprintf("dead letter %s of endpoint %s not found (removed, or never there)", id, endpoint)
}

// scan reads the dead letters or the delivery log from the cursor and replays what the
// selection selects.
func (e *Engine) scan(ctx context.Context, sel Selection, w *writer, b *Batch, max int) error {
	filter := e.Set.DeadLetterFilter(sel.Endpoint)
	if sel.FromLog {
		filter = e.Set.AttemptSubject(sel.Endpoint)
	}
	st, err := e.open(ctx, b.Cursor.Stream)
	if err != nil {
		return err
	}
	scanned := 0
	for !b.Cursor.Done() && len(b.Results) < max && scanned < maxScan {
		msgs, err := st.Forward(ctx, filter, b.Cursor.Next, readBatch)
		if err != nil {
			return err
		}
		if len(msgs) == 0 {
			b.Cursor.Next = b.Cursor.End
			return nil
		}
		for i := range msgs {
			m := &msgs[i]
			if m.Seq >= b.Cursor.End || sel.FromLog && !sel.Until.IsZero() && m.Time.After(sel.Until.Add(attemptSlack)) {
				b.Cursor.Next = b.Cursor.End
				return nil
			}
			scanned++
			var res []Result
			if sel.FromLog {
				// A message of the delivery log may hold several records: all are replayed
				// before the cursor moves past it, in this batch or (when they would make it
				// larger than max) in the next.
				recs := selectedRecords(sel, m)
				if len(b.Results) > 0 && len(b.Results)+len(recs) > max {
					return nil
				}
				res, err = w.logRecords(ctx, recs)
			} else {
				var r *Result
				if r, err = w.selectedDeadLetter(ctx, sel, m); r != nil {
					res = []Result{*r}
				}
			}
			b.Results = append(b.Results, res...)
			if err != nil {
				return err
			}
			b.Cursor.Next = m.Seq + 1
			if len(b.Results) >= max {
				return nil
			}
			if scanned >= maxScan {
				return nil
			}
		}
	}
	return nil
}

// writer makes the replayed deliveries of one batch.
type writer struct {
	e          *Engine
	run        Run
	endpoint   string
	lane       streams.Lane
	kv         jetstream.KeyValue
	events     *streamread.Stream // opened on first use (recover only)
	dlq        *streamread.Stream
	maxPayload int64
}

func (e *Engine) writer(ctx context.Context, sel Selection, run Run) (*writer, error) {
	kv, err := e.JS.KeyValue(ctx, e.Set.Bucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: bucket %s: %w", ErrStreamMissing, e.Set.Bucket(), err)
	}
	if err != nil {
		return nil, fmt.Errorf("the key-value bucket %s: %w", e.Set.Bucket(), err)
	}
	return &writer{e: e, run: run, endpoint: sel.Endpoint, lane: sel.Lane, kv: kv, maxPayload: e.JS.Conn().MaxPayload()}, nil
}

// selectedDeadLetter replays a dead letter of the endpoint if the selection selects it;
// nil when it does not.
func (w *writer) selectedDeadLetter(ctx context.Context, sel Selection, m *streamread.Msg) (*Result, error) {
	dl, err := records.ParseDeadLetter(m.Header)
	if err == nil {
		if len(sel.Reasons) > 0 && !slices.Contains(sel.Reasons, dl.Reason) {
			return nil, nil
		}
		at := dl.DeadLetteredAt
		if at.IsZero() {
			at = m.Time
		}
		if !sel.Since.IsZero() && at.Before(sel.Since) || !sel.Until.IsZero() && !at.Before(sel.Until) {
			return nil, nil
		}
	}
	res, err := w.deadLetter(ctx, m)
	return &res, err
}

// deadLetter replays one dead-letter message.
func (w *writer) deadLetter(ctx context.Context, m *streamread.Msg) (Result, error) {
	dl, err := records.ParseDeadLetter(m.Header)
	if err != nil {
		return Result{Original: fmt.Sprintf("(sequence %d)", m.Seq), Outcome: Failed,
			Message: fmt.Sprintf("unreadable dead letter at sequence %d of %s: %v", m.Seq, w.e.Set.DeadLetterStream(), err)}, nil
	}
	if dl.PayloadRemoved != "" {
		return Result{Original: dl.DeliveryID, EventID: dl.EventID, Outcome: Refused,
			Message: "the payload was " + dl.PayloadRemoved + " (" + records.PayloadRemovedReason(dl.PayloadRemoved) + "): there is nothing to deliver"}, nil
	}
	if dl.PayloadTruncated {
		return Result{Original: dl.DeliveryID, EventID: dl.EventID, Outcome: Refused,
			Message: "the payload was cut when it was dead-lettered: replaying it would deliver a different body"}, nil
	}
	// The replay keeps the dead letter's retention clock: a dead letter written of it is
	// kept with its payload no longer than this one would be.
	return w.publish(ctx, dl.DeliveryID, nats.Header(dl.Headers), m.Data, records.DeliveryMeta{
		EventID: dl.EventID, EventType: dl.EventType, EventTime: dl.EventTime, EventSeq: dl.EventSeq, EventNamespace: dl.EventNamespace,
		RetainFrom: records.RetainFrom(m.Header, m.Time),
	})
}

// selectedRecords are the records of one delivery-log message that the selection selects:
// outcomes (succeeded or dead-lettered, not a test delivery's) of attempts that started
// between Since and Until.
func selectedRecords(sel Selection, m *streamread.Msg) []records.LogRecord {
	var out []records.LogRecord
	for _, rec := range records.LogRecords(m.Data) {
		if rec.State != records.StateSucceeded && rec.State != records.StateDeadLetter || rec.Test || rec.DeliveryID == "" {
			continue
		}
		at := rec.Time
		if at.IsZero() {
			at = m.Time
		}
		if !sel.Since.IsZero() && at.Before(sel.Since) || !sel.Until.IsZero() && !at.Before(sel.Until) {
			continue
		}
		out = append(out, rec)
	}
	return out
}

// logRecords replays the deliveries of recs, in order, until one fails.
func (w *writer) logRecords(ctx context.Context, recs []records.LogRecord) ([]Result, error) {
	var out []Result
	for i := range recs {
		res, err := w.logged(ctx, &recs[i])
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// logged replays the delivery a log record describes, with its event's body from the events
// stream or, for a dead-lettered one, from its dead letter.
func (w *writer) logged(ctx context.Context, rec *records.LogRecord) (Result, error) {
	// An event of a source namespace is in that namespace's events stream, which a replay does
	// not read (its sequence there names another event here): only its dead letter has it.
	if rec.EventSeq > 0 && rec.EventNamespace == "" {
		if w.events == nil {
			st, err := w.e.open(ctx, w.e.Set.EventsStream())
			if err != nil {
				return Result{}, err
			}
			w.events = st
		}
		msgs, err := w.events.Forward(ctx, w.e.Set.EventsFilter(), rec.EventSeq, 1)
		if err != nil {
			return Result{}, err
		}
		if len(msgs) == 1 && msgs[0].Seq == rec.EventSeq {
			ev := &msgs[0]
			typ, _ := w.e.Set.EventType(ev.Subject)
			if records.EventID(w.events.Name, ev.Seq, ev.Header) == rec.EventID && typ == rec.EventType {
				return w.publish(ctx, rec.DeliveryID, ev.Header, ev.Data, records.DeliveryMeta{
					EventID: rec.EventID, EventType: rec.EventType, EventTime: records.EventTime(ev.Header, ev.Time), EventSeq: ev.Seq,
				})
			}
		}
	}
	if rec.State == records.StateDeadLetter {
		if w.dlq == nil {
			st, err := w.e.open(ctx, w.e.Set.DeadLetterStream())
			if err != nil {
				return Result{}, err
			}
			w.dlq = st
		}
		m, err := w.dlq.Last(ctx, w.e.Set.DeadLetterSubject(w.endpoint, rec.DeliveryID))
		if err == nil {
			return w.deadLetter(ctx, m)
		}
		if !errors.Is(err, streamread.ErrNotFound) {
			return Result{}, err
		}
	}
	why := "its event is no longer in the events stream " + w.e.Set.EventsStream() + " (events are kept for a limited time, 72h by default)"
	switch {
	case rec.EventSeq == 0:
		why = "its log record does not say which event it delivered (written by a version before eventSeq)"
	case rec.EventNamespace != "":
		why = "its event was published in namespace " + rec.EventNamespace + ", whose events stream a replay does not read"
	}
	if rec.State == records.StateDeadLetter {
		why += ", and its dead letter is gone"
	}
	return Result{Original: rec.DeliveryID, EventID: rec.EventID, Outcome: Failed, Message: "cannot replay: " + why}, nil
}

// keyValue is what the bucket remembers of one replayed delivery.
type keyValue struct {
	DeliveryID     string    `json:"deliveryId"`
	ReplayOf       string    `json:"replayOf"`
	IdempotencyKey string    `json:"idempotencyKey"`
	Owner          string    `json:"owner,omitempty"`
	CreatedAt      time.Time `json:"createdAt"`
}

// publish makes the replay of original unless a replay of the same name made it already.
// m carries the event's metadata; the rest is the new delivery's.
func (w *writer) publish(ctx context.Context, original string, eventHeader nats.Header, payload []byte, m records.DeliveryMeta) (Result, error) {
	newID := ReplayedID(original, w.run.Name)
	res := Result{Original: original, EventID: m.EventID, DeliveryID: newID}
	key := streams.ReplayKey(w.endpoint, w.run.Name+"/"+original)
	e, err := w.kv.Get(ctx, key)
	switch {
	case err == nil:
		var v keyValue
		if json.Unmarshal(e.Value(), &v) == nil && v.Owner != "" && v.Owner == w.run.Owner {
			// This run made it before it restarted (or before its progress was recorded).
			res.Outcome = Replayed
			return res, nil
		}
		res.Outcome, res.Message = AlreadyReplayed, "already replayed by a replay named "+w.run.Name
		if v.DeliveryID != "" {
			res.DeliveryID = v.DeliveryID
		}
		return res, nil
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return Result{}, fmt.Errorf("reading the replay key %s: %w", key, err)
	}

	m.DeliveryID, m.Namespace, m.Endpoint, m.Created, m.ReplayOf = newID, w.e.Set.Namespace(), w.endpoint, w.e.now(), original
	msg := records.NewDelivery(w.e.Set.DeliveryTarget(w.endpoint, w.lane), eventHeader, payload, m)
	if !records.Fits(msg, w.maxPayload) {
		res.Outcome, res.DeliveryID, res.Message = Failed, "", records.TooLarge(records.MsgSize(msg), w.maxPayload)
		return res, nil
	}
	// A publish that fails is tried again by the next batch: the delivery id makes a repeat
	// within the de-duplication window a duplicate JetStream drops.
	if _, err := w.e.JS.PublishMsg(ctx, msg); err != nil {
		return Result{}, fmt.Errorf("publishing the replay of %s to %s: %w", original, msg.Subject, err)
	}
	v, _ := json.Marshal(keyValue{DeliveryID: newID, ReplayOf: original, IdempotencyKey: w.run.Name, Owner: w.run.Owner, CreatedAt: w.e.now()})
	if _, err := w.kv.Create(ctx, key, v, w.e.Set.ReplayKeyTTL()...); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return Result{}, fmt.Errorf("recording the replay key %s: %w", key, err)
	}
	res.Outcome = Replayed
	return res, nil
}

// Refusal says why a replay to ep is refused, or "" when it is not: a disabled endpoint takes
// no new deliveries, replays included, until a person re-enables it (seed 002).
func Refusal(ep *v1alpha1.WebhookEndpoint) string {
	c := meta.FindStatusCondition(ep.Status.Conditions, v1alpha1.ConditionDisabled)
	if c == nil || c.Status != metav1.ConditionTrue {
		return ""
	}
	since := c.LastTransitionTime.UTC()
	if h := ep.Status.Health; h != nil && h.DisabledSince != nil {
		since = h.DisabledSince.UTC()
	}
	why := c.Reason
	if c.Message != "" {
		why += ": " + c.Message
	}
	pendingEnable := ""
	if v := ep.Annotations[v1alpha1.AnnotationEnable]; v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil && t.After(since) {
			pendingEnable = fmt.Sprintf(" (re-enabling was requested at %s; the dispatcher has not confirmed it yet)", v)
		}
	}
	return fmt.Sprintf("endpoint %s/%s is disabled since %s (%s): re-enable it with `kubectl webhooks enable %s` first%s",
		ep.Namespace, ep.Name, since.Format(time.RFC3339), why, ep.Name, pendingEnable)
}
