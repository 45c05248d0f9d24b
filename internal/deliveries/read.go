package deliveries

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/match"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Reader reads deliveries from a NATS connection allowed to read the namespaces' streams and
// their consumers' state.
type Reader struct {
	NC *nats.Conn
	JS jetstream.JetStream
	// Streams are the JetStream layout's names.
	Streams streams.Config
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Page is one page of entries, newest first.
type Page struct {
	Entries []Entry
	// HasMore says Next continues it.
	HasMore bool
	Next    Cursor
	// Warnings say what the page could not include.
	Warnings []string
	// Unreadable counts delivery-log messages passed over because they held no record.
	Unreadable int
}

// ErrNoStreams says the namespace has no streams (yet): webhook-operator creates them with
// its first WebhookEndpoint. It wraps jetstream.ErrStreamNotFound.
var ErrNoStreams = fmt.Errorf("the namespace has no delivery streams: %w", jetstream.ErrStreamNotFound)

// maxEventEndpoints bounds the endpoints whose first attempts a namespace-wide page reads from
// the events stream (one consumer lookup each).
const maxEventEndpoints = 64

// maxEventsScan bounds how many events of the namespace one page reads looking for pending
// first attempts.
const maxEventsScan = 20000

func (r *Reader) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// read is the state of one page's read.
type read struct {
	r       *Reader
	q       *Query
	names   streams.Set
	now     time.Time
	opened  map[string]*streamread.Stream
	cons    map[string]*consState
	recents map[string]*recentAttempts
	scanned uint64
	capped  bool
}

// consState is what an endpoint's consumer on one stream has handed out and settled.
type consState struct {
	delivered, ackFloor uint64
	pending             bool
	found               bool
}

// open opens a stream once per read; a missing one is ErrNoStreams.
func (rd *read) open(ctx context.Context, name string) (*streamread.Stream, error) {
	if st, ok := rd.opened[name]; ok {
		return st, nil
	}
	st, err := streamread.Open(ctx, rd.r.NC, rd.r.JS, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w (%s)", ErrNoStreams, name)
	}
	if err != nil {
		return nil, err
	}
	rd.opened[name] = st
	return st, nil
}

// consumer reads the state of consumer name on stream, once per read.
func (rd *read) consumer(ctx context.Context, stream, name string) (*consState, error) {
	key := stream + "\x00" + name
	if c, ok := rd.cons[key]; ok {
		return c, nil
	}
	c := &consState{}
	cons, err := rd.r.JS.Consumer(ctx, stream, name)
	switch {
	case err == nil:
		info := cons.CachedInfo()
		c.delivered, c.ackFloor, c.found = info.Delivered.Stream, info.AckFloor.Stream, true
		c.pending = info.NumPending > 0 || info.NumAckPending > 0
	case !streams.IsNotFound(err):
		return nil, fmt.Errorf("reading the consumer %s of %s: %w", name, stream, err)
	}
	rd.cons[key] = c
	return c, nil
}

// recent is endpoint's reader of its newest delivery-log records, once per read.
func (rd *read) recent(endpoint string) *recentAttempts {
	if ra, ok := rd.recents[endpoint]; ok {
		return ra
	}
	ra := &recentAttempts{open: func(ctx context.Context) (*streamread.Backward, error) {
		st, err := rd.open(ctx, rd.names.AttemptsStream())
		if err != nil {
			return nil, err
		}
		return st.Backward(rd.names.AttemptSubject(endpoint), 0, 64), nil
	}}
	rd.recents[endpoint] = ra
	return ra
}

// span is the part of a source's stream a query's time range covers: messages above floor
// and below before (0: no bound).
func (rd *read) span(ctx context.Context, st *streamread.Stream, filter string) (floor, before uint64, err error) {
	if !rd.q.Until.IsZero() {
		ms, err := st.ForwardFrom(ctx, filter, rd.q.Until, 1)
		if err != nil {
			return 0, 0, err
		}
		if len(ms) == 1 {
			before = ms[0].Seq
		}
	}
	if !rd.q.Since.IsZero() {
		ms, err := st.ForwardFrom(ctx, filter, rd.q.Since, 1)
		if err != nil {
			return 0, 0, err
		}
		if len(ms) == 0 {
			floor = st.LastSeq // nothing this recent
		} else {
			floor = ms[0].Seq - 1
		}
	}
	return floor, before, nil
}

// below is the tighter of a cursor's bound and a range's (0: none).
func below(cursor, before uint64) uint64 {
	switch {
	case cursor == 0:
		return before
	case before == 0:
		return cursor
	}
	return min(cursor, before)
}

// Read reads one page.
func (r *Reader) Read(ctx context.Context, q Query) (Page, error) {
	page := Page{Entries: []Entry{}}
	if err := q.check(); err != nil {
		return page, err
	}
	if err := streams.ValidateNamespace(q.Namespace); err != nil {
		return page, fmt.Errorf("%w: %v", ErrBadQuery, err)
	}
	rd := &read{r: r, q: &q, names: r.Streams.For(q.Namespace), now: r.now(), opened: map[string]*streamread.Stream{},
		cons: map[string]*consState{}, recents: map[string]*recentAttempts{}}
	names := rd.names
	want := q.Limit + 1
	status := q.State
	cur := q.Cursor
	useA := q.Attempts || status == "" || status == records.StateSucceeded || status == records.StateDeadLetter
	useD := !q.Attempts && (status == "" || status == records.StatePending || status == records.StateAttempting || status == records.StateFailed)
	useR := !q.Attempts && (status == "" || status == records.StateFailed)
	held := map[string]string{}
	for _, ep := range q.Endpoints {
		held[ep.Name] = ep.HeldReason
	}

	var srcA, srcD, srcR, srcE *source
	if useA {
		st, err := rd.open(ctx, names.AttemptsStream())
		if err != nil {
			return page, err
		}
		filter := names.AttemptsSubjects()[0]
		if q.Endpoint != "" {
			filter = names.AttemptSubject(q.Endpoint)
		}
		floor, before, err := rd.span(ctx, st, filter)
		if err != nil {
			return page, err
		}
		before = below(cur.A, before)
		var maxScan uint64
		if what := q.bodyFilter(); what != "" {
			if q.Lookup {
				maxScan = q.MaxScan
			} else if n, err := st.CountBetween(ctx, filter, floor+1, before); err != nil {
				return page, err
			} else if n > q.MaxScan {
				return page, &TooBroadError{Messages: n, Max: q.MaxScan, Filter: what}
			}
		}
		srcA = &source{rd: st.Backward(filter, before, want), floor: floor, maxScan: maxScan, keep: func(_ context.Context, m *streamread.Msg) ([]Entry, error) {
			recs := records.LogRecords(m.Data)
			if len(recs) == 0 {
				page.Unreadable++
			}
			var out []Entry
			for i := len(recs) - 1; i >= 0; i-- { // newest first
				rec := recs[i]
				if status != "" && rec.State != status {
					continue
				}
				if !q.Attempts && rec.State != records.StateSucceeded && rec.State != records.StateDeadLetter {
					// An intermediate attempt: the delivery's current state is newer.
					continue
				}
				if !q.keeps(rec.DeliveryID, rec.EventID, rec.EventType) || q.Endpoint != "" && rec.Endpoint != q.Endpoint {
					continue
				}
				out = append(out, entryOfRecord(rec, m, q.Attempts))
			}
			return out, nil
		}}
		if cur.AShown > 0 {
			srcA.skipSeq, srcA.skip = cur.A-1, cur.AShown
		}
	}
	if useD || useR {
		st, err := rd.open(ctx, names.DeliveriesStream())
		if err != nil {
			return page, err
		}
		if useD {
			// Its own lane's deliveries, the shared lane's queue and park.
			filter := names.WaitingFilter(q.Endpoint)
			floor, before, err := rd.span(ctx, st, filter)
			if err != nil {
				return page, err
			}
			srcD = &source{rd: st.Backward(filter, below(cur.D, before), want), floor: floor, keep: one(func(ctx context.Context, m *streamread.Msg) (Entry, bool, error) {
				ep := endpointOf(m, names)
				if q.Endpoint != "" && ep != q.Endpoint {
					return Entry{}, false, nil
				}
				state := records.StatePending
				if !names.IsParked(m.Subject) { // a park is read by no consumer: it waits
					consumer := names.EndpointConsumer(ep)
					if names.IsQueued(m.Subject) {
						consumer = names.QueueConsumer()
					}
					c, err := rd.consumer(ctx, names.DeliveriesStream(), consumer)
					if err != nil {
						return Entry{}, false, err
					}
					if m.Seq <= c.delivered && m.Seq > c.ackFloor {
						state = records.StateAttempting
					}
				}
				if state == records.StatePending && status != "" && status != state {
					return Entry{}, false, nil
				}
				e := entryOfDelivery(m, state, FromDeliveries)
				e.Endpoint = ep
				if !q.keeps(e.ID, e.EventID, e.EventType) {
					return Entry{}, false, nil
				}
				if state == records.StateAttempting {
					rec, err := rd.recent(ep).latest(ctx, e.ID, m.Time)
					if err != nil {
						return e, false, err
					}
					inFlight(&e, rec, rd.now)
				} else {
					e.HeldReason = held[ep]
				}
				return e, status == "" || e.Status == status, nil
			})}
		}
		if useR {
			filter := names.ScheduledFilter(q.Endpoint, q.DeliveryID)
			floor, before, err := rd.span(ctx, st, filter)
			if err != nil {
				return page, err
			}
			srcR = &source{rd: st.Backward(filter, below(cur.R, before), want), floor: floor, keep: one(func(_ context.Context, m *streamread.Msg) (Entry, bool, error) {
				e := entryOfDelivery(m, records.StateFailed, FromRetries)
				if e.Endpoint == "" {
					e.Endpoint = endpointOf(m, names)
				}
				return e, q.keeps(e.ID, e.EventID, e.EventType), nil
			})}
		}
	}
	if useD {
		var err error
		if srcE, err = rd.eventsSource(ctx, &page, cur, want); err != nil {
			return page, err
		}
	}
	cursorNow := func() Cursor {
		c := cur
		if srcA != nil {
			c.A, c.AShown = srcA.bound()
		}
		if srcD != nil {
			c.D, _ = srcD.bound()
		}
		if srcR != nil {
			c.R, _ = srcR.bound()
		}
		if srcE != nil {
			c.E, c.EShown = srcE.bound()
		}
		return c
	}
	sources := []*source{srcD, srcR, srcE, srcA}
	for _, s := range sources {
		if s != nil {
			s.read = rd
		}
	}
	// A delivery held or scheduled for a retry has a copy on the deliveries stream, newer than
	// its event (which stays unsettled until the copy is stored): the copy is listed.
	seen := map[string]bool{}
	for {
		var best *source
		for _, s := range sources {
			if s == nil {
				continue
			}
			e, err := s.peek(ctx)
			if err != nil {
				return page, err
			}
			if e != nil && (best == nil || e.Time.After(best.head.Time)) {
				best = s
			}
		}
		if best == nil {
			if rd.capped {
				// The scan bound ended the page: what is left is reached from its cursor.
				page.HasMore = true
				page.Next = cursorNow()
				page.Warnings = append(page.Warnings, fmt.Sprintf("this page ended after reading %d messages; continue to read on", ScanCap))
			}
			break
		}
		if len(page.Entries) == q.Limit {
			page.HasMore = true
			page.Next = page.Entries[len(page.Entries)-1].Cursor
			break
		}
		e := *best.head
		best.take()
		if e.ID != "" && !q.Attempts {
			if seen[e.ID] {
				continue
			}
			seen[e.ID] = true
		}
		e.Cursor = cursorNow()
		page.Entries = append(page.Entries, e)
	}
	return page, nil
}

// endpointOf is the endpoint of a message of the deliveries stream: its header, else its
// subject (whk.d.<ns>.<endpoint> or whk.r.<ns>.<endpoint>.<id>).
func endpointOf(m *streamread.Msg, names streams.Set) string {
	if ep := m.Header.Get(records.HEndpoint); ep != "" {
		return ep
	}
	return names.EndpointOfSubject(m.Subject)
}

// eventsSource lists the events waiting for the query's endpoints on the namespace's events
// stream, above what each one's consumer there settled: pending (not yet handed out) or
// attempting.
func (rd *read) eventsSource(ctx context.Context, page *Page, cur Cursor, want int) (*source, error) {
	q, names := rd.q, rd.names
	eps := q.Endpoints
	if q.Endpoint != "" {
		eps = slices.DeleteFunc(slices.Clone(eps), func(e Endpoint) bool { return e.Name != q.Endpoint })
	}
	if len(eps) == 0 {
		return nil, nil
	}
	if len(eps) > maxEventEndpoints {
		page.Warnings = append(page.Warnings, fmt.Sprintf("the namespace has %d endpoints: first attempts waiting in the events stream are listed only for one endpoint at a time (select spec.endpoint)", len(eps)))
		return nil, nil
	}
	type waiting struct {
		ep Endpoint
		c  *consState
	}
	var ws []waiting
	var floor uint64
	for _, ep := range eps {
		if len(ep.Patterns) == 0 {
			continue
		}
		// A shared-lane endpoint's first attempts wait above its namespace's intake consumer,
		// which holds an event until every endpoint it routes to has settled it (an attempt
		// the log shows settled is left out below).
		consumer := names.EndpointConsumer(ep.Name)
		if ep.Lane == streams.LaneShared {
			consumer = streams.IntakeConsumer(q.Namespace)
		}
		c, err := rd.consumer(ctx, names.EventsStream(), consumer)
		if err != nil {
			return nil, err
		}
		if !c.found || !c.pending {
			continue
		}
		if len(ws) == 0 || c.ackFloor < floor {
			floor = c.ackFloor
		}
		ws = append(ws, waiting{ep, c})
	}
	if len(ws) == 0 {
		return nil, nil
	}
	st, err := rd.open(ctx, names.EventsStream())
	if err != nil {
		return nil, err
	}
	filter := names.EventsFilter()
	if q.EventType != "" {
		filter = names.EventSubject(q.EventType)
	}
	sFloor, before, err := rd.span(ctx, st, filter)
	if err != nil {
		return nil, err
	}
	status := q.State
	prefix := rd.r.Streams.Names.EventsSubjectPrefix
	s := &source{rd: st.Backward(filter, below(cur.E, before), want), floor: max(floor, sFloor), maxScan: maxEventsScan,
		keep: func(ctx context.Context, m *streamread.Msg) ([]Entry, error) {
			typ, ok := names.EventType(m.Subject)
			if !ok {
				return nil, nil
			}
			var out []Entry
			for _, w := range ws {
				if m.Seq <= w.c.ackFloor || !slices.ContainsFunc(w.ep.Patterns, func(p string) bool { return match.Match(p, typ) }) {
					continue
				}
				state := records.StatePending
				if m.Seq <= w.c.delivered {
					state = records.StateAttempting
				}
				if status != "" && status != state && state == records.StatePending {
					continue
				}
				meta, _, _ := records.EventDelivery(m.Subject, prefix, names.EventsStream(), m.Seq, m.Time, m.Header, q.Namespace, w.ep.Name)
				e := Entry{ID: meta.DeliveryID, Endpoint: w.ep.Name, Status: state, EventID: meta.EventID, EventType: meta.EventType,
					EventSeq: m.Seq, Time: m.Time.UTC(), From: FromEvents, Seq: m.Seq}
				if !q.keeps(e.ID, e.EventID, e.EventType) {
					continue
				}
				created := m.Time.UTC()
				e.CreatedAt = &created
				if state == records.StateAttempting {
					rec, err := rd.recent(w.ep.Name).latest(ctx, e.ID, m.Time)
					if err != nil {
						return nil, err
					}
					if rec != nil && (rec.State == records.StateSucceeded || rec.State == records.StateDeadLetter) {
						continue // settled, its acknowledgement not yet counted
					}
					inFlight(&e, rec, rd.now)
				} else {
					e.HeldReason = w.ep.HeldReason
				}
				if status == "" || e.Status == status {
					out = append(out, e)
				}
			}
			return out, nil
		}}
	if cur.EShown > 0 {
		s.skipSeq, s.skip = cur.E-1, cur.EShown
	}
	return s, nil
}

// LogHead is the last sequence of namespace ns's delivery log: a watch from it sees every
// outcome logged after.
func (r *Reader) LogHead(ctx context.Context, ns string) (uint64, error) {
	if err := streams.ValidateNamespace(ns); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrBadQuery, err)
	}
	st, err := r.JS.Stream(ctx, r.Streams.For(ns).AttemptsStream())
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, ErrNoStreams
	}
	if err != nil {
		return 0, err
	}
	return st.CachedInfo().State.LastSeq, nil
}
