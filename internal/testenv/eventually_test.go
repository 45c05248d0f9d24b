package testenv

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	n := 0
	if err := Poll(10*time.Second, func() bool { n++; return n == 3 }); err != nil || n != 3 {
		t.Errorf("a condition that holds on the third call: %v after %d calls", err, n)
	}

	err := Poll(50*time.Millisecond, func() error { return errors.New("still 2 of 3") })
	if err == nil || !strings.Contains(err.Error(), "after 50ms: still 2 of 3") {
		t.Errorf("a timeout names the wait and the last error: %v", err)
	}
	if err := Poll(50*time.Millisecond, func() bool { return false }); err == nil || err.Error() != "condition not met after 50ms" {
		t.Errorf("a func() bool timeout: %v", err)
	}

	exited := errors.New("the process exited")
	n = 0
	err = Poll(time.Minute, func() error { n++; return Stop(exited) })
	if err != exited || n != 1 {
		t.Errorf("Stop ends the wait at once with its error: %v after %d calls", err, n)
	}
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	start := time.Now()
	Eventually(t, 10*time.Second, func() bool { return time.Since(start) > 30*time.Millisecond }, "30ms to pass")
	Eventually(t, 10*time.Second, func() error { return nil }, "")
}
