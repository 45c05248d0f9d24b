package deliver

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
// copy (streams.HoldRoom). Past that the event stays in the events stream, not
// acknowledged, and comes back once there is room or the endpoint delivers again; the rest of
// the bound is headroom for retries, replays and test deliveries.
//
// Room reads the stream's state at most every roomRefresh, and counts every copy this
// dispatcher writes from the moment it reserves room for it, so between two readings the check
// is exact for this process (copies written by other dispatchers of the namespace show at the
// next reading).
type Room struct {
	js     jetstream.JetStream
	stream string

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

// roomRefresh is how often Room reads the deliveries stream's state while copies are held.
const roomRefresh = 2 * time.Second

// roomOverhead is what the server stores with a message besides its headers and data.
const roomOverhead = 64

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
	first := r.at.IsZero() && !r.fetching
	if first {
		r.fetching = true
	}
	r.mu.Unlock()
	if first {
		r.fetch(ctx)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshLocked()
	if r.at.IsZero() || !streams.HoldRoom(r.baseBytes+r.extraBytes, r.baseMsgs+r.extraMsgs, size, r.maxBytes, r.maxMsgs) {
		return false
	}
	r.extraBytes += size
	r.extraMsgs++
	return true
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
		go r.fetch(context.Background())
	}
}

// fetch reads the stream's state; the caller set fetching. The copies acknowledged before it
// asks are in the reading, so they leave extra; those still on their way stay counted there.
func (r *Room) fetch(ctx context.Context) {
	r.mu.Lock()
	sb, sm := r.storedBytes, r.storedMsgs
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var info *jetstream.StreamInfo
	if st, err := r.js.Stream(ctx, r.stream); err == nil {
		info = st.CachedInfo()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fetching = false
	if info == nil {
		return
	}
	r.baseBytes, r.baseMsgs = int64(info.State.Bytes), int64(info.State.Msgs)
	r.maxBytes, r.maxMsgs, r.at = info.Config.MaxBytes, info.Config.MaxMsgs, time.Now()
	r.extraBytes -= sb
	r.extraMsgs -= sm
	r.storedBytes -= sb
	r.storedMsgs -= sm
}
