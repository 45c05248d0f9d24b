package deliveries

import (
	"context"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
)

// source is one ordered source of entries: a backward reader and what it keeps.
type source struct {
	rd *streamread.Backward
	// read is the page's read, which counts the messages every source reads (ScanCap).
	read *read
	// keep turns a message into its entries, newest first (kept entries only).
	keep func(ctx context.Context, m *streamread.Msg) ([]Entry, error)
	head *Entry
	// rest are the entries of the message being read after head; seq is its sequence and
	// taken how many of its entries were shown.
	rest  []Entry
	seq   uint64
	taken int
	// skipSeq and skip: the first message read (at skipSeq) had skip entries shown on an
	// earlier page.
	skipSeq uint64
	skip    int
	// floor ends the source at a message at or below it, or after maxScan messages (0: none).
	floor, maxScan, scanned uint64
	ended                   bool
}

// one makes a keep function of one that keeps at most one entry per message.
func one(f func(ctx context.Context, m *streamread.Msg) (Entry, bool, error)) func(context.Context, *streamread.Msg) ([]Entry, error) {
	return func(ctx context.Context, m *streamread.Msg) ([]Entry, error) {
		e, ok, err := f(ctx, m)
		if !ok || err != nil {
			return nil, err
		}
		return []Entry{e}, nil
	}
}

// peek finds the source's next kept entry.
func (s *source) peek(ctx context.Context) (*Entry, error) {
	for s.head == nil {
		if len(s.rest) > 0 {
			s.head, s.rest = &s.rest[0], s.rest[1:]
			break
		}
		if s.ended {
			return nil, nil
		}
		if s.read != nil && s.read.scanned >= ScanCap {
			s.read.capped = true
			return nil, nil
		}
		m, err := s.rd.Peek(ctx)
		if err != nil || m == nil {
			return nil, err
		}
		if m.Seq <= s.floor || s.maxScan > 0 && s.scanned >= s.maxScan {
			s.ended = true
			return nil, nil
		}
		if m, err = s.rd.Next(ctx); err != nil {
			return nil, err
		}
		s.scanned++
		if s.read != nil {
			s.read.scanned++
		}
		es, err := s.keep(ctx, m)
		if err != nil {
			return nil, err
		}
		s.seq, s.taken = m.Seq, 0
		if m.Seq == s.skipSeq {
			s.taken = min(s.skip, len(es))
			es = es[s.taken:]
		}
		s.skipSeq = 0
		if len(es) > 0 {
			s.head, s.rest = &es[0], es[1:]
		}
	}
	return s.head, nil
}

// take consumes the head.
func (s *source) take() {
	s.head = nil
	s.taken++
}

// bound is where a continuation of this source starts: below the entry not yet shown (within
// its message, after the entries of it already shown).
func (s *source) bound() (uint64, int) {
	if s.head != nil || len(s.rest) > 0 {
		return s.seq + 1, s.taken
	}
	return s.rd.Bound(), 0
}

// maxRecentScan bounds how many recent delivery-log records are read to describe in-flight
// deliveries.
const maxRecentScan = 2000

// recentAttempts finds the newest delivery-log record of in-flight deliveries. A delivery
// retried in place (short waits, and every retry of a PerKey endpoint) stays in flight on its
// delivery subject while its failed attempt is already logged: without its record it would
// look like a first attempt in progress.
type recentAttempts struct {
	open    func(ctx context.Context) (*streamread.Backward, error)
	rd      *streamread.Backward
	newest  map[string]records.LogRecord
	reached time.Time
	scanned int
	done    bool
}

// latest returns the newest record of delivery id stored after since, if one is found within
// the scan bound.
func (r *recentAttempts) latest(ctx context.Context, id string, since time.Time) (*records.LogRecord, error) {
	if r.rd == nil && !r.done {
		rd, err := r.open(ctx)
		if err != nil {
			return nil, err
		}
		r.rd, r.newest = rd, map[string]records.LogRecord{}
	}
	for {
		if rec, ok := r.newest[id]; ok {
			return &rec, nil
		}
		if r.done || r.scanned >= maxRecentScan || (!r.reached.IsZero() && r.reached.Before(since)) {
			return nil, nil
		}
		m, err := r.rd.Next(ctx)
		if err != nil {
			return nil, err
		}
		if m == nil {
			r.done = true
			continue
		}
		r.scanned++
		r.reached = m.Time
		recs := records.LogRecords(m.Data)
		for i := len(recs) - 1; i >= 0; i-- { // newest first
			if _, ok := r.newest[recs[i].DeliveryID]; !ok {
				r.newest[recs[i].DeliveryID] = recs[i]
			}
		}
	}
}
