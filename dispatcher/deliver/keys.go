package deliver

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
)

// keyQueues serialises deliveries per ordering key: while a key has a delivery in flight or
// retrying, later deliveries of that key wait here, in arrival order; other keys flow. The map
// is made by the first enqueue (most endpoints are not PerKey).
type keyQueues struct {
	mu   sync.Mutex
	busy map[string][]jetstream.Msg
}

// enqueue returns true when the key was idle and msg should run now.
func (k *keyQueues) enqueue(key string, msg jetstream.Msg) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if q, ok := k.busy[key]; ok {
		k.busy[key] = append(q, msg)
		return false
	}
	if k.busy == nil {
		k.busy = map[string][]jetstream.Msg{}
	}
	k.busy[key] = nil
	return true
}

// next pops the key's next message, or marks the key idle.
func (k *keyQueues) next(key string) (jetstream.Msg, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	q := k.busy[key]
	if len(q) == 0 {
		delete(k.busy, key)
		return nil, false
	}
	m := q[0]
	q[0] = nil
	k.busy[key] = q[1:]
	return m, true
}

// orderingKey extracts a delivery's key from the event's header or JSON body. Deliveries
// without a key are not ordered against anything.
func orderingKey(c *endpoint.Config, msg jetstream.Msg) (string, bool) {
	if c.KeyHeader != "" {
		v := msg.Headers().Get(c.KeyHeader)
		return v, v != ""
	}
	if len(c.KeyJSONPath) == 0 {
		return "", false
	}
	var doc any
	if err := json.Unmarshal(msg.Data(), &doc); err != nil {
		return "", false
	}
	for _, p := range c.KeyJSONPath {
		m, ok := doc.(map[string]any)
		if !ok {
			return "", false
		}
		doc = m[p]
	}
	switch v := doc.(type) {
	case string:
		return v, v != ""
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case bool:
		return strconv.FormatBool(v), true
	}
	return "", false
}

// enqueueKeyed starts msg now or queues it behind its key; size is what it holds of the byte
// budget. Each message leaves through settled, as every message take started does.
func (w *Worker) enqueueKeyed(ctx context.Context, msg jetstream.Msg, size int64) {
	c := w.cfg.Load()
	key, ok := orderingKey(c, msg)
	if !ok {
		w.inflight.Add(1)
		w.f.Runners.Go(func() {
			defer w.inflight.Done()
			defer w.settled(size)
			w.runMsg(ctx, msg)
		})
		return
	}
	if !w.keys.enqueue(key, msg) {
		return
	}
	w.inflight.Add(1)
	w.f.Runners.Go(func() {
		defer w.inflight.Done()
		for m, n := msg, size; m != nil; {
			w.runMsg(ctx, m)
			w.settled(n)
			next, ok := w.keys.next(key)
			if !ok {
				return
			}
			m, n = next, msgSize(next)
		}
	})
}
