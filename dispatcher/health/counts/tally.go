package counts

import (
	"context"
	"sync"
	"time"
)

// TallyTarget is where a FilterTally adds its counts: each endpoint's shared state.
type TallyTarget interface {
	// AddFiltered adds n to ep's count of events its filter rejected.
	AddFiltered(ctx context.Context, ep string, n int64) error
}

// FilterTally counts the events each endpoint's filter rejects, as this replica's workers find
// them, and adds the counts to the endpoints' shared state (state.State.Filtered) about every second.
// Filtered events leave no record in the delivery log, so this count is not a fold: a crash of
// the replica can lose the last second's count, or repeat it for events filtered again.
type FilterTally struct {
	Target TallyTarget
	// Interval between two flushes (a second when 0).
	Interval time.Duration

	mu     sync.Mutex
	counts map[string]int64
}

// Filtered counts one event endpoint ep's filter rejected.
func (t *FilterTally) Filtered(ep string) {
	t.mu.Lock()
	if t.counts == nil {
		t.counts = map[string]int64{}
	}
	t.counts[ep]++
	t.mu.Unlock()
}

// Run flushes the counts until ctx ends, then once more.
func (t *FilterTally) Run(ctx context.Context) {
	interval := t.Interval
	if interval <= 0 {
		interval = time.Second
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			t.flush(fctx)
			cancel()
			return
		case <-tick.C:
			t.flush(ctx)
		}
	}
}

// flush adds every endpoint's count to its state; a count that could not be added is kept for
// the next flush.
func (t *FilterTally) flush(ctx context.Context) {
	t.mu.Lock()
	counts := t.counts
	t.counts = nil
	t.mu.Unlock()
	for ep, n := range counts {
		if err := t.Target.AddFiltered(ctx, ep, n); err != nil {
			t.mu.Lock()
			if t.counts == nil {
				t.counts = map[string]int64{}
			}
			t.counts[ep] += n
			t.mu.Unlock()
		}
	}
}
