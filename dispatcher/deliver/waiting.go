package deliver

import (
	"context"
	"time"
)

// Views that wait a moment. A worker takes a view of the shared lane only while it has room
// (its share of the endpoint's concurrency, a little more queued: Worker.takesShared). A view
// it has no room for now waits here, in arrival order, behind the worker's other waiting
// views, and is handed to the worker as its views settle: an endpoint that delivers as fast as
// the intake brings its events (a backlog draining, a hot endpoint that keeps up) gets them
// all, without a write. A view that waited shareWait is parked (Intake.park): the endpoint is
// not keeping up, and what it cannot deliver soon costs it storage, not the intake's window
// its neighbours' events come through. A worker that takes nothing now (paused, its circuit
// open, holding back) gets its views parked at once.

// shareWait is how long a view waits for room in its worker before it is parked. It bounds
// how long a slow endpoint's views hold places in the intake's window (intakeWindow) that its
// neighbours' events could use.
const shareWait = 250 * time.Millisecond

// maxWaiting bounds the views one worker has waiting (the intake's window bounds them too).
const maxWaiting = intakeWindow

// waitingViews are one worker's views waiting for room, oldest first.
type waitingViews struct {
	views []*pulled
	since []time.Time
}

// give hands view v to worker w now, lets it wait for room, or parks it.
func (in *Intake) give(w *Worker, v *pulled) {
	if in.stopping.Load() || w.shareCap.Load() == 0 {
		in.park(v)
		return
	}
	in.waitMu.Lock()
	if in.stopping.Load() {
		// Stop hands back what waits (dropWaiting), after it said so.
		in.waitMu.Unlock()
		in.park(v)
		return
	}
	q := in.waiting[w]
	if q == nil && w.takesShared() {
		in.waitMu.Unlock()
		v.handed = true
		w.Pulled(v)
		return
	}
	if q != nil && len(q.views) >= maxWaiting {
		in.waitMu.Unlock()
		in.park(v)
		return
	}
	if q == nil {
		q = &waitingViews{}
		if in.waiting == nil {
			in.waiting = map[*Worker]*waitingViews{}
		}
		in.waiting[w] = q
	}
	q.views = append(q.views, v)
	q.since = append(q.since, time.Now())
	in.waitMu.Unlock()
	// Room may have come meanwhile.
	in.feed(w)
}

// feed hands worker w its waiting views, oldest first, while it has room for them.
func (in *Intake) feed(w *Worker) {
	for {
		in.waitMu.Lock()
		q := in.waiting[w]
		if q == nil || !w.takesShared() {
			in.waitMu.Unlock()
			return
		}
		v := q.views[0]
		q.views[0] = nil
		q.views, q.since = q.views[1:], q.since[1:]
		if len(q.views) == 0 {
			delete(in.waiting, w)
		}
		in.waitMu.Unlock()
		v.handed = true
		w.Pulled(v)
	}
}

// sweepWaiting parks the views that waited shareWait, and those of workers that take nothing
// now, and hands the others to workers that have room.
func (in *Intake) sweepWaiting(now time.Time) {
	in.waitMu.Lock()
	if len(in.waiting) == 0 {
		in.waitMu.Unlock()
		return
	}
	var park []*pulled
	var feed []*Worker
	for w, q := range in.waiting {
		n := len(q.views)
		if w.shareCap.Load() > 0 {
			n = 0
			for n < len(q.views) && now.Sub(q.since[n]) >= shareWait {
				n++
			}
		}
		park = append(park, q.views[:n]...)
		clear(q.views[:n])
		q.views, q.since = q.views[n:], q.since[n:]
		if len(q.views) == 0 {
			delete(in.waiting, w)
		} else {
			feed = append(feed, w)
		}
	}
	in.waitMu.Unlock()
	for _, v := range park {
		in.park(v)
	}
	for _, w := range feed {
		in.feed(w)
	}
}

// watchWaiting sweeps the waiting views until ctx ends.
func (in *Intake) watchWaiting(ctx context.Context) {
	for sleep(ctx, shareWait/5) {
		in.sweepWaiting(time.Now())
	}
}

// dropWaiting hands every waiting view back with its message (the dispatcher stops).
func (in *Intake) dropWaiting() {
	in.waitMu.Lock()
	var views []*pulled
	for w, q := range in.waiting {
		views = append(views, q.views...)
		delete(in.waiting, w)
	}
	in.waitMu.Unlock()
	for _, v := range views {
		v.share.settled(v, true, time.Second)
	}
}
