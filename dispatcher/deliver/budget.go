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
//
// A budget may draw from a larger one (Share): a shared dispatcher's process-wide budget,
// shared by the namespaces it serves, each within its own.
type Budget struct {
	// mu and cond are shared with the budget it draws from and that one's other sharers.
	mu       *sync.Mutex
	cond     *sync.Cond
	limit    int64
	held     int64
	parent   *Budget
	onChange func(held int64)
}

// NewBudget returns a budget of limit bytes (<= 0: unlimited). onChange, when not nil, is
// called with the bytes held after every change (for a gauge).
func NewBudget(limit int64, onChange func(held int64)) *Budget {
	mu := &sync.Mutex{}
	return &Budget{mu: mu, cond: sync.NewCond(mu), limit: limit, onChange: onChange}
}

// Share returns a budget of limit bytes that also draws from b: what it takes counts against
// both, and waits while either is spent. While it holds nothing it may take one message even
// when b is spent, so that every sharer makes progress however busy the others are: b is
// exceeded by at most one message a sharer.
func (b *Budget) Share(limit int64, onChange func(held int64)) *Budget {
	return &Budget{mu: b.mu, cond: b.cond, limit: limit, parent: b, onChange: onChange}
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

// take adds n to what is held, and to what it draws from (locked).
func (b *Budget) take(n int64) {
	b.held += n
	if b.onChange != nil {
		b.onChange(b.held)
	}
	if b.parent != nil {
		b.parent.take(n)
	}
}

func (b *Budget) fits(n int64) bool {
	if b.held == 0 {
		return true
	}
	return (b.limit <= 0 || b.held+n <= b.limit) && (b.parent == nil || b.parent.fits(n))
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
