package deliver

import (
	"context"
	"sync"
)

// Budget bounds the bytes of messages a dispatcher holds in memory at once: pulled and not
// yet settled, queued behind a PerKey key, waiting for a token or a held retry, or routed and
// not yet written. Taking more than is left waits (back-pressure: nothing more is pulled), so
// a flood of large events slows the dispatcher down instead of getting it OOM-killed.
//
// One message larger than the whole budget is admitted when nothing else is held, so it can
// still be delivered (or dead-lettered).
type Budget struct {
	mu       sync.Mutex
	cond     *sync.Cond
	limit    int64
	held     int64
	onChange func(held int64)
}

// NewBudget returns a budget of limit bytes (<= 0: unlimited). onChange, when not nil, is
// called with the bytes held after every change (for a gauge).
func NewBudget(limit int64, onChange func(held int64)) *Budget {
	b := &Budget{limit: limit, onChange: onChange}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// Acquire takes n bytes, waiting while they do not fit; false when ctx ended first.
func (b *Budget) Acquire(ctx context.Context, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fits(n) {
		b.take(n)
		return true
	}
	stop := context.AfterFunc(ctx, func() { b.mu.Lock(); b.cond.Broadcast(); b.mu.Unlock() })
	defer stop()
	for !b.fits(n) {
		if ctx.Err() != nil {
			return false
		}
		b.cond.Wait()
	}
	b.take(n)
	return true
}

// Force takes n bytes at once, fitting or not: for what arrived already and is bounded
// otherwise (the shared lane's windows), so that it counts against what is pulled next.
func (b *Budget) Force(n int64) {
	b.mu.Lock()
	b.take(n)
	b.mu.Unlock()
}

// take adds n to what is held (locked).
func (b *Budget) take(n int64) {
	b.held += n
	if b.onChange != nil {
		b.onChange(b.held)
	}
}

func (b *Budget) fits(n int64) bool {
	return b.limit <= 0 || b.held+n <= b.limit || b.held == 0
}

// Release gives n bytes back.
func (b *Budget) Release(n int64) {
	b.mu.Lock()
	b.take(-n)
	b.mu.Unlock()
	b.cond.Broadcast()
}

// Held is how many bytes are taken now.
func (b *Budget) Held() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// Limit is the budget's size (<= 0: unlimited).
func (b *Budget) Limit() int64 { return b.limit }
