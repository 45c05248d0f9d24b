package settle

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Room keeps the events an endpoint holds from filling its namespace's deliveries stream.
// The stream is bounded (bytes and messages) but discards its oldest messages when over
// (nats-server refuses DiscardNew on a stream with message schedules), so what is held there
// must stop short of the bound: a held copy is written only while the stream is below
// streams.DeliveriesHoldPercent of it, and within streams.DeliveriesHoldMaxPercent with the
// copy (streams.HoldRoom). Past that the event stays in the events stream, not acknowledged,
// and comes back once there is room or the endpoint delivers again; the rest of the bound is
// headroom for retries, replays and test deliveries.
//
// Room counts every copy this dispatcher writes from the moment it reserves room for it, so
// between two readings of the stream's state the check is exact for this process. Other
// dispatchers of the namespace (its replicas, dedicated ones) write to the same stream, so a
// process writes at most roomBudgetPercent of the bound between two readings: with the
// headroom above the threshold, up to four dispatchers holding at the same moment stay within
// the bound.
type Room struct {
	js     jetstream.JetStream
	stream string

	// fetchMu serialises readings of the stream's state.
	fetchMu sync.Mutex

	mu sync.Mutex
	// base is the stream's state as last read; at when (zero: never read).
	baseBytes, baseMsgs int64
	maxBytes, maxMsgs   int64
	at                  time.Time
	fetching            bool
	// extra are the copies reserved since they may not be in base; stored those of them whose
	// write was acknowledged (so a reading taken after it includes them).
	extraBytes, extraMsgs   int64
	storedBytes, storedMsgs int64
}

const (
	// roomRefresh is how often Room reads the stream's state while copies are held.
	roomRefresh = 2 * time.Second
	// roomBudgetPercent of the bound is what one process writes between two readings.
	roomBudgetPercent = 5
	// roomOverhead is what the server stores with a message besides its headers and data.
	roomOverhead = 64
)

// NewRoom watches the deliveries stream named stream through js.
func NewRoom(js jetstream.JetStream, stream string) *Room {
	return &Room{js: js, stream: stream}
}

// Reserve takes room for one held copy of size bytes (headers and data), or reports false
// when the stream would then be past its hold threshold (or its state cannot be read). A nil
// Room has room for everything. Each reservation ends with Stored or Released.
func (r *Room) Reserve(ctx context.Context, size int64) bool {
	if r == nil {
		return true
	}
	size += roomOverhead
	r.mu.Lock()
	fresh := !r.at.IsZero() && !r.overBudget(size)
	r.mu.Unlock()
	if !fresh {
		r.fetch(ctx)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshLocked()
	if r.at.IsZero() || r.overBudget(size) ||
		!streams.HoldRoom(r.baseBytes+r.extraBytes, r.baseMsgs+r.extraMsgs, size, r.maxBytes, r.maxMsgs) {
		return false
	}
	r.extraBytes += size
	r.extraMsgs++
	return true
}

// overBudget reports whether a copy of size bytes would take what this process wrote since
// the last reading past roomBudgetPercent of a bound (one copy always fits the budget).
func (r *Room) overBudget(size int64) bool {
	if r.extraMsgs == 0 {
		return false
	}
	return r.maxBytes > 0 && (r.extraBytes+size)*100 > r.maxBytes*roomBudgetPercent ||
		r.maxMsgs > 0 && (r.extraMsgs+1)*100 > r.maxMsgs*roomBudgetPercent
}

// Full reports whether the last reading, with what was reserved since, leaves no room for one
// more held copy (of any size). Unknown is not full: Reserve decides then.
func (r *Room) Full() bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshLocked()
	return !r.at.IsZero() && !streams.HoldRoom(r.baseBytes+r.extraBytes, r.baseMsgs+r.extraMsgs, roomOverhead, r.maxBytes, r.maxMsgs)
}

// Stored says a reserved copy of size bytes was written.
func (r *Room) Stored(size int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.storedBytes += size + roomOverhead
	r.storedMsgs++
}

// Released gives back the room of a reserved copy that was not written.
func (r *Room) Released(size int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.extraBytes -= size + roomOverhead
	r.extraMsgs--
}

// refreshLocked starts a reading in the background when the last one is old.
func (r *Room) refreshLocked() {
	if time.Since(r.at) > roomRefresh && !r.fetching && !r.at.IsZero() {
		r.fetching = true
		go func() {
			r.fetch(context.Background())
			r.mu.Lock()
			r.fetching = false
			r.mu.Unlock()
		}()
	}
}

// fetch reads the stream's state. The copies acknowledged before it asks are in the reading,
// so they leave extra; those still on their way stay counted there.
func (r *Room) fetch(ctx context.Context) {
	r.fetchMu.Lock()
	defer r.fetchMu.Unlock()
	r.mu.Lock()
	sb, sm := r.storedBytes, r.storedMsgs
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var info *jetstream.StreamInfo
	if st, err := r.js.Stream(ctx, r.stream); err == nil {
		info = st.CachedInfo()
	}
	if info == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.baseBytes, r.baseMsgs = int64(info.State.Bytes), int64(info.State.Msgs)
	r.maxBytes, r.maxMsgs, r.at = info.Config.MaxBytes, info.Config.MaxMsgs, time.Now()
	r.extraBytes -= sb
	r.extraMsgs -= sm
	r.storedBytes -= sb
	r.storedMsgs -= sm
}
