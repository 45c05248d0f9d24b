package deliver

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBudgetNeverHoldsMoreThanItsLimit(t *testing.T) {
	b := NewBudget(10, nil)
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := int64(1 + i%4)
			if !b.Acquire(context.Background(), n) {
				t.Error("acquire failed without a cancel")
				return
			}
			h := held.Add(n)
			for {
				p := peak.Load()
				if h <= p || peak.CompareAndSwap(p, h) {
					break
				}
			}
			held.Add(-n)
			b.Release(n)
		}()
	}
	wg.Wait()
	if peak.Load() > 10 {
		t.Errorf("held %d bytes at once with a budget of 10", peak.Load())
	}
	if b.Held() != 0 {
		t.Errorf("%d bytes still held", b.Held())
	}
}

func TestBudgetAdmitsOneOversizedMessageAlone(t *testing.T) {
	b := NewBudget(10, nil)
	if !b.Acquire(context.Background(), 100) {
		t.Fatal("an oversized message is never admitted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if b.Acquire(ctx, 1) {
		t.Fatal("admitted more while over the budget")
	}
	b.Release(100)
	if !b.Acquire(context.Background(), 1) {
		t.Fatal("not admitted after the release")
	}
}

func TestBudgetAcquireEndsWithItsContext(t *testing.T) {
	b := NewBudget(1, nil)
	b.Acquire(context.Background(), 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool)
	go func() { done <- b.Acquire(ctx, 1) }()
	cancel()
	if <-done {
		t.Fatal("acquired after the context ended")
	}
}

func TestUnlimitedBudget(t *testing.T) {
	b := NewBudget(0, nil)
	for range 100 {
		if !b.Acquire(context.Background(), 1<<30) {
			t.Fatal("an unlimited budget refused")
		}
	}
}

// Budgets that share a larger one: each stays within its own limit, what they hold together
// within the shared one, except that one holding nothing may always take a message (every
// namespace of a shared dispatcher makes progress however busy the others are); releasing
// wakes a sharer waiting for the shared room.
func TestSharedBudgetsStayWithinTheirsAndThePools(t *testing.T) {
	pool := NewBudget(10, nil)
	busy, quiet := pool.Share(8, nil), pool.Share(8, nil)
	ctx := context.Background()
	if !busy.Acquire(ctx, 8) {
		t.Fatal("acquire failed")
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if busy.Acquire(short, 1) {
		t.Errorf("a sharer took more than its own limit")
	}
	if !quiet.Acquire(ctx, 5) {
		t.Fatal("a sharer holding nothing was refused a message")
	}
	if got := pool.Held(); got != 13 {
		t.Errorf("the pool holds %d, want 13 (8 + one message of 5)", got)
	}
	took := make(chan bool, 1)
	go func() { took <- quiet.Acquire(ctx, 1) }()
	select {
	case <-took:
		t.Fatalf("a sharer took room the pool does not have")
	case <-time.After(50 * time.Millisecond):
	}
	busy.Release(8)
	if !<-took {
		t.Fatal("acquire failed")
	}
	quiet.Release(6)
	if pool.Held() != 0 || busy.Held() != 0 || quiet.Held() != 0 {
		t.Errorf("held after every release: pool %d, busy %d, quiet %d", pool.Held(), busy.Held(), quiet.Held())
	}
}
