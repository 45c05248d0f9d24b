package testenv

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"testing"
	"time"
)

// Condition is what Poll and Eventually wait for: a func() bool that reports whether it
// holds, or a func() error that returns nil once it holds (its last error says why not).
type Condition interface {
	func() bool | func() error
}

// Poll bounds for the wait between two calls of a condition: as long as the last call took,
// within these, so a cheap check is seen at once and a slow one (a kubectl command, a stream
// read) keeps at most half a core busy.
const (
	minPollInterval = 20 * time.Millisecond
	maxPollInterval = time.Second
)

// stopError ends a Poll at once.
type stopError struct{ error }

func (e stopError) Unwrap() error { return e.error }

// Stop wraps err so that the Poll (or Eventually) calling the condition ends at once with it:
// for what waiting cannot fix, such as a process that exited.
func Stop(err error) error { return stopError{err} }

// Poll calls cond until it holds, returns an error made by Stop, or timeout passes. It
// returns nil once cond holds, the error given to Stop, or on timeout the last error (or
// "not met" for a func() bool) with the time waited. It never fails a test, so it can run
// outside a test's goroutine.
func Poll[C Condition](timeout time.Duration, cond C) error {
	check := asCheck(cond)
	deadline := time.Now().Add(timeout)
	for {
		start := time.Now()
		err := check()
		if err == nil {
			return nil
		}
		var stop stopError
		if errors.As(err, &stop) {
			return stop.error
		}
		if time.Now().After(deadline) {
			return &timeoutError{after: timeout, last: err}
		}
		time.Sleep(min(max(time.Since(start), minPollInterval), maxPollInterval, time.Until(deadline)+time.Millisecond))
	}
}

// Eventually polls cond like Poll and fails t (at once) when it does not hold within timeout,
// with format and args describing what was awaited (formatted only then, so they may be
// values that describe the state lazily) and cond's last error. With TESTENV_STACKS set, it
// also prints every goroutine's stack on a timeout.
func Eventually[C Condition](t testing.TB, timeout time.Duration, cond C, format string, args ...any) {
	t.Helper()
	err := Poll(timeout, cond)
	if err == nil {
		return
	}
	if os.Getenv("TESTENV_STACKS") != "" {
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
	}
	var te *timeoutError
	switch {
	case !errors.As(err, &te):
		t.Fatalf("gave up waiting for "+format+": %v", append(args, err)...)
	case format == "":
		t.Fatalf("timed out after %s: %v", te.after, te.last)
	case te.last == errNotMet:
		t.Fatalf("timed out after %s waiting for "+format, append([]any{te.after}, args...)...)
	default:
		t.Fatalf("timed out after %s waiting for "+format+": %v", append(append([]any{te.after}, args...), te.last)...)
	}
}

// timeoutError is a condition that did not hold in time, and its last error.
type timeoutError struct {
	after time.Duration
	last  error
}

func (e *timeoutError) Error() string {
	if e.last == errNotMet {
		return fmt.Sprintf("condition not met after %s", e.after)
	}
	return fmt.Sprintf("after %s: %v", e.after, e.last)
}

func (e *timeoutError) Unwrap() error { return e.last }

// errNotMet is the error of a func() bool condition that does not hold.
var errNotMet = errors.New("not met")

func asCheck[C Condition](cond C) func() error {
	switch f := any(cond).(type) {
	case func() error:
		return f
	case func() bool:
		return func() error {
			if f() {
				return nil
			}
			return errNotMet
		}
	}
	panic("unreachable: Condition has two types")
}
