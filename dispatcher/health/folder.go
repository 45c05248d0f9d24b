package health

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
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
// dispatcher serves. Only the holder of partition 0 runs it. It reads the attempts stream from its
// checkpoint (in the bucket) with an ordered consumer, adds every record to its endpoint's
// delta, and every Interval applies the deltas, then moves the checkpoint. A crash between
// the two is harmless: each endpoint's counts say which sequence they include, and records
// up to it are passed over when the fold resumes. So counts are exact whatever stops when.
type Folder struct {
	JS jetstream.JetStream
	// Stream is the attempts stream; Filter the subject of the records folded here.
	Stream, Filter string
	KV             jetstream.KeyValue
	// CheckpointKey holds the last stream sequence whose records are all applied.
	CheckpointKey string
	// Serves says whether this dispatcher counts an endpoint's records.
	Serves func(ep string) bool
	Target FoldTarget
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
	// Headers only: every record carries its outcome in a header (records.ReadOutcome).
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{f.Filter}, DeliverPolicy: jetstream.DeliverAllPolicy, HeadersOnly: true}
	if through > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, through+1
	}
	oc, err := f.JS.OrderedConsumer(ctx, f.Stream, cfg)
	if err != nil {
		return err
	}
	folded := map[string]uint64{} // what each endpoint's counts include, read once per pass
	var readErr error
	serves := func(ep string, seq uint64) bool {
		if !f.Serves(ep) || readErr != nil {
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
	pending := Pending{}
	last := through
	applyAt := time.Now().Add(interval)
	for ctx.Err() == nil {
		batch, err := oc.Fetch(1000, jetstream.FetchMaxWait(min(interval, time.Second)))
		if err != nil {
			return err
		}
		for msg := range batch.Messages() {
			md, err := msg.Metadata()
			if err != nil {
				continue
			}
			seq := md.Sequence.Stream
			last = seq
			outcomes := records.ReadOutcomes(msg.Headers())
			if outcomes == nil {
				// A record written before outcomes had their header: read it whole.
				outcomes = f.readRecords(ctx, seq)
			}
			for _, o := range outcomes {
				pending.AddIf(seq, o, serves)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if readErr != nil {
			return readErr
		}
		if time.Now().Before(applyAt) {
			continue
		}
		applyAt = time.Now().Add(interval)
		if err := f.apply(ctx, pending, folded); err != nil {
			return err
		}
		pending = Pending{}
		if last > through {
			if _, err := f.KV.Put(ctx, f.CheckpointKey, []byte(strconv.FormatUint(last, 10))); err != nil {
				return err
			}
			through = last
		}
	}
	return nil
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

// readRecords reads the outcomes of the records at seq from their JSON.
func (f *Folder) readRecords(ctx context.Context, seq uint64) []records.Outcome {
	st, err := f.JS.Stream(ctx, f.Stream)
	if err != nil {
		return nil
	}
	m, err := st.GetMsg(ctx, seq)
	if err != nil {
		return nil
	}
	var out []records.Outcome
	for _, rec := range records.LogRecords(m.Data) {
		out = append(out, records.OutcomeOf(&rec))
	}
	return out
}
