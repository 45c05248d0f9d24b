package erasure

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/expr"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// MaxMatchedEvents bounds the event ids one erasure remembers (to find their delivery-log
// records); a selection matching more is refused (ErrTooManyEvents).
const MaxMatchedEvents = 100_000

// ErrTooManyEvents says the selection matched more than MaxMatchedEvents events.
var ErrTooManyEvents = fmt.Errorf("the selection matches more than %d events: narrow it (a time range, event types) and erase in several WebhookErasures", MaxMatchedEvents)

// ExpressionLimitError says the selection's expression was stopped by one of its bounds on a
// stored event (expr.IsLimit): the erasure cannot decide on that event, and stops.
type ExpressionLimitError struct {
	EventID, Stream string
	Seq             uint64
	Err             error
}

func (e *ExpressionLimitError) Error() string {
	return fmt.Sprintf("%v (event %s, message %d of %s)", e.Err, e.EventID, e.Seq, e.Stream)
}

func (e *ExpressionLimitError) Unwrap() error { return e.Err }

// FoldLookup says how far the health counts of endpoint include the delivery log (the last
// sequence folded), and whether anything counts it at all (an endpoint that no longer exists
// is counted by no one, and its records may be rewritten at once).
type FoldLookup func(ctx context.Context, endpoint string) (folded uint64, counted bool, err error)

// Engine erases payloads from one namespace's streams.
type Engine struct {
	JS  jetstream.JetStream
	Set streams.Set
	// Folded is how far each endpoint's counts include the log (see FoldLookup).
	Folded FoldLookup
	// SettleWait is how long an attempt in flight may still write something (the longest ack
	// wait of the namespace's consumers): the Settle phase reads what was written meanwhile
	// this long after the deletions.
	SettleWait time.Duration
	// Idle, when set, says whether no delivery is in flight in set's namespace now (nothing
	// pulled and not acknowledged): its Settle phase then reads at once after the deletions.
	Idle func(ctx context.Context, set streams.Set) (bool, error)
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Readers are the namespaces whose endpoints read this one's events (spec.sourceNamespaces):
	// they hold copies of its events in their deliveries stream, delivery log and dead letters,
	// which the same phases erase (only the records whose event came from this namespace),
	// one reader after the other once the erased namespace's own phases are done.
	Readers []Reader
}

// Reader is a namespace that reads the erased one's events: its streams and its endpoints'
// fold (see FoldLookup).
type Reader struct {
	Set    streams.Set
	Folded FoldLookup
}

// copies are the streams of a namespace reading the erased one that hold copies of its events.
func copies(s streams.Set) []string {
	return []string{s.DeliveriesStream(), s.DeadLetterStream(), s.AttemptsStream()}
}

// on is the engine of the namespace whose stream this is: e itself, or one on a reader's
// streams (whose records of the erased namespace's events it erases).
func (e *Engine) on(stream string) *Engine {
	for _, r := range e.Readers {
		if slices.Contains(copies(r.Set), stream) {
			return &Engine{JS: e.JS, Set: r.Set, Folded: r.Folded, Now: e.Now}
		}
	}
	return e
}

// reader is the index of the reader whose copies stream is, -1 for none.
func (e *Engine) reader(stream string) int {
	return slices.IndexFunc(e.Readers, func(r Reader) bool { return slices.Contains(copies(r.Set), stream) })
}

func (e *Engine) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// Progress is an erasure's cursor, as its status keeps it.
type Progress struct {
	Phase  string
	Stream string
	Next   uint64
	// Ends are, by stream, one past its last sequence when the erasure started (a reader's
	// streams: when the erasure first read them), and in the Settle phase where the next
	// reading starts. They hold the erased namespace's four streams and the three of one
	// reader, the one being read (ensureEnds): at most seven, however many namespaces read it.
	Ends        map[string]uint64
	SettleAfter time.Time
	// SettleErased is what the current Settle reading erased.
	SettleErased int64
}

// Counts are what a run erased, per stream, and what it found.
type Counts struct {
	Events, Deliveries, LogRecords, DeadLetters int64
	Unevaluated                                 int64
}

// Job is one erasure: its selection, the ids of the events it matched (in memory: a run that
// lost them collects them again before going on) and its cursor.
type Job struct {
	Sel      Selection
	Progress Progress
	// IDs are the matched events' ids.
	IDs map[string]bool
	// collected says IDs hold what the phases before Progress.Phase found; recollect is the
	// cursor of collecting them again.
	collected bool
	recollect *Progress
}

// NewJob starts a job at progress p (empty: a new erasure). A job that resumes a later phase
// than Collect first collects its event ids again (they are not stored); one that resumes
// Collect starts it again from its first stream, for the same reason.
func NewJob(sel Selection, p Progress) *Job {
	j := &Job{Sel: sel, Progress: p, IDs: map[string]bool{}}
	j.collected = p.Phase == "" || p.Phase == v1alpha1.ErasurePhaseCollect
	if p.Phase == v1alpha1.ErasurePhaseCollect {
		j.Progress.Stream, j.Progress.Next = "", 0 // locate: the start of Collect
	}
	return j
}

// Step is the outcome of one Run.
type Step struct {
	// Counts are what this run erased and found.
	Counts Counts
	// Done is set once the erasure is complete.
	Done bool
	// WaitUntil, when set, is when to run again; WaitReason and WaitMessage say why.
	WaitUntil   time.Time
	WaitReason  string
	WaitMessage string
}

// phase is one phase over the streams of one namespace (set): the erased one, or a reader.
type phase struct {
	name    string
	set     streams.Set
	streams []string
}

// phases are the phases in order, with the streams each reads. Collect reads the erased
// namespace's events, deliveries and dead letters, then every reader's deliveries and dead
// letters (the ids of copies whose original is gone, for the delivery logs); then the erased
// namespace's DeliveryLog, DeadLetters, Deliveries, Events and Settle; then, reader after
// reader, its DeliveryLog, DeadLetters, Deliveries and Settle. A reader comes after the
// deletion of the events, so nothing new of them reaches it once its own Settle has read.
func (e *Engine) phases() []phase {
	s := e.Set
	collect := []string{s.EventsStream(), s.DeliveriesStream(), s.DeadLetterStream()}
	for _, r := range e.Readers {
		collect = append(collect, r.Set.DeliveriesStream(), r.Set.DeadLetterStream())
	}
	out := []phase{
		{v1alpha1.ErasurePhaseCollect, s, collect},
		{v1alpha1.ErasurePhaseDeliveryLog, s, []string{s.AttemptsStream()}},
		{v1alpha1.ErasurePhaseDeadLetters, s, []string{s.DeadLetterStream()}},
		{v1alpha1.ErasurePhaseDeliveries, s, []string{s.DeliveriesStream()}},
		{v1alpha1.ErasurePhaseEvents, s, []string{s.EventsStream()}},
		{v1alpha1.ErasurePhaseSettle, s, copies(s)},
	}
	for _, r := range e.Readers {
		rs := r.Set
		out = append(out,
			phase{v1alpha1.ErasurePhaseDeliveryLog, rs, []string{rs.AttemptsStream()}},
			phase{v1alpha1.ErasurePhaseDeadLetters, rs, []string{rs.DeadLetterStream()}},
			phase{v1alpha1.ErasurePhaseDeliveries, rs, []string{rs.DeliveriesStream()}},
			phase{v1alpha1.ErasurePhaseSettle, rs, copies(rs)})
	}
	return out
}

// locate is the index of the phase cursor c is in. A cursor on a stream no phase of its name
// reads any more (its reader no longer reads the erased namespace) goes on from the start of
// Collect, or from the erased namespace's Settle and then every reader; a cursor of an
// erasure begun before the ends were bounded (they name the streams of several readers) goes
// on from the erased namespace's DeliveryLog, or from the start of Collect, its ends trimmed
// to the erased namespace's. Reading again what was erased erases nothing.
func (e *Engine) locate(phases []phase, c *Progress) (int, error) {
	if !slices.ContainsFunc(phases, func(p phase) bool { return p.name == c.Phase }) {
		return 0, fmt.Errorf("unknown erasure phase %q", c.Phase)
	}
	seen := map[int]bool{}
	for name := range c.Ends {
		if r := e.reader(name); r >= 0 {
			seen[r] = true
		}
	}
	restart := len(seen) > 1
	if restart {
		own := e.Set.Streams()
		maps.DeleteFunc(c.Ends, func(name string, _ uint64) bool { return !slices.Contains(own, name) })
	}
	if !restart {
		for i, p := range phases {
			if p.name == c.Phase && slices.Contains(p.streams, c.Stream) {
				return i, nil
			}
		}
	}
	i := 0 // Collect
	switch {
	case c.Phase == v1alpha1.ErasurePhaseCollect:
	case restart:
		i = 1 // the erased namespace's DeliveryLog
	default:
		i = 5 // the erased namespace's Settle
	}
	c.Phase, c.Stream, c.Next = phases[i].name, phases[i].streams[0], 0
	return i, nil
}

// ensureEnds records where c's stream ends now when its end is not known yet: a reader's
// stream the erasure enters. Entering a reader's stream records the ends of its three
// streams and forgets those of any other reader, so that the ends never hold more than the
// erased namespace's streams and one reader's.
func (e *Engine) ensureEnds(ctx context.Context, c *Progress) error {
	if _, ok := c.Ends[c.Stream]; ok {
		return nil
	}
	if c.Ends == nil {
		c.Ends = map[string]uint64{}
	}
	names := []string{c.Stream}
	if r := e.reader(c.Stream); r >= 0 {
		own := e.Set.Streams()
		maps.DeleteFunc(c.Ends, func(name string, _ uint64) bool { return !slices.Contains(own, name) })
		names = copies(e.Readers[r].Set)
	}
	for _, name := range names {
		info, err := e.streamInfo(ctx, name)
		if err != nil {
			return err
		}
		c.Ends[name] = 0 // a reader without streams holds nothing
		if info != nil {
			c.Ends[name] = info.State.LastSeq + 1
		}
	}
	return nil
}

// batch is how many messages one read returns.
const batch = 256

// Run advances j by at most about limit messages read.
func (e *Engine) Run(ctx context.Context, j *Job, limit int) (Step, error) {
	var step Step
	p := &j.Progress
	if p.Phase == "" {
		ends := map[string]uint64{}
		for _, name := range e.Set.Streams() {
			info, err := e.streamInfo(ctx, name)
			if err != nil {
				return step, err
			}
			if info != nil {
				ends[name] = info.State.LastSeq + 1
			}
		}
		*p = Progress{Phase: v1alpha1.ErasurePhaseCollect, Stream: e.Set.EventsStream(), Next: 1, Ends: ends}
	}
	if !j.collected {
		if j.recollect == nil {
			// Its own ends: entering a reader's streams must not change the job's.
			j.recollect = &Progress{Phase: v1alpha1.ErasurePhaseCollect, Stream: e.Set.EventsStream(), Next: 1, Ends: maps.Clone(p.Ends)}
		}
		done, err := e.advance(ctx, j, j.recollect, &limit, &step, true)
		if err != nil || !done {
			return step, err
		}
		j.collected, j.recollect = true, nil
	}
	_, err := e.advance(ctx, j, p, &limit, &step, false)
	return step, err
}

// advance moves cursor c through its streams and phases until limit is used, a wait begins,
// or it is done (collectOnly: once Collect is done). It reports whether it got there.
func (e *Engine) advance(ctx context.Context, j *Job, c *Progress, limit *int, step *Step, collectOnly bool) (bool, error) {
	phases := e.phases()
	for *limit > 0 {
		i, err := e.locate(phases, c)
		if err != nil {
			return false, err
		}
		ph := phases[i]
		settle := ph.name == v1alpha1.ErasurePhaseSettle
		if settle && e.now().Before(c.SettleAfter) {
			step.WaitUntil, step.WaitReason = c.SettleAfter, v1alpha1.ReasonErasing
			step.WaitMessage = "waiting until the attempts in flight when the deletions began can no longer write anything, then reading what they wrote"
			return false, nil
		}
		if err := e.ensureEnds(ctx, c); err != nil {
			return false, err
		}
		end := c.Ends[c.Stream]
		if settle {
			info, err := e.streamInfo(ctx, c.Stream)
			if err != nil {
				return false, err
			}
			if info != nil {
				end = info.State.LastSeq + 1
			}
			c.Next = max(c.Next, c.Ends[c.Stream])
		}
		if c.Next < end {
			n, wait, err := e.read(ctx, j, c, end, min(*limit, batch), step)
			*limit -= max(n, 1)
			if err != nil || wait {
				return false, err
			}
			continue
		}
		if settle {
			c.Ends[c.Stream] = end
		}
		if k := slices.Index(ph.streams, c.Stream); k+1 < len(ph.streams) {
			c.Stream, c.Next = ph.streams[k+1], 0
			continue
		}
		switch {
		case collectOnly:
			return true, nil
		case settle && c.SettleErased > 0:
			// What the erased attempts wrote was erased: read again after another wait.
			c.Stream, c.Next, c.SettleErased = ph.streams[0], 0, 0
			c.SettleAfter = e.now().Add(e.SettleWait)
			continue
		case i+1 == len(phases):
			step.Done = true
			return true, nil
		}
		next := phases[i+1]
		if next.name == v1alpha1.ErasurePhaseSettle {
			wait := e.SettleWait
			if e.Idle != nil {
				idle, err := e.Idle(ctx, next.set)
				if err != nil {
					return false, err
				}
				if idle {
					wait = 0
				}
			}
			c.SettleAfter, c.SettleErased = e.now().Add(wait), 0
		}
		c.Phase, c.Stream, c.Next = next.name, next.streams[0], 0
	}
	return false, nil
}

// streamInfo is what the stream says now; nil for a reader's stream that does not exist (a
// reader whose streams are not created yet holds no copy).
func (e *Engine) streamInfo(ctx context.Context, name string) (*jetstream.StreamInfo, error) {
	s, err := e.JS.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) && e.on(name) != e {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	return s.CachedInfo(), nil
}

// read handles up to n messages of c's stream from its cursor, below end. It returns how
// many it read and whether the job must wait (the fold has not counted a log record yet).
func (e *Engine) read(ctx context.Context, j *Job, c *Progress, end uint64, n int, step *Step) (int, bool, error) {
	st, err := streamread.Open(ctx, e.JS.Conn(), e.JS, c.Stream)
	if err != nil {
		return 0, false, err
	}
	st.MaxBytes = 8 << 20
	msgs, err := st.Forward(ctx, ">", max(c.Next, 1), n)
	if err != nil {
		return 0, false, err
	}
	for i := range msgs {
		m := &msgs[i]
		if m.Seq >= end {
			c.Next = end
			return i, false, nil
		}
		erased, wait, err := e.handle(ctx, j, c.Phase, c.Stream, m, step)
		if err != nil {
			return i, false, err
		}
		if wait != "" {
			step.WaitUntil, step.WaitReason = e.now().Add(time.Second), v1alpha1.ReasonWaitingForFold
			step.WaitMessage = fmt.Sprintf("the delivery-log record at sequence %d of %s is kept until the health counts of endpoint %s include it (its dispatcher folds the log), so that erasing its payload changes no count",
				m.Seq, c.Stream, wait)
			return i, true, nil
		}
		if c.Phase == v1alpha1.ErasurePhaseSettle {
			c.SettleErased += int64(erased)
		}
		c.Next = m.Seq + 1
	}
	if len(msgs) == 0 {
		c.Next = end // nothing more is stored below end
	}
	return len(msgs), false, nil
}

// handle does the phase's work on one message: it returns how much it erased, or the
// endpoint to wait for when a log record cannot be rewritten yet.
func (e *Engine) handle(ctx context.Context, j *Job, phase, stream string, m *streamread.Msg, step *Step) (int, string, error) {
	// The records of stream's namespace (the erased one's or a reader's) that are of an event
	// of the erased namespace: a record's event came from its eventNamespace, or else from the
	// namespace of its stream.
	origin := e.Set.Namespace()
	e = e.on(stream)
	s := e.Set
	if stream == s.AttemptsStream() {
		if phase != v1alpha1.ErasurePhaseDeliveryLog && phase != v1alpha1.ErasurePhaseSettle {
			return 0, "", nil
		}
		n, wait, err := e.StripLog(ctx, m, func(rec *records.LogRecord) bool {
			if cmp.Or(rec.EventNamespace, s.Namespace()) != origin {
				return false
			}
			return j.IDs[rec.EventID] || j.Sel.decidable() && j.Sel.byIDAndType(rec.EventID, rec.EventType)
		}, records.PayloadErased)
		step.Counts.LogRecords += int64(n)
		return n, wait, err
	}
	ev, withBody, ok := eventOf(s, stream, m)
	if !ok || ev.Namespace != origin {
		return 0, "", nil
	}
	matched, unevaluated, err := j.Sel.Match(ctx, ev, withBody)
	if err != nil {
		if ctx.Err() != nil {
			return 0, "", ctx.Err()
		}
		return 0, "", &ExpressionLimitError{EventID: ev.ID, Stream: stream, Seq: m.Seq, Err: err}
	}
	if phase == v1alpha1.ErasurePhaseCollect {
		if unevaluated {
			step.Counts.Unevaluated++
		}
		if matched && !j.IDs[ev.ID] {
			if len(j.IDs) >= MaxMatchedEvents {
				return 0, "", ErrTooManyEvents
			}
			j.IDs[ev.ID] = true
		}
		return 0, "", nil
	}
	if !matched && !j.IDs[ev.ID] {
		return 0, "", nil
	}
	if phase == v1alpha1.ErasurePhaseSettle && !j.IDs[ev.ID] && len(j.IDs) < MaxMatchedEvents {
		j.IDs[ev.ID] = true // its log records, written later, are erased too
	}
	switch {
	case stream == s.DeadLetterStream() && (phase == v1alpha1.ErasurePhaseDeadLetters || phase == v1alpha1.ErasurePhaseSettle):
		done, err := e.StripDeadLetter(ctx, m, records.PayloadErased)
		if !done || err != nil {
			return 0, "", err
		}
		step.Counts.DeadLetters++
	case stream == s.DeliveriesStream() && (phase == v1alpha1.ErasurePhaseDeliveries || phase == v1alpha1.ErasurePhaseSettle):
		if err := e.Delete(ctx, stream, m.Seq); err != nil {
			return 0, "", err
		}
		step.Counts.Deliveries++
	case stream == s.EventsStream() && phase == v1alpha1.ErasurePhaseEvents:
		if err := e.Delete(ctx, stream, m.Seq); err != nil {
			return 0, "", err
		}
		step.Counts.Events++
	default:
		return 0, "", nil
	}
	return 1, "", nil
}

// eventOf is the event a stored message of the events, deliveries or dead-letter stream
// carries; withBody is false for a dead letter that no longer has it.
func eventOf(s streams.Set, stream string, m *streamread.Msg) (ev *expr.Event, withBody, ok bool) {
	switch stream {
	case s.EventsStream():
		typ, ok := s.EventType(m.Subject)
		if !ok {
			return nil, false, false
		}
		return &expr.Event{ID: records.EventID(stream, m.Seq, m.Header), Type: typ, Namespace: s.Namespace(),
			Time: records.EventTime(m.Header, m.Time), Headers: m.Header, Data: m.Data}, true, true
	case s.DeliveriesStream():
		meta := records.ParseDeliveryMeta(m.Header)
		if meta.EventID == "" {
			return nil, false, false
		}
		if meta.EventTime.IsZero() {
			meta.EventTime = m.Time
		}
		meta.Namespace = s.Namespace()
		return expr.DeliveryEvent(meta, records.EventHeaders(m.Header), m.Data), true, true // of meta.Origin()
	case s.DeadLetterStream():
		dl, err := records.ParseDeadLetter(m.Header)
		if err != nil || dl.EventID == "" {
			return nil, false, false
		}
		return &expr.Event{ID: dl.EventID, Type: dl.EventType, Namespace: cmp.Or(dl.EventNamespace, s.Namespace()), Time: dl.EventTime, Headers: dl.Headers, Data: m.Data},
			records.DeadLetterHasPayload(m.Header), true
	}
	return nil, false, false
}

// Delete erases the message at seq of stream (a secure delete: overwritten on disk). A
// message already gone is no error.
func (e *Engine) Delete(ctx context.Context, stream string, seq uint64) error {
	s, err := e.JS.Stream(ctx, stream)
	if err != nil {
		return err
	}
	if err := s.SecureDeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && !isMsgGone(err) {
		return fmt.Errorf("deleting message %d of %s: %w", seq, stream, err)
	}
	return nil
}

func isMsgGone(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound || strings.Contains(apiErr.Description, "not found"))
}

// StripLog replaces the delivery-log message m (of the namespace's attempts stream) with one
// whose records remove selects have no payload, once the health counts include it: it
// returns how many records lost their payload, or the endpoint whose counts do not include m
// yet (nothing is changed then).
func (e *Engine) StripLog(ctx context.Context, m *streamread.Msg, remove func(*records.LogRecord) bool, why string) (int, string, error) {
	stream := e.Set.AttemptsStream()
	msg, n := records.RewriteLog(stream, m.Seq, m.Subject, m.Data, remove, why)
	if msg == nil {
		return 0, "", nil
	}
	if !records.IsRewrite(m.Header) {
		// A replacement was never counted: only an original must wait for the fold.
		for _, rec := range records.LogRecords(m.Data) {
			folded, counted, err := e.Folded(ctx, rec.Endpoint)
			if err != nil {
				return 0, "", err
			}
			if counted && folded < m.Seq {
				return 0, rec.Endpoint, nil
			}
		}
	}
	if err := e.replace(ctx, stream, m.Seq, msg); err != nil {
		return 0, "", err
	}
	return n, "", nil
}

// StripDeadLetter replaces the dead letter m with its record without the payload; false when
// it had none left.
func (e *Engine) StripDeadLetter(ctx context.Context, m *streamread.Msg, why string) (bool, error) {
	if !records.DeadLetterHasPayload(m.Header) {
		return false, nil
	}
	stream := e.Set.DeadLetterStream()
	msg, err := records.RewriteDeadLetter(stream, m.Seq, m.Subject, m.Header, why, e.now())
	if err != nil {
		// A dead letter whose record cannot be read has nothing to keep: erase it whole.
		return true, e.Delete(ctx, stream, m.Seq)
	}
	return true, e.replace(ctx, stream, m.Seq, msg)
}

// replace publishes msg in place of the message at seq of stream, then deletes that one. A
// stream that refuses the publish for want of room (a full dead-letter stream) gets the
// deletion first: the replacement is smaller than what it replaces.
func (e *Engine) replace(ctx context.Context, stream string, seq uint64, msg *nats.Msg) error {
	_, err := e.JS.PublishMsg(ctx, msg, jetstream.WithExpectStream(stream))
	if err != nil && isFull(err) {
		if err := e.Delete(ctx, stream, seq); err != nil {
			return err
		}
		_, err = e.JS.PublishMsg(ctx, msg, jetstream.WithExpectStream(stream))
	}
	if err != nil {
		return fmt.Errorf("writing the record of message %d of %s without its payload: %w", seq, stream, err)
	}
	return e.Delete(ctx, stream, seq)
}

// isFull reports whether a publish was refused because the stream is at its bound.
func isFull(err error) bool {
	return strings.Contains(err.Error(), "maximum bytes exceeded") || strings.Contains(err.Error(), "maximum messages exceeded")
}
