package deliver

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/dispatcher/decide"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
)

// decided indexes an endpoint's delivery log by delivery id, from a start time on, so that a
// redelivered message (its acknowledgement was lost: a nats-server restart, a leader change, a
// crash after the outcome was logged) is settled from the log instead of being sent again. The
// log holds the outcome of a first delivery in a batch message (see LogWriter), which no
// message id names; so the index reads the endpoint's log subject forward from the oldest
// redelivered message's stored time, once, and then only what was logged since. It is built
// only when a redelivered message comes, and dropped once none came for a while: a delivery
// whose acknowledgement arrived costs nothing.
type decided struct {
	js      jetstream.JetStream
	stream  string
	subject string

	mu   sync.Mutex
	st   *streamread.Stream
	from time.Time // the index covers the log messages stored at or after from
	next uint64    // the next log sequence to read
	byID map[string]decide.Logged
	// order is the ids of byID in the order they were first read, for forgetting the oldest.
	order []string
	used  time.Time
	// readFrom is when the last read that reached the log's end began: a lookup that came
	// before it needs no read of its own (see lookup).
	readFrom time.Time
	// reads counts the reads to the log's end (for tests).
	reads int
}

// decidedIdle is how long an index is kept without a lookup.
const decidedIdle = 2 * time.Minute

// decidedBatch is how many log messages one read returns at most.
const decidedBatch = 256

// decidedMaxIDs bounds the deliveries one index holds (about 80 bytes each when decided, a
// few hundred for a retry's record): a default delivery log of 128 MiB holds about as many
// records. Beyond it the oldest-read ids are forgotten: a redelivered message the index no
// longer knows is sent again, as at-least-once allows.
const decidedMaxIDs = 1 << 17

// lookup returns the latest outcome the log holds of delivery id, reading the log from since
// (the stored time of the message, before which none of its outcomes can have been logged)
// up to its end.
//
// Lookups of many deliveries at once (a parked backlog drained, the redeliveries after a
// restart) share their reads: what the log held when a lookup came was logged before it, so a
// read that began after it came, by another lookup that held the index meanwhile, has read
// everything it needs, and it only looks in the index.
func (d *decided) lookup(ctx context.Context, id string, since time.Time) (decide.Logged, bool, error) {
	came := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if d.byID == nil || since.Before(d.from) || now.Sub(d.used) > decidedIdle {
		d.byID, d.order, d.from, d.next, d.readFrom = map[string]decide.Logged{}, nil, since, 0, time.Time{}
	}
	d.used = now
	if d.readFrom.After(came) {
		dec, ok := d.byID[id]
		return dec, ok, nil
	}
	if d.st == nil {
		st, err := streamread.Open(ctx, d.js.Conn(), d.js, d.stream)
		if err != nil {
			return decide.Logged{}, false, err
		}
		st.MaxBytes = 4 << 20
		d.st = st
	}
	for {
		var msgs []streamread.Msg
		var err error
		if d.next == 0 {
			msgs, err = d.st.ForwardFrom(ctx, d.subject, d.from, decidedBatch)
		} else {
			msgs, err = d.st.Forward(ctx, d.subject, d.next, decidedBatch)
		}
		if err != nil {
			// The next lookup reads again from where this one got.
			return decide.Logged{}, false, err
		}
		for _, m := range msgs {
			d.next = m.Seq + 1
			for _, rec := range records.LogStates(m.Data) {
				d.add(&rec)
			}
		}
		if len(msgs) == 0 {
			break
		}
	}
	// A direct get may be answered by a replica that lags the stream's leader (a node that
	// just came back): what is newer than it holds is read from the leader, by the plain get
	// API, usually nothing, in one request.
	leader := *d.st
	leader.Direct = false
	for {
		msgs, err := leader.Forward(ctx, d.subject, max(d.next, 1), decidedBatch)
		if err != nil {
			return decide.Logged{}, false, err
		}
		for _, m := range msgs {
			d.next = m.Seq + 1
			for _, rec := range records.LogStates(m.Data) {
				d.add(&rec)
			}
		}
		if len(msgs) < decidedBatch {
			break
		}
	}
	d.readFrom, d.reads = now, d.reads+1
	dec, ok := d.byID[id]
	return dec, ok, nil
}

// add keeps rec when it is its delivery's latest outcome.
func (d *decided) add(rec *records.LogState) {
	old, ok := d.byID[rec.DeliveryID]
	if ok && (old.Terminal() || old.Attempt > rec.Attempt) {
		return
	}
	dec := decide.Logged{State: rec.State, Attempt: rec.Attempt, Time: rec.Time}
	if !dec.Terminal() {
		// Only a retry waited out again needs its attempt's record (settleLogged).
		dec.Record = records.Attempt{N: rec.Attempt, Time: rec.Time, StatusCode: rec.Response.StatusCode, LatencyMS: rec.LatencyMS,
			LatencyUS: rec.LatencyUS, Reason: rec.Reason, Error: records.Bound(rec.Response.Error, records.MaxHistoryError)}
	}
	if rec.NextAttemptAt != nil {
		dec.Due = *rec.NextAttemptAt
		dec.Wait = rec.NextAttemptAt.Sub(rec.Time) - time.Duration(rec.LatencyUS)*time.Microsecond
	}
	if !ok {
		if len(d.order) >= decidedMaxIDs {
			delete(d.byID, d.order[0])
			d.order = d.order[1:]
		}
		d.order = append(d.order, rec.DeliveryID)
	}
	d.byID[rec.DeliveryID] = dec
}

// busy are the deliveries a worker is attempting or logging now, so that a copy of one that
// arrives meanwhile (redelivered while the first's outcome is still being written, as after a
// nats-server restart) is not attempted beside it.
type busy struct {
	mu  sync.Mutex
	ids map[string]int
}

// claim marks id busy; false when it was already.
func (b *busy) claim(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ids[id] > 0 {
		return false
	}
	if b.ids == nil {
		b.ids = map[string]int{}
	}
	b.ids[id]++
	return true
}

// hold marks id busy once more (its log write), whether or not it was.
func (b *busy) hold(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ids == nil {
		b.ids = map[string]int{}
	}
	b.ids[id]++
}

// release ends one claim or hold of id.
func (b *busy) release(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ids[id]--; b.ids[id] <= 0 {
		delete(b.ids, id)
	}
}

// Again says a message its consumer delivered once may have been delivered again since
// (pull.Stamp.Again; see settle.Redelivered).
func (p *pulled) Again() bool { return p.stamp.Again() }
