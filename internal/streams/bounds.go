package streams

import "github.com/nats-io/nats.go/jetstream"

// Bounds are one namespace's own storage bounds, in bytes, where its WebhookQuota sets them:
// each non-zero field replaces the installation's bound of that stream. The events stream and
// the delivery log keep dropping their oldest messages when full; the dead-letter and the
// deliveries streams refuse new ones.
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
		b = s.bounds.Deliveries
		if b > 0 {
			// Full, it refuses what would be held there: the events stay in the events
			// stream (see the dispatcher's hold).
			sc.Discard = jetstream.DiscardNew
		}
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
