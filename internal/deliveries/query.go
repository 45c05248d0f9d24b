package deliveries

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Bounds of a read.
const (
	// DefaultLimit is a page's size when the query names none.
	DefaultLimit = 500
	// MaxLimit bounds a page.
	MaxLimit = 1000
	// DefaultMaxScan bounds the delivery-log messages a filter on record bodies (event id,
	// event type, dead-lettered) may have to read: a query whose range holds more is refused.
	DefaultMaxScan = 50_000
	// ScanCap bounds the messages one page reads across its sources: a page that reaches it
	// ends early, with a cursor to go on from.
	ScanCap = 200_000
)

// Query asks for one page of a namespace's deliveries.
type Query struct {
	Namespace string
	// Endpoint restricts the page to one endpoint's deliveries; empty: every endpoint's.
	Endpoint string
	// Endpoints are the endpoints whose first attempts are read from the events stream (their
	// event patterns and what holds them): the one of Endpoint, or the namespace's.
	Endpoints []Endpoint
	// State keeps deliveries in this state (records.StatePending, StateAttempting,
	// StateFailed, StateSucceeded, StateDeadLetter); empty: any.
	State string
	// EventID, EventType and DeliveryID keep the deliveries of this event, event type or id.
	EventID, EventType, DeliveryID string
	// Since and Until bound the time a delivery reached its state: at or after Since, before
	// Until (zero: unbounded).
	Since, Until time.Time
	// Limit is the page's size (1 to MaxLimit).
	Limit int
	// Cursor continues an earlier page (zero: from the newest).
	Cursor Cursor
	// Attempts lists every attempt of the delivery log instead of one entry per delivery.
	Attempts bool
	// MaxScan overrides DefaultMaxScan.
	MaxScan uint64
	// Lookup reads at most MaxScan delivery-log messages for a body filter instead of refusing
	// a larger range: a single delivery's lookup, which finds it or says it is not among them.
	Lookup bool
}

// Endpoint is what the reader needs of an endpoint.
type Endpoint struct {
	Name string
	// Patterns are its event-type patterns.
	Patterns []string
	// HeldReason is why it holds its deliveries, if it does (a suspended, disabled or
	// circuit-open endpoint).
	HeldReason string
	// Lane is how its deliveries reach the dispatcher: its first attempts wait in the events
	// stream above its own consumer (streams.LaneOwn) or its namespace's intake consumer
	// (streams.LaneShared).
	Lane streams.Lane
}

// States are the states a query may select.
var States = []string{records.StatePending, records.StateAttempting, records.StateFailed, records.StateSucceeded, records.StateDeadLetter}

// ErrBadQuery wraps what is wrong with a query.
var ErrBadQuery = errors.New("bad query")

// TooBroadError refuses a query whose body filter would read more of the delivery log than
// MaxScan allows.
type TooBroadError struct {
	// Messages is how many delivery-log messages the range holds; Max what a query may read.
	Messages, Max uint64
	// Filter names the filter that needs them read.
	Filter string
}

func (e *TooBroadError) Error() string {
	return fmt.Sprintf("selecting by %s reads every delivery-log record in range, and the range holds %d messages (at most %d are read for one page): "+
		"narrow it with an endpoint and a time range (since, until)", e.Filter, e.Messages, e.Max)
}

// check validates q and fills its defaults.
func (q *Query) check() error {
	if q.Limit == 0 {
		q.Limit = DefaultLimit
	}
	if q.Limit < 1 || q.Limit > MaxLimit {
		return fmt.Errorf("%w: limit %d: want 1 to %d", ErrBadQuery, q.Limit, MaxLimit)
	}
	if q.State != "" && !contains(States, q.State) {
		return fmt.Errorf("%w: state %q: want one of %s", ErrBadQuery, q.State, strings.Join(States, ", "))
	}
	if q.Attempts && (q.State == records.StatePending || q.State == records.StateAttempting) {
		return fmt.Errorf("%w: the attempts view lists attempts already made: %s deliveries have none yet", ErrBadQuery, q.State)
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Since.Before(q.Until) {
		return fmt.Errorf("%w: since (%s) must be before until (%s)", ErrBadQuery, q.Since.UTC().Format(time.RFC3339), q.Until.UTC().Format(time.RFC3339))
	}
	if q.MaxScan == 0 {
		q.MaxScan = DefaultMaxScan
	}
	return nil
}

// bodyFilter names the filter that needs delivery-log records read, or "".
func (q *Query) bodyFilter() string {
	switch {
	case q.DeliveryID != "":
		return "delivery id"
	case q.EventID != "":
		return "event id"
	case q.EventType != "":
		return "event type"
	case q.State == records.StateDeadLetter:
		return "state " + records.StateDeadLetter
	case q.Attempts && q.State != "":
		return "state " + q.State + " in the attempts view"
	}
	return ""
}

// keeps reports whether an entry's identity passes the query's exact filters.
func (q *Query) keeps(id, eventID, eventType string) bool {
	return (q.DeliveryID == "" || id == q.DeliveryID) && (q.EventID == "" || eventID == q.EventID) && (q.EventType == "" || eventType == q.EventType)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Cursor holds where each source of the log stands: the exclusive upper sequence bound of
// the delivery log (and how many entries of the message just below it were shown: a message
// may hold several records), of the deliveries, of the scheduled retries and of the events
// stream (and the entries of its message shown: one event may be pending for several
// endpoints). Zero: from the newest.
type Cursor struct {
	A      uint64
	AShown int
	D, R   uint64
	E      uint64
	EShown int
}

// IsZero reports whether c starts from the newest.
func (c Cursor) IsZero() bool { return c == Cursor{} }

// String is the cursor's text, which ParseCursor reads.
func (c Cursor) String() string {
	return fmt.Sprintf("c4.%d.%d.%d.%d.%d.%d", c.A, c.AShown, c.D, c.R, c.E, c.EShown)
}

// ParseCursor reads a cursor's text (this version's, and the kubectl plugin's earlier c1 to c3).
func ParseCursor(s string) (Cursor, error) {
	var c Cursor
	if s == "" {
		return c, nil
	}
	bad := fmt.Errorf("%w: %q is not a cursor of this log (they look like c4.1234.0.56.78.90.0)", ErrBadQuery, s)
	parts := strings.Split(s, ".")
	n := map[string]int{"c1": 3, "c2": 4, "c3": 5, "c4": 6}[parts[0]]
	if n == 0 || len(parts) != n+1 {
		return c, bad
	}
	v := make([]uint64, n)
	for i := range v {
		var err error
		if v[i], err = strconv.ParseUint(parts[i+1], 10, 64); err != nil {
			return c, bad
		}
	}
	shown := func(x uint64) int { return int(min(x, 1<<16)) }
	switch parts[0] {
	case "c1": // before a message could hold several records, and before the events stream
		c.A, c.D, c.R = v[0], v[1], v[2]
	case "c2":
		c.A, c.AShown, c.D, c.R = v[0], shown(v[1]), v[2], v[3]
	case "c3":
		c.A, c.AShown, c.D, c.R, c.E = v[0], shown(v[1]), v[2], v[3], v[4]
	default:
		c.A, c.AShown, c.D, c.R, c.E, c.EShown = v[0], shown(v[1]), v[2], v[3], v[4], shown(v[5])
	}
	return c, nil
}
