package health

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/jsread"
)

// kvOperationHeader marks a key-value delete or purge.
const kvOperationHeader = "KV-Operation"

// watchBatch is how many changes one read of the bucket returns at most.
const watchBatch = 256

// followKeys follows the keys of bucket under keyPrefix until ctx ends or a read fails: it
// reads the bucket's stream from where it left off (direct gets, every poll once caught up)
// rather than watching the bucket, since a watch creates a push consumer, which a tenant's
// bus identity may not (its deliver subject could name anything in the account). change gets
// each change (the key without keyPrefix; deleted for a delete or purge), caughtUp is called
// after every read that reached the end.
func followKeys(ctx context.Context, js jetstream.JetStream, bucket, keyPrefix string, poll time.Duration,
	change func(key string, m jsread.Msg, deleted bool), caughtUp func()) error {
	st, err := jsread.Open(ctx, js.Conn(), js, "KV_"+bucket)
	if err != nil {
		return err
	}
	prefix := "$KV." + bucket + "." + keyPrefix
	next := uint64(1)
	for ctx.Err() == nil {
		msgs, err := st.Forward(ctx, prefix+">", next, watchBatch)
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
		if len(msgs) < watchBatch {
			caughtUp()
			wait(ctx, poll)
		}
	}
	return nil
}
