package deliveries

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Outcome is one outcome logged: a delivery's new state (Entry) and the delivery-log
// sequence a follower resumes after once it handled it (Resume: the message's own sequence
// for its last record, the one before for the others of a message holding several, so a
// follower that stops between them sees the rest again rather than never).
type Outcome struct {
	Entry
	Resume uint64
}

// FollowInterval is how often a follower looks for new outcomes.
const FollowInterval = 200 * time.Millisecond

// followBatch bounds the messages one look reads.
const followBatch = 256

// ErrExpired says a follower asked to resume below what the delivery log still holds.
var ErrExpired = errors.New("the delivery log no longer holds records this old")

// Follow calls emit with every outcome logged in namespace q.Namespace after sequence after
// that q's filters keep (endpoint, state among succeeded, failed and dead_letter, event id and
// type, delivery id), in the order they were logged, until ctx ends or emit or a read fails.
// Between reads it calls idle with the sequence it has read through (for bookmarks).
func (r *Reader) Follow(ctx context.Context, q Query, after uint64, emit func(Outcome) error, idle func(through uint64) error) error {
	if err := streams.ValidateNamespace(q.Namespace); err != nil {
		return fmt.Errorf("%w: %v", ErrBadQuery, err)
	}
	names := r.Streams.For(q.Namespace)
	filter := names.AttemptsSubjects()[0]
	if q.Endpoint != "" {
		filter = names.AttemptSubject(q.Endpoint)
	}
	var st *streamread.Stream
	next := after + 1
	tick := time.NewTicker(FollowInterval)
	defer tick.Stop()
	for {
		if st == nil {
			var err error
			st, err = streamread.Open(ctx, r.NC, r.JS, names.AttemptsStream())
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				st = nil // not made yet: look again later
			} else if err != nil {
				return err
			} else if after > 0 && after+1 < st.FirstSeq {
				return fmt.Errorf("%w (asked after %d, the oldest kept is %d)", ErrExpired, after, st.FirstSeq)
			}
		}
		for st != nil {
			msgs, err := st.Forward(ctx, filter, next, followBatch)
			if err != nil {
				return err
			}
			for i := range msgs {
				m := &msgs[i]
				recs := records.LogRecords(m.Data)
				for j, rec := range recs {
					resume := m.Seq - 1
					if j == len(recs)-1 {
						resume = m.Seq
					}
					if !q.follows(&rec) {
						continue
					}
					e := entryOfRecord(rec, m, false)
					if err := emit(Outcome{Entry: e, Resume: resume}); err != nil {
						return err
					}
				}
				next = m.Seq + 1
			}
			if len(msgs) < followBatch {
				break
			}
		}
		if idle != nil {
			if err := idle(next - 1); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// follows reports whether a logged record passes q's filters, as its delivery's new state.
func (q *Query) follows(rec *records.LogRecord) bool {
	if q.Endpoint != "" && rec.Endpoint != q.Endpoint || !q.keeps(rec.DeliveryID, rec.EventID, rec.EventType) {
		return false
	}
	return q.State == "" || q.State == rec.State
}
