package controllers

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Reconciles of one namespace that need its streams at once ask the broker once: the others
// wait for that call, and share its failure or look again after its success. Before, each of
// sixteen reconciles of a thousand endpoints applied at once created or updated the same
// streams of its namespace (make bench's scale-endpoints: 15 of 16 reconcile workers in
// CreateOrUpdateStream).
func TestConcurrentEnsuresOfANamespaceAskTheBrokerOnce(t *testing.T) {
	j := &JetStream{made: map[madeKey]time.Time{}, making: map[madeKey]*making{}}
	var calls atomic.Int32
	fail := errors.New("the meta leader did not answer")
	run := func(n int, err error) []error {
		errs := make([]error, n)
		release := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				errs[i] = j.ensureOnce(madeSet, "shop", 0, func() error {
					calls.Add(1)
					<-release
					return err
				})
			})
		}
		for calls.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // the others are waiting, or would have called
		close(release)
		wg.Wait()
		return errs
	}
	for i, err := range run(8, fail) {
		if !errors.Is(err, fail) {
			t.Errorf("caller %d of a failing ensure: %v, want the failure", i, err)
		}
	}
	if n := calls.Swap(0); n != 1 {
		t.Errorf("8 concurrent callers called the broker %d times, want once", n)
	}
	for i, err := range run(8, nil) {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	if n := calls.Swap(0); n != 1 {
		t.Errorf("after a failure, 8 concurrent callers called the broker %d times, want once again", n)
	}
	if err := j.ensureOnce(madeSet, "shop", 0, func() error { calls.Add(1); return nil }); err != nil || calls.Load() != 0 {
		t.Errorf("once made sure of: %v, %d calls; want none", err, calls.Load())
	}
}
