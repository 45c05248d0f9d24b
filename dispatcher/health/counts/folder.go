package counts

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// FoldTarget is where folded counts go: each endpoint's shared state, which remembers the
// stream sequence it was folded through.
type FoldTarget interface {
	// FoldedThrough is the stream sequence ep's counts include (0: none).
	FoldedThrough(ctx context.Context, ep string) (uint64, error)
	// ApplyFold adds d to ep's counts by compare-and-set, and records d.Through. It returns
	// ErrFoldOverlap when ep's counts already include part of d (another replica folded
	// meanwhile).
	ApplyFold(ctx context.Context, ep string, d *Delta) error
}

// ErrFoldOverlap says counts already include part of a delta: the fold starts again from
// its checkpoint.
var ErrFoldOverlap = errors.New("the counts already include part of this fold")

// Folder folds a namespace's delivery log into the health counts of the endpoints a
// dispatcher serves. Only the holder of partition 0 runs it. It reads the attempts stream by sequence
// from its checkpoint (in the bucket), adds every record to its endpoint's delta, and every
// Interval applies the deltas, then moves the checkpoint. A crash between the two is
// harmless: each endpoint's counts say which sequence they include, and records up to it are
// passed over when the fold resumes. So counts are exact whatever stops when.
//
// An endpoint this dispatcher does not serve yet (a replica that knew it sooner delivered its
// first events and logged them before this one resolved it) has its records passed over and
// remembered from the first (unserved), then read again once it is served; the checkpoint
// stays before them meanwhile, so a restart reads them again too. Those of an endpoint served
// elsewhere (Elsewhere) are passed over for good, as are those of one not served within
// unservedKeep (deleted).
//
// It reads by direct gets (batches from a sequence), never through a consumer of its own: a
// tenant's bus identity may create none (a push consumer's deliver subject could name any
// subject), and a read by sequence resumes exactly where the checkpoint says.
type Folder struct {
	JS jetstream.JetStream
	// Stream is the attempts stream; Filter the subject of the records folded here.
	Stream, Filter string
	KV             jetstream.KeyValue
	// CheckpointKey holds the last stream sequence whose records are all applied.
	CheckpointKey string
	// Serves says whether this dispatcher counts an endpoint's records.
	Serves func(ep string) bool
	// Elsewhere, when set, says an endpoint is served by another dispatcher (a dedicated one):
	// its records are not this one's to count, now or later.
	Elsewhere func(ep string) bool
	// Subject, when set, is the subject of an endpoint's records: the records of an endpoint
	// not served yet are read again on it once it is (nil: they are passed over).
	Subject func(ep string) string
	Target  FoldTarget
	// Interval between applications (default 1s).
	Interval time.Duration
	Log      logr.Logger
}

// Run folds until ctx ends; it returns an error to be retried after a pause.
func (f *Folder) Run(ctx context.Context) error {
	interval := f.Interval
	if interval <= 0 {
		interval = time.Second
	}
	through, err := f.checkpoint(ctx)
	if err != nil {
		return err
	}
	st, err := streamread.Open(ctx, f.JS.Conn(), f.JS, f.Stream)
	if err != nil {
		return err
	}
	folded := map[string]uint64{} // what each endpoint's counts include, read once per pass
	var readErr error
	pending := Pending{}
	unserved := map[string]unservedFrom{}
	counted := func(ep string, seq uint64) bool {
		if readErr != nil {
			return false
		}
		at, ok := folded[ep]
		if !ok {
			if at, readErr = f.Target.FoldedThrough(ctx, ep); readErr != nil {
				return false
			}
			folded[ep] = at
		}
		return seq > at
	}
	serves := func(ep string, seq uint64) bool {
		if readErr != nil {
			return false
		}
		if !f.Serves(ep) {
			f.passOver(unserved, ep, seq)
			return false
		}
		if u, ok := unserved[ep]; ok {
			delete(unserved, ep)
			readErr = f.readAgain(ctx, st, ep, u.seq, seq-1, pending, counted)
		}
		return counted(ep, seq)
	}
	// A log message stored twice under one message id (the stream's leader died after
	// replicating a write whose acknowledgement was lost; the write again reached a new leader
	// that had not applied it yet, so de-duplication missed it) is counted once: the ids of
	// the recent messages are remembered, those before the checkpoint included.
	seen := newRecentIDs(foldRecentIDs)
	if err := f.prime(ctx, st, through, seen); err != nil {
		return err
	}
	last := through
	applyAt := time.Now().Add(interval)
	poll := foldPoll
	for ctx.Err() == nil {
		msgs, err := st.Forward(ctx, f.Filter, last+1, foldBatch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, m := range msgs {
			last = m.Seq
			if records.IsRewrite(m.Header) {
				// A record kept without its payload: its original was counted.
				continue
			}
			if !seen.add(m.Header.Get(records.HeaderMsgID)) {
				f.Log.V(1).Info("a delivery-log message stored twice is counted once", "seq", m.Seq, "msgID", m.Header.Get(records.HeaderMsgID))
				continue
			}
			for _, o := range outcomesOf(m) {
				pending.AddIf(m.Seq, o, serves)
			}
		}
		if readErr != nil {
			return readErr
		}
		if len(msgs) == 0 {
			poll = min(poll*2, foldIdlePoll)
		} else {
			poll = foldPoll
		}
		if len(msgs) < foldBatch {
			// Caught up: wait for more records, or for the next application of what is pending.
			d := poll
			if len(pending) > 0 || len(unserved) > 0 {
				d = min(time.Until(applyAt), poll)
			}
			wait(ctx, d)
		}
		if time.Now().Before(applyAt) {
			continue
		}
		applyAt = time.Now().Add(interval)
		// Endpoints served since their records were passed over, and no record of theirs came
		// since: read again now.
		for ep, u := range unserved {
			switch {
			case f.Serves(ep):
				delete(unserved, ep)
				if err := f.readAgain(ctx, st, ep, u.seq, last, pending, counted); err != nil {
					return err
				}
			case time.Since(u.at) > unservedKeep:
				delete(unserved, ep)
			}
		}
		if err := f.apply(ctx, pending, folded); err != nil {
			return err
		}
		pending = Pending{}
		// The checkpoint stays before the records of endpoints not served yet.
		keep := last
		for _, u := range unserved {
			keep = min(keep, u.seq-1)
		}
		if keep > through {
			if _, err := f.KV.Put(ctx, f.CheckpointKey, []byte(strconv.FormatUint(keep, 10))); err != nil {
				return err
			}
			through = keep
		}
	}
	return nil
}

// unservedFrom is the first record (stream sequence) of an endpoint not served, and when it was
// passed over.
type unservedFrom struct {
	seq uint64
	at  time.Time
}

// unservedKeep is how long records of an endpoint not served are kept to be read again once it
// is: far more than a replica takes to learn of a new endpoint; an endpoint deleted meanwhile is
// never served. maxUnserved bounds how many endpoints are remembered.
const (
	unservedKeep = 10 * time.Minute
	maxUnserved  = 4096
)

// passOver remembers that a record of endpoint ep, which this dispatcher does not serve, was
// passed over at seq (the first one only), unless ep is served elsewhere.
func (f *Folder) passOver(unserved map[string]unservedFrom, ep string, seq uint64) {
	if f.Subject == nil || f.Elsewhere != nil && f.Elsewhere(ep) {
		return
	}
	if _, ok := unserved[ep]; !ok && len(unserved) < maxUnserved {
		unserved[ep] = unservedFrom{seq: seq, at: time.Now()}
	}
}

// readAgain folds the records of endpoint ep from stream sequence from through to (passed
// over while ep was not served) into pending, as counted says. A message stored twice among
// them is counted once (within the fold's bound of recent ids).
func (f *Folder) readAgain(ctx context.Context, st *streamread.Stream, ep string, from, to uint64, pending Pending, counted func(string, uint64) bool) error {
	seen := newRecentIDs(foldRecentIDs)
	for from <= to {
		msgs, err := st.Forward(ctx, f.Subject(ep), from, foldBatch)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Seq > to {
				return nil
			}
			from = m.Seq + 1
			if records.IsRewrite(m.Header) || !seen.add(m.Header.Get(records.HeaderMsgID)) {
				continue
			}
			for _, o := range outcomesOf(m) {
				if o.Endpoint == ep {
					pending.AddIf(m.Seq, o, counted)
				}
			}
		}
		if len(msgs) < foldBatch {
			return nil
		}
	}
	return nil
}

// outcomesOf reads the outcomes of a delivery-log message: every record carries its outcome in
// a header (records.ReadOutcomes); one written before outcomes had their header is read whole.
func outcomesOf(m streamread.Msg) []records.Outcome {
	outcomes := records.ReadOutcomes(m.Header)
	if outcomes == nil {
		for _, rec := range records.LogRecords(m.Data) {
			outcomes = append(outcomes, records.OutcomeOf(&rec))
		}
	}
	return outcomes
}

// prime remembers the message ids of the log messages up to through (the checkpoint) that a
// message stored twice after it could repeat.
func (f *Folder) prime(ctx context.Context, st *streamread.Stream, through uint64, seen *recentIDs) error {
	from := uint64(1)
	if through > foldRecentIDs {
		from = through - foldRecentIDs + 1
	}
	for from <= through {
		msgs, err := st.Forward(ctx, f.Filter, from, foldBatch)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Seq > through {
				return nil
			}
			if !records.IsRewrite(m.Header) {
				seen.add(m.Header.Get(records.HeaderMsgID))
			}
			from = m.Seq + 1
		}
		if len(msgs) < foldBatch {
			return nil
		}
	}
	return nil
}

// foldRecentIDs is how many log messages' ids the fold remembers, and how many sequences
// before its checkpoint it reads again when it starts: far more than the messages written
// while one write is retried (15s at most, see the dispatcher's log writer).
const foldRecentIDs = 1 << 15

// recentIDs are the last message ids added, at most n. They grow with what is added: a
// dispatcher whose endpoints log little keeps little (made at n, it kept about 2 MiB).
type recentIDs struct {
	set  map[string]struct{}
	ring []string
	at   int
	n    int
}

func newRecentIDs(n int) *recentIDs {
	return &recentIDs{set: map[string]struct{}{}, n: max(n, 1)}
}

// add remembers id and says whether it is new; an empty id (a message written without one)
// is always new.
func (r *recentIDs) add(id string) bool {
	if id == "" {
		return true
	}
	if _, ok := r.set[id]; ok {
		return false
	}
	if len(r.ring) < r.n {
		r.ring = append(r.ring, id)
	} else {
		delete(r.set, r.ring[r.at])
		r.ring[r.at] = id
		r.at = (r.at + 1) % r.n
	}
	r.set[id] = struct{}{}
	return true
}

// foldBatch is how many records one read returns at most; foldPoll how long a fold that
// caught up waits before it reads again, doubling to foldIdlePoll while reads find nothing (an
// idle namespace's log is read every 2 s, not 4 times a second).
const (
	foldBatch    = 1000
	foldPoll     = 250 * time.Millisecond
	foldIdlePoll = 2 * time.Second
)

// wait waits d, or until ctx ends.
func wait(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// apply writes every delta; on any failure the fold starts again from its checkpoint.
func (f *Folder) apply(ctx context.Context, pending Pending, folded map[string]uint64) error {
	for ep, d := range pending {
		if err := f.Target.ApplyFold(ctx, ep, d); err != nil {
			return err
		}
		folded[ep] = d.Through
	}
	return nil
}

func (f *Folder) checkpoint(ctx context.Context) (uint64, error) {
	e, err := f.KV.Get(ctx, f.CheckpointKey)
	if streams.IsNotFound(err) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, _ := strconv.ParseUint(string(e.Value()), 10, 64)
	return n, nil
}
