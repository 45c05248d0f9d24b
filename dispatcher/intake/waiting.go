package intake

import (
	"context"
	"time"
)

// Views that wait a moment. A worker takes a view of the shared lane only while it has room
// (its share of the endpoint's concurrency, a little more queued: Taker.Reserve). A view
// it has no room for now waits here, in arrival order, behind the worker's other waiting
// views, and is handed to the worker as its views settle: an endpoint that delivers as fast as
// the intake brings its events (a backlog draining, a hot endpoint that keeps up) gets them
// all, without a write. A view is parked (Intake.park) once it waited shareWait and
//
//   - its worker took none of its waiting views for shareWait (the endpoint is not keeping up:
//     what it cannot deliver soon costs it storage), or
//   - the views waiting in all workers number waitBudget: the intake pulls no more until
//     fewer wait (refillLocked), and its neighbours' events come through that intake, or
//   - it waited shareWaitMax (how long a message stays unacknowledged for a view is bounded).
//
// A worker that takes nothing now (paused, its circuit open, holding back) gets its views
// parked at once.

// shareWait is how long a view waits for room in a worker that is not draining before it is
// parked; shareWaitMax how long it waits at most, however fast its worker drains.
const (
	shareWait    = 250 * time.Millisecond
	shareWaitMax = 5 * time.Second
)

// waitBudget is how many views may wait, in all workers, before the intake stops pulling. A
// worker takes twice its share of its endpoint's concurrency itself; what waits only has to
// cover the moment a pull takes.
const waitBudget = intakeWindow / 4

// maxWaiting bounds the views one worker has waiting (the intake's window bounds them too).
const maxWaiting = intakeWindow

// waitingViews are one worker's views waiting for room, oldest first.
type waitingViews struct {
	views []*View
	since []time.Time
	// fed is when the worker last took one of them (or when the first began to wait).
	fed time.Time
}

// give hands view v to worker w now, lets it wait for room, or parks it.
func (in *Intake) give(w Taker, v *View) {
	if in.stopping.Load() || w.Share() == 0 {
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
	if q == nil && w.Reserve() {
		in.waitMu.Unlock()
		v.handed = true
		w.Take(v)
		return
	}
	if q != nil && len(q.views) >= maxWaiting {
		in.waitMu.Unlock()
		in.park(v)
		return
	}
	if q == nil {
		q = &waitingViews{fed: time.Now()}
		if in.waiting == nil {
			in.waiting = map[Taker]*waitingViews{}
		}
		in.waiting[w] = q
	}
	q.views = append(q.views, v)
	q.since = append(q.since, time.Now())
	in.waitingN.Add(1)
	in.waitMu.Unlock()
	select {
	case in.began <- struct{}{}:
	default:
	}
	// Room may have come meanwhile.
	in.Feed(w)
}

// Feed hands worker w its waiting views, oldest first, while it has room for them.
func (in *Intake) Feed(w Taker) {
	for {
		in.waitMu.Lock()
		q := in.waiting[w]
		if q == nil || !w.Reserve() {
			in.waitMu.Unlock()
			return
		}
		v := q.views[0]
		q.views[0] = nil
		q.views, q.since = q.views[1:], q.since[1:]
		q.fed = time.Now()
		in.waitingN.Add(-1)
		if len(q.views) == 0 {
			delete(in.waiting, w)
		}
		in.waitMu.Unlock()
		v.handed = true
		w.Take(v)
	}
}

// sweepWaiting parks the views that waited long enough (see above), and those of workers that
// take nothing now, and hands the others to workers that have room.
func (in *Intake) sweepWaiting(now time.Time) {
	in.waitMu.Lock()
	if len(in.waiting) == 0 {
		in.waitMu.Unlock()
		return
	}
	crowded := in.waitingN.Load() >= waitBudget
	var park []*View
	var feed []Taker
	for w, q := range in.waiting {
		n := len(q.views)
		if w.Share() > 0 {
			limit := shareWaitMax
			if crowded || now.Sub(q.fed) >= shareWait {
				limit = shareWait
			}
			n = 0
			for n < len(q.views) && now.Sub(q.since[n]) >= limit {
				n++
			}
		}
		park = append(park, q.views[:n]...)
		in.waitingN.Add(-int64(n))
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
		in.Feed(w)
	}
}

// watchWaiting sweeps the waiting views until ctx ends.
// While no view waits it sleeps until one begins to (an idle dispatcher wakes for nothing).
func (in *Intake) watchWaiting(ctx context.Context) {
	for {
		if in.waitingN.Load() == 0 {
			select {
			case <-ctx.Done():
				return
			case <-in.began:
			}
		}
		if !sleep(ctx, shareWait/5) {
			return
		}
		in.sweepWaiting(time.Now())
	}
}

// dropWaiting hands every waiting view back with its message (the dispatcher stops).
func (in *Intake) dropWaiting() {
	in.waitMu.Lock()
	var views []*View
	for w, q := range in.waiting {
		views = append(views, q.views...)
		in.waitingN.Add(-int64(len(q.views)))
		delete(in.waiting, w)
	}
	in.waitMu.Unlock()
	for _, v := range views {
		v.share.settled(v, true, time.Second)
	}
}
