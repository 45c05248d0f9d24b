// Package deadletters reads and purges a namespace's dead-letter stream (WEBHOOKS_DLQ_<ns>):
// pages of dead letters newest first (by endpoint, reason and time), one by its delivery id,
// and purges that delete what a selection takes, present when the purge began, and record it
// as the operational event webhook_operator.dlq.purged. The data API server
// (webhookdeadletters) reads and purges through it.
package deadletters

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Bounds.
const (
	// MaxLimit bounds a page.
	MaxLimit = 1000
	// DefaultMaxScan bounds the dead letters a reason filter may have to read for one page: a
	// query whose range holds more is refused.
	DefaultMaxScan = 50_000
	// purgeDeletes is how many deletes are in flight at once.
	purgeDeletes = 16
	// maxPurgeEventEndpoints bounds the endpoints the operational event counts one by one.
	maxPurgeEventEndpoints = 100
)

// Reasons are the reasons a delivery is dead-lettered.
var Reasons = []string{
	records.ReasonExhausted, records.ReasonRetryDurationExceeded, records.ReasonEndpointDisabled, records.ReasonEndpointDeleted,
	records.ReasonPayloadTooLarge, records.ReasonInvalidEvent, records.ReasonTestFailed, records.ReasonFilterFailed, records.ReasonTransformFailed,
}

// ErrBadQuery wraps what is wrong with a query.
var ErrBadQuery = errors.New("bad query")

// ErrNotFound says no dead letter has the id.
var ErrNotFound = errors.New("no such dead letter")

// Store reads and deletes dead letters.
type Store struct {
	NC      *nats.Conn
	JS      jetstream.JetStream
	Streams streams.Config
}

// Item is one stored dead letter.
type Item struct {
	records.DeadLetter
	// Readable is false for a message whose dead-letter header could not be read (DeadLetter
	// then holds only what its subject says).
	Readable bool
	Subject  string
	Seq      uint64
	StoredAt time.Time
	// Payload is the stored event body.
	Payload []byte
}

// Selection picks dead letters: of Endpoint (every one of the namespace when empty), of one
// of Reasons (any when empty), dead-lettered before Before (any time when zero).
type Selection struct {
	Endpoint string
	Reasons  []string
	Before   time.Time
}

func (s Selection) check() error {
	for _, r := range s.Reasons {
		if !slices.Contains(Reasons, r) {
			return fmt.Errorf("%w: reason %q is not a dead-letter reason: one of %s", ErrBadQuery, r, strings.Join(Reasons, ", "))
		}
	}
	return nil
}

// selects reports whether the selection takes item.
func (s Selection) selects(it *Item) bool {
	if len(s.Reasons) > 0 && (!it.Readable || !slices.Contains(s.Reasons, it.Reason)) {
		return false
	}
	if s.Before.IsZero() {
		return true
	}
	at := it.StoredAt
	if it.Readable && !it.DeadLetteredAt.IsZero() {
		at = it.DeadLetteredAt
	}
	return at.Before(s.Before)
}

func (s *Store) open(ctx context.Context, ns string) (*streamread.Stream, error) {
	if err := streams.ValidateNamespace(ns); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadQuery, err)
	}
	return streamread.Open(ctx, s.NC, s.JS, s.Streams.For(ns).DeadLetterStream())
}

func itemOf(m *streamread.Msg, ns string, names streams.Set) Item {
	it := Item{Subject: m.Subject, Seq: m.Seq, StoredAt: m.Time.UTC(), Payload: m.Data}
	dl, err := records.ParseDeadLetter(m.Header)
	if err == nil {
		it.DeadLetter, it.Readable = dl, true
		return it
	}
	it.Namespace, it.Endpoint = ns, names.EndpointOfSubject(m.Subject)
	if i := strings.LastIndexByte(m.Subject, '.'); i >= 0 {
		it.DeliveryID = m.Subject[i+1:]
	}
	return it
}

// Page is a page of dead letters, newest first; Next continues it (0: the end).
type Page struct {
	Items []Item
	Next  uint64
}

// List reads a page of limit dead letters below sequence before (0: the newest).
func (s *Store) List(ctx context.Context, ns string, sel Selection, before uint64, limit int) (Page, error) {
	var page Page
	if err := sel.check(); err != nil {
		return page, err
	}
	if limit < 1 || limit > MaxLimit {
		return page, fmt.Errorf("%w: limit %d: want 1 to %d", ErrBadQuery, limit, MaxLimit)
	}
	st, err := s.open(ctx, ns)
	if err != nil {
		return page, err
	}
	names := s.Streams.For(ns)
	filter := names.DeadLetterFilter(sel.Endpoint)
	if len(sel.Reasons) > 0 || !sel.Before.IsZero() {
		n, err := st.CountBetween(ctx, filter, 1, before)
		if err != nil {
			return page, err
		}
		if n > DefaultMaxScan {
			return page, &TooBroadError{Messages: n}
		}
	}
	rd := st.Backward(filter, before, limit+1)
	for {
		m, err := rd.Next(ctx)
		if err != nil {
			return page, err
		}
		if m == nil {
			return page, nil
		}
		it := itemOf(m, ns, names)
		if !sel.selects(&it) {
			continue
		}
		if len(page.Items) == limit {
			page.Next = page.Items[limit-1].Seq
			return page, nil
		}
		page.Items = append(page.Items, it)
	}
}

// TooBroadError refuses a reason or time filter over more dead letters than a page may read.
type TooBroadError struct{ Messages uint64 }

func (e *TooBroadError) Error() string {
	return fmt.Sprintf("selecting dead letters by reason or time reads every one in range, and the range holds %d (at most %d are read for one page): select an endpoint",
		e.Messages, DefaultMaxScan)
}

// Get reads the dead letter of delivery id.
func (s *Store) Get(ctx context.Context, ns, id string) (Item, error) {
	if id == "" || len(id) > 255 || strings.ContainsAny(id, ".*> \t\r\n") {
		return Item{}, ErrNotFound
	}
	st, err := s.open(ctx, ns)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return Item{}, ErrNotFound
	}
	if err != nil {
		return Item{}, err
	}
	m, err := st.Last(ctx, s.Streams.For(ns).DeadLetterIDFilter(id))
	if errors.Is(err, streamread.ErrNotFound) {
		return Item{}, ErrNotFound
	}
	if err != nil {
		return Item{}, err
	}
	return itemOf(m, ns, s.Streams.For(ns)), nil
}

// PurgeResult is what a purge did: how many dead letters it purged, by reason and by
// endpoint, those gone meanwhile, and the operational event that records it.
type PurgeResult struct {
	Purged     int64
	Gone       int64
	ByReason   map[string]int64
	ByEndpoint map[string]int64
	// Event is the id of the operational event; empty when nothing was purged.
	Event string
	// Unreadable counts dead letters whose header could not be read (purged only without a
	// reason filter).
	Unreadable int
	// Items are the purged dead letters, without their payloads, when the purge was asked to
	// keep them (a bounded purge).
	Items []Item
}

// Purge deletes the dead letters of namespace ns the selection takes, among those stored when
// it began (at most max, which it returns as Items, when max > 0), and records the purge as the operational event
// webhook_operator.dlq.purged, with its counts. An error after some were purged still records
// them.
func (s *Store) Purge(ctx context.Context, ns string, sel Selection, max int64, now time.Time) (PurgeResult, error) {
	res := PurgeResult{ByReason: map[string]int64{}, ByEndpoint: map[string]int64{}}
	if err := sel.check(); err != nil {
		return res, err
	}
	st, err := s.open(ctx, ns)
	if err != nil {
		return res, err
	}
	stream, err := s.JS.Stream(ctx, st.Name)
	if err != nil {
		return res, err
	}
	names := s.Streams.For(ns)
	filter := names.DeadLetterFilter(sel.Endpoint)
	from, end := st.FirstSeq, st.LastSeq+1
	var first, last uint64
	var failed error
	for from < end && failed == nil && (max <= 0 || res.Purged < max) {
		msgs, err := st.Forward(ctx, filter, from, 256)
		if err != nil {
			failed = err
			break
		}
		if len(msgs) == 0 {
			break
		}
		var batch []purged
		for i := range msgs {
			m := &msgs[i]
			if m.Seq >= end {
				from = end
				break
			}
			from = m.Seq + 1
			it := itemOf(m, ns, names)
			if !it.Readable {
				res.Unreadable++
			}
			if !sel.selects(&it) {
				continue
			}
			if max > 0 && res.Purged+int64(len(batch)) >= max {
				from = end
				break
			}
			p := purged{seq: m.Seq, endpoint: "-", reason: "-"}
			if it.Readable {
				p.endpoint, p.reason = it.Endpoint, it.Reason
			}
			if max > 0 {
				it.Payload = nil
				p.item = &it
			}
			batch = append(batch, p)
		}
		deleteAll(ctx, stream, batch)
		for _, p := range batch {
			switch {
			case p.err == nil:
				res.Purged++
				res.ByReason[p.reason]++
				res.ByEndpoint[p.endpoint]++
				if p.item != nil {
					res.Items = append(res.Items, *p.item)
				}
				if first == 0 {
					first = p.seq
				}
				last = p.seq
			case errors.Is(p.err, jetstream.ErrMsgDeleteUnsuccessful) && strings.Contains(p.err.Error(), "no message found"):
				res.Gone++
			case failed == nil:
				failed = fmt.Errorf("deleting dead letter %d of %s: %w", p.seq, st.Name, p.err)
			}
		}
	}
	if res.Purged > 0 {
		id, err := s.record(ctx, ns, sel, &res, first, last, now)
		if err != nil {
			return res, errors.Join(failed, fmt.Errorf("purged %d dead letters, but could not record the purge as an operational event: %w", res.Purged, err))
		}
		res.Event = id
	}
	return res, failed
}

// purged is one selected dead letter on its way out.
type purged struct {
	seq              uint64
	endpoint, reason string
	item             *Item
	err              error
}

// deleteAll deletes the dead letters of batch, purgeDeletes at a time, and keeps each one's
// outcome.
func deleteAll(ctx context.Context, stream jetstream.Stream, batch []purged) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, purgeDeletes)
	for i := range batch {
		sem <- struct{}{}
		wg.Add(1)
		go func(p *purged) {
			defer func() { <-sem; wg.Done() }()
			p.err = stream.DeleteMsg(ctx, p.seq)
		}(&batch[i])
	}
	wg.Wait()
}

// record publishes the operational event of a purge. Its id comes from the sequences purged,
// so the same purge recorded twice is one event.
func (s *Store) record(ctx context.Context, ns string, sel Selection, res *PurgeResult, first, last uint64, now time.Time) (string, error) {
	selector := map[string]any{"endpoint": sel.Endpoint, "reasons": sel.Reasons}
	if !sel.Before.IsZero() {
		selector["before"] = sel.Before.UTC().Format(time.RFC3339)
	}
	endpoints := map[string]int64{}
	var others int64
	eps := make([]string, 0, len(res.ByEndpoint))
	for ep := range res.ByEndpoint {
		eps = append(eps, ep)
	}
	sort.Strings(eps)
	for _, ep := range eps {
		if len(endpoints) < maxPurgeEventEndpoints {
			endpoints[ep] = res.ByEndpoint[ep]
		} else {
			others += res.ByEndpoint[ep]
		}
	}
	data := map[string]any{"count": res.Purged, "reasons": res.ByReason, "endpoints": endpoints, "selector": selector,
		"firstSequence": first, "lastSequence": last}
	if others > 0 {
		data["otherEndpoints"] = others
	}
	ev := records.NewOpsEvent(ns, sel.Endpoint, records.OpsDeadLettersPurged, fmt.Sprintf("purge.%d.%d.%d", first, last, res.Purged), now, data)
	msg, err := records.OpsEventMessage(s.Streams.For(ns).EventSubject(ev.Type), ev)
	if err != nil {
		return "", err
	}
	if _, err := s.JS.PublishMsg(ctx, msg); err != nil {
		return "", err
	}
	return ev.ID, nil
}

// Delete purges the dead letter of delivery id and records it as a purge of one.
func (s *Store) Delete(ctx context.Context, ns, id string, now time.Time) (Item, PurgeResult, error) {
	res := PurgeResult{ByReason: map[string]int64{}, ByEndpoint: map[string]int64{}}
	it, err := s.Get(ctx, ns, id)
	if err != nil {
		return it, res, err
	}
	stream, err := s.JS.Stream(ctx, s.Streams.For(ns).DeadLetterStream())
	if err != nil {
		return it, res, err
	}
	if err := stream.DeleteMsg(ctx, it.Seq); err != nil {
		if errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) && strings.Contains(err.Error(), "no message found") {
			return it, res, ErrNotFound
		}
		return it, res, err
	}
	endpoint, reason := "-", "-"
	if it.Readable {
		endpoint, reason = it.Endpoint, it.Reason
	}
	res.Purged, res.ByReason[reason], res.ByEndpoint[endpoint] = 1, 1, 1
	res.Event, err = s.record(ctx, ns, Selection{Endpoint: it.Endpoint}, &res, it.Seq, it.Seq, now)
	return it, res, err
}
