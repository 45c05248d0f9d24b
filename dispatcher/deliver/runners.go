package deliver

import (
	"time"
)

// Runners run deliveries on goroutines that outlive one delivery. A goroutine per message
// would start with a small stack and grow it (copying) on every delivery, since sending a
// request is deep; under load that was several percent of the dispatcher's CPU. A runner
// waits runnerIdle for more work before it exits, so an idle dispatcher keeps none.
type Runners struct {
	work chan func()
	idle time.Duration
}

const runnerIdle = 5 * time.Second

// NewRunners returns an empty pool.
func NewRunners() *Runners {
	return &Runners{work: make(chan func()), idle: runnerIdle}
}

// Go runs f on an idle runner, or on a new one when none is waiting. It never blocks.
func (r *Runners) Go(f func()) {
	select {
	case r.work <- f:
	default:
		go r.loop(f)
	}
}

func (r *Runners) loop(f func()) {
	f()
	t := time.NewTimer(r.idle)
	defer t.Stop()
	for {
		select {
		case f = <-r.work:
			f()
			t.Reset(r.idle)
		case <-t.C:
			return
		}
	}
}
