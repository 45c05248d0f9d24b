package streams

import "github.com/nats-io/nats.go/jetstream"

// Bounds are one namespace's own storage bounds, in bytes, where its WebhookQuota sets them:
// each non-zero field replaces the installation's byte bound of that stream. The events stream
// and the delivery log keep dropping their oldest messages when full; the dead-letter stream
// refuses new ones; the deliveries stream keeps DiscardOld (DeliveriesStreamConfig says why)
// and its writers stop short of its bound.
type Bounds struct {
	Events, Deliveries, Attempts, DeadLetters int64
}

// WithBounds returns the set with b's bounds in place of the installation's.
func (s Set) WithBounds(b Bounds) Set {
	s.bounds = b
	return s
}

// Bounds are the set's own bounds (WithBounds).
func (s Set) Bounds() Bounds { return s.bounds }

// bounded applies the set's own bounds to sc, one of its streams' configurations.
func (s Set) bounded(sc jetstream.StreamConfig) jetstream.StreamConfig {
	var b int64
	switch sc.Name {
	case s.EventsStream():
		b = s.bounds.Events
	case s.DeliveriesStream():
		// Discard stays DiscardOld: the server refuses DiscardNew with message schedules.
		b = s.bounds.Deliveries
	case s.AttemptsStream():
		b = s.bounds.Attempts
	case s.DeadLetterStream():
		b = s.bounds.DeadLetters
	}
	if b > 0 {
		sc.MaxBytes = b
	}
	return sc
}

// DeliveriesHoldPercent is how full (bytes or messages, of its bound) a deliveries stream may
// grow with held events: once it is there a dispatcher leaves the events it holds in the events
// stream, and the endpoints show StorageLimitReached (DeliveriesStreamFull). The copy that
// crosses it may take the stream up to DeliveriesHoldMaxPercent, never further; the rest of the
// bound is headroom for retries, replays and test deliveries, so the stream's DiscardOld never
// applies.
const (
	DeliveriesHoldPercent    = 80
	DeliveriesHoldMaxPercent = 90
)

// HoldRoom reports whether a deliveries stream holding bytes and msgs, with bounds maxBytes and
// maxMsgs (0 or less: unbounded), takes one more held event of size bytes: while it is below
// DeliveriesHoldPercent of both bounds and the copy keeps it within DeliveriesHoldMaxPercent.
func HoldRoom(bytes, msgs, size, maxBytes, maxMsgs int64) bool {
	if maxBytes > 0 && (bytes*100 >= maxBytes*DeliveriesHoldPercent || (bytes+size)*100 > maxBytes*DeliveriesHoldMaxPercent) {
		return false
	}
	return maxMsgs <= 0 || msgs*100 < maxMsgs*DeliveriesHoldPercent
}
