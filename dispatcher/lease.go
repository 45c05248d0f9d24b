package dispatcher

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// lease elects one replica of a dispatcher through the key-value bucket. The holder runs the
// router (so events are routed in order), the PerKey endpoints (so no two replicas deliver one
// key) and the status writer. Expiry is judged on the server's timestamp of the last renewal.
type lease struct {
	kv       jetstream.KeyValue
	key      string
	identity string
	ttl      time.Duration
	held     atomic.Bool
}

// run keeps trying to hold the lease until ctx ends, calling onChange on every change.
func (l *lease) run(ctx context.Context, onChange func(held bool)) {
	tick := time.NewTicker(l.ttl / 3)
	defer tick.Stop()
	set := func(v bool) {
		if l.held.Swap(v) != v {
			onChange(v)
		}
	}
	for {
		set(l.try(ctx))
		select {
		case <-ctx.Done():
			if l.held.Load() {
				// Hand over at once instead of letting the lease expire.
				dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if e, err := l.kv.Get(dctx, l.key); err == nil && string(e.Value()) == l.identity {
					_ = l.kv.Delete(dctx, l.key, jetstream.LastRevision(e.Revision()))
				}
				cancel()
			}
			set(false)
			return
		case <-tick.C:
		}
	}
}

func (l *lease) try(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, l.ttl/3)
	defer cancel()
	e, err := l.kv.Get(ctx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		_, err := l.kv.Create(ctx, l.key, []byte(l.identity))
		return err == nil
	case err != nil:
		// NATS unreachable: a holder that cannot renew gives up before others may take over.
		return false
	}
	if string(e.Value()) == l.identity || time.Since(e.Created()) > l.ttl {
		_, err := l.kv.Update(ctx, l.key, []byte(l.identity), e.Revision())
		return err == nil
	}
	return false
}
