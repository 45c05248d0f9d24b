// Package follow reads the changes of a key-value bucket's keys without a consumer: the
// bucket's stream from where the last read left off, by direct gets, polled once caught up.
// A watch would create a push consumer, which a tenant's bus identity may not (its deliver
// subject could name anything in the account). The shared state (state.Store.Watch) and the
// partitions' members (leases.Partitions) are followed this way.
package follow

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// kvOperationHeader marks a key-value delete or purge.
const kvOperationHeader = "KV-Operation"

// batch is how many changes one read of the bucket returns at most.
const batch = 256

// idlePoll is how long Keys waits at most between reads that find nothing: the wait doubles
// from poll while nothing changes (an idle namespace's bucket is read every 2 s, not four
// times a second) and is poll again after a change.
const idlePoll = 2 * time.Second

// Keys follows the keys of bucket under keyPrefix until ctx ends or a read fails. change gets
// each change (the key without keyPrefix; deleted for a delete or purge), caughtUp is called
// after every read that reached the end; then Keys waits before it reads again: poll after a
// read that brought a change, up to idlePoll (doubling) while reads bring none.
func Keys(ctx context.Context, js jetstream.JetStream, bucket, keyPrefix string, poll time.Duration,
	change func(key string, m streamread.Msg, deleted bool), caughtUp func()) error {
	st, err := streamread.Open(ctx, js.Conn(), js, streams.BucketStream(bucket))
	if err != nil {
		return err
	}
	prefix := streams.BucketSubjects(bucket) + keyPrefix
	next := uint64(1)
	wait := poll
	for ctx.Err() == nil {
		msgs, err := st.Forward(ctx, prefix+">", next, batch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, m := range msgs {
			next = m.Seq + 1
			change(strings.TrimPrefix(m.Subject, prefix), m, m.Header.Get(kvOperationHeader) != "")
		}
		if len(msgs) > 0 {
			wait = poll
		} else if wait < idlePoll {
			wait = min(2*wait, idlePoll)
		}
		if len(msgs) < batch {
			caughtUp()
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
	return nil
}
