// Package streamread reads stored JetStream messages without creating consumers: subject-filtered
// gets (in batches when the stream allows direct gets, one by one otherwise) and a reader that
// walks one subject filter backwards from a sequence in growing windows. A newest-first page
// of a large stream that interleaves many subjects therefore costs about the messages it shows,
// never a scan of the stream.
//
// Consumers are not an option for the plugin and the replay engine: the deliveries stream is
// a work queue, which refuses a second consumer overlapping an endpoint's own, and a tenant's
// identity may not create consumers.
//
// Every tenant's inbox is in one account, and NATS checks no permission on the reply subject
// of a request: a connection may ask JetStream to answer into another connection's inbox. So
// each request's inbox ends in a token from a cryptographic source (never a counter or a
// time-seeded sequence), and each reply must be what was asked for: a message of this stream
// (Nats-Stream), on a subject the request's filter matches, at or after the sequence asked
// for; anything else arriving there is dropped (up to maxStray replies, then the read fails),
// so another namespace's messages can never pass as this stream's.
package streamread

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/match"
)

// Msg is one stored message.
type Msg struct {
	Subject string
	Seq     uint64
	// Time the message was stored.
	Time   time.Time
	Header nats.Header
	Data   []byte
}

// ErrNotFound says no message matched.
var ErrNotFound = errors.New("no message found")

// numPendingHeader is set by the server on the messages of a batch get: matches left after it.
const numPendingHeader = "Nats-Num-Pending"

// maxBatch bounds one batch request; maxBatchBytes bounds its payload.
const (
	maxBatch      = 256
	maxBatchBytes = 4 << 20
	// maxStray bounds the replies of one request that are not of it (another connection
	// sending to its inbox): beyond, the read fails.
	maxStray = 1000
)

// Headers of a direct get's reply: the stream it was read from, and in a batch the sequence of
// the message sent before it (0 in the first; the last one in the end of the batch).
const (
	streamHeader  = "Nats-Stream"
	lastSeqHeader = "Nats-Last-Sequence"
)

// Stream reads one stream.
type Stream struct {
	nc     *nats.Conn
	prefix string
	// Name of the stream.
	Name string
	// Direct is true when the stream allows direct gets, which can be batched.
	Direct bool
	// FirstSeq and LastSeq are the stream's bounds when it was opened.
	FirstSeq, LastSeq uint64
	// Timeout of one request without a context deadline.
	Timeout time.Duration
	// MaxBytes, when set, bounds what one Forward or ForwardFrom returns: it stops once the
	// messages' data reach it, and returns at least one message. Backward reads windows of
	// its own size.
	MaxBytes int
}

// Open looks the stream up. A missing stream gives an error wrapping
// jetstream.ErrStreamNotFound.
func Open(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, name string) (*Stream, error) {
	st, err := js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	info := st.CachedInfo()
	if info == nil || info.Config.Name != name {
		// Another connection's stream info, answered into this connection's inbox.
		return nil, fmt.Errorf("stream %s: the stream's information names another stream", name)
	}
	prefix := js.Options().APIPrefix
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	if prefix[len(prefix)-1] != '.' {
		prefix += "."
	}
	return &Stream{
		nc:       nc,
		prefix:   prefix,
		Name:     name,
		Direct:   info.Config.AllowDirect,
		FirstSeq: info.State.FirstSeq,
		LastSeq:  info.State.LastSeq,
		Timeout:  10 * time.Second,
	}, nil
}

// getRequest is the server's stream-message get request.
type getRequest struct {
	Seq       uint64     `json:"seq,omitempty"`
	LastFor   string     `json:"last_by_subj,omitempty"`
	NextFor   string     `json:"next_by_subj,omitempty"`
	Batch     int        `json:"batch,omitempty"`
	MaxBytes  int        `json:"max_bytes,omitempty"`
	StartTime *time.Time `json:"start_time,omitempty"`
}

// batchResult is what a batch returned.
type batchResult struct {
	msgs []Msg
	// pendingAfterFirst is the number of matches after the first message returned, when the
	// server said so (batch requests only).
	pendingAfterFirst uint64
	hasPending        bool
}

// Forward returns up to n messages matching filter with a sequence of at least from, oldest
// first; fewer when there are no more.
func (s *Stream) Forward(ctx context.Context, filter string, from uint64, n int) ([]Msg, error) {
	r, err := s.forward(ctx, getRequest{Seq: max(from, 1), NextFor: filter}, n, s.MaxBytes)
	return r.msgs, err
}

// ForwardFrom returns up to n messages matching filter stored at or after t, oldest first.
func (s *Stream) ForwardFrom(ctx context.Context, filter string, t time.Time, n int) ([]Msg, error) {
	if !s.Direct {
		// The plain get API has no start time: begin at the stream's start and skip older ones.
		var out []Msg
		from, size := uint64(1), 0
		for len(out) < n {
			msgs, err := s.Forward(ctx, filter, from, n)
			if err != nil || len(msgs) == 0 {
				return out, err
			}
			for _, m := range msgs {
				if !m.Time.Before(t) && len(out) < n {
					out = append(out, m)
					if size += len(m.Data); s.MaxBytes > 0 && size >= s.MaxBytes {
						return out, nil
					}
				}
			}
			from = msgs[len(msgs)-1].Seq + 1
		}
		return out, nil
	}
	t = t.UTC()
	r, err := s.forward(ctx, getRequest{StartTime: &t, NextFor: filter}, n, s.MaxBytes)
	return r.msgs, err
}

// forward reads up to n messages from req, holding at most limit bytes when that is set.
func (s *Stream) forward(ctx context.Context, req getRequest, n, limit int) (batchResult, error) {
	if n <= 0 {
		return batchResult{}, nil
	}
	size := 0
	full := func(msgs []Msg) bool {
		for i := range msgs {
			size += len(msgs[i].Data)
		}
		return limit > 0 && size >= limit
	}
	if s.Direct {
		var out batchResult
		for len(out.msgs) < n {
			req.Batch = min(n-len(out.msgs), maxBatch)
			req.MaxBytes = maxBatchBytes
			if limit > 0 {
				req.MaxBytes = min(maxBatchBytes, max(limit-size, 1))
			}
			r, err := s.directBatch(ctx, req)
			if err != nil {
				return out, err
			}
			if len(out.msgs) == 0 {
				out.pendingAfterFirst, out.hasPending = r.pendingAfterFirst, r.hasPending
			}
			out.msgs = append(out.msgs, r.msgs...)
			if full(r.msgs) {
				return out, nil
			}
			if len(r.msgs) < req.Batch {
				// Either nothing is left or the byte limit cut the batch short.
				if len(r.msgs) == 0 || !r.hasPending || r.pendingAfterFirst+1 <= uint64(len(r.msgs)) {
					return out, nil
				}
			}
			req.StartTime = nil
			req.Seq = r.msgs[len(r.msgs)-1].Seq + 1
		}
		return out, nil
	}
	var out batchResult
	for len(out.msgs) < n {
		m, err := s.get(ctx, req)
		if errors.Is(err, ErrNotFound) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out.msgs = append(out.msgs, *m)
		if full(out.msgs[len(out.msgs)-1:]) {
			return out, nil
		}
		req.Seq = m.Seq + 1
	}
	return out, nil
}

// Count returns how many messages match filter (stored at or after since, unless zero), or
// 0 when the stream does not allow direct gets and counting would mean reading them all.
func (s *Stream) Count(ctx context.Context, filter string, since time.Time) (uint64, error) {
	if !s.Direct {
		return 0, nil
	}
	req := getRequest{Seq: 1, NextFor: filter, Batch: 1}
	if !since.IsZero() {
		t := since.UTC()
		req.Seq, req.StartTime = 0, &t
	}
	r, err := s.directBatch(ctx, req)
	if err != nil || len(r.msgs) == 0 || !r.hasPending {
		return 0, err
	}
	return r.pendingAfterFirst + 1, nil
}

// CountBetween returns how many messages match filter with a sequence of at least from and
// below before (0: no upper bound), from the server's counts (two requests at most), without
// reading them. A stream without direct gets cannot count: it reports its whole span.
func (s *Stream) CountBetween(ctx context.Context, filter string, from, before uint64) (uint64, error) {
	from = max(from, 1)
	if before != 0 && before <= from {
		return 0, nil
	}
	if !s.Direct {
		upper := s.LastSeq + 1
		if before != 0 {
			upper = min(upper, before)
		}
		if upper <= from {
			return 0, nil
		}
		return upper - from, nil
	}
	atOrAfter := func(seq uint64) (uint64, error) {
		r, err := s.directBatch(ctx, getRequest{Seq: seq, NextFor: filter, Batch: 1})
		if err != nil || len(r.msgs) == 0 {
			return 0, err
		}
		if !r.hasPending {
			return 1, nil
		}
		return r.pendingAfterFirst + 1, nil
	}
	n, err := atOrAfter(from)
	if err != nil || n == 0 || before == 0 {
		return n, err
	}
	above, err := atOrAfter(before)
	if err != nil {
		return 0, err
	}
	if above > n {
		return 0, nil
	}
	return n - above, nil
}

// Last returns the newest message matching filter, which may hold wildcards.
func (s *Stream) Last(ctx context.Context, filter string) (*Msg, error) {
	req := getRequest{LastFor: filter}
	if s.Direct {
		return s.directOne(ctx, req)
	}
	return s.get(ctx, req)
}

func (s *Stream) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.Timeout)
}

// get uses the stream-message get API (one message per request).
func (s *Stream) get(ctx context.Context, req getRequest) (*Msg, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	body, _ := json.Marshal(req)
	var r struct {
		Type  string `json:"type"`
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	// The reply of the plain get API names no stream: it must be a get's answer, and its
	// message one the request asked for.
	_, err := s.request(ctx, s.prefix+"STREAM.MSG.GET."+s.Name, body, func(m *nats.Msg) bool {
		r.Type, r.Error, r.Message = "", nil, nil
		if json.Unmarshal(m.Data, &r) != nil || r.Type != "io.nats.jetstream.api.v1.stream_msg_get_response" {
			return false
		}
		return r.Message == nil || s.asked(req, r.Message.Subject, r.Message.Seq)
	})
	if err != nil {
		return nil, err
	}
	if r.Error != nil {
		if r.Error.Code == 404 || r.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound) {
			return nil, ErrNotFound
		}
		return nil, fmt.Errorf("reading stream %s: %s", s.Name, r.Error.Description)
	}
	if r.Message == nil {
		return nil, ErrNotFound
	}
	m := &Msg{Subject: r.Message.Subject, Seq: r.Message.Seq, Time: r.Message.Time, Data: r.Message.Data}
	if len(r.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return nil, fmt.Errorf("reading stream %s: message %d: %w", s.Name, m.Seq, err)
		}
	}
	return m, nil
}

// directOne is a single direct get.
func (s *Stream) directOne(ctx context.Context, req getRequest) (*Msg, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	body, _ := json.Marshal(req)
	resp, err := s.request(ctx, s.prefix+"DIRECT.GET."+s.Name, body, func(m *nats.Msg) bool { return s.ofRequest(req, m, 0) })
	if err != nil {
		return nil, err
	}
	m, eob, err := s.parseDirect(resp)
	if err != nil {
		return nil, err
	}
	if eob || m == nil {
		return nil, ErrNotFound
	}
	return m, nil
}

// directBatch sends one batch direct get and collects the replies up to the end-of-batch.
func (s *Stream) directBatch(ctx context.Context, req getRequest) (batchResult, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var out batchResult
	// A plain inbox: a response inbox would also match the connection's request wildcard.
	inbox, err := s.inbox()
	if err != nil {
		return out, err
	}
	// Room for the batch, its end and a few strays.
	sub, replies, err := s.subscribe(inbox, req.Batch+replyRoom)
	if err != nil {
		return out, err
	}
	defer release(sub, replies)
	body, _ := json.Marshal(req)
	if err := s.nc.PublishRequest(s.prefix+"DIRECT.GET."+s.Name, inbox, body); err != nil {
		return out, fmt.Errorf("reading stream %s: %w", s.Name, err)
	}
	stray := 0
	for {
		resp, err := next(ctx, replies)
		if err != nil {
			return out, fmt.Errorf("reading stream %s: %w", s.Name, err)
		}
		// Each message of the batch comes after the last one, in the stream and the filter, and
		// says which one that was (Nats-Last-Sequence, 0 in the first), as the end of the
		// batch does: another request's replies do not continue this chain.
		var after uint64
		if n := len(out.msgs); n > 0 {
			after = out.msgs[n-1].Seq
		}
		if !s.ofRequest(req, resp, after) || !continues(resp, after) {
			if stray++; stray > maxStray {
				return out, s.strayError()
			}
			continue
		}
		m, eob, err := s.parseDirect(resp)
		if err != nil {
			return out, err
		}
		if eob || m == nil {
			return out, nil
		}
		if len(out.msgs) == 0 {
			if np, err := strconv.ParseUint(m.Header.Get(numPendingHeader), 10, 64); err == nil {
				out.pendingAfterFirst, out.hasPending = np, true
			}
		}
		out.msgs = append(out.msgs, *m)
	}
}

// replyRoom is the room a read's subscription keeps beyond the replies it asked for: the end of
// a batch, a status, and as many strays as a read passes over before it gives up (maxStray), so
// a connection flooding the inbox ends the read with strayError, never by dropping its replies
// (8 KiB of channel, where a sync subscription's is 512 KiB).
const replyRoom = maxStray + 16

// subscribe subscribes to a read's inbox with room for n replies. A sync subscription would
// make a channel of the connection's default length (65,536 slots, 512 KiB) for every read:
// a fold polling every 250 ms made 2 MiB of garbage a second in an idle dispatcher. The
// channel is one a read done before gave back (release), when one is there with that room.
func (s *Stream) subscribe(inbox string, n int) (*nats.Subscription, chan *nats.Msg, error) {
	ch, _ := replyChans.Get().(chan *nats.Msg)
	if cap(ch) < n {
		if ch != nil {
			replyChans.Put(ch)
		}
		ch = make(chan *nats.Msg, n)
	}
	sub, err := s.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		replyChans.Put(ch)
		return nil, nil, err
	}
	return sub, ch, nil
}

// replyChans are reply channels of reads done, empty, to be used again: each has room for a
// batch and maxStray strays (about 10 KiB), and an idle dispatcher's followers of the bucket
// read every 250 ms each (80 KB of garbage a second, before).
var replyChans sync.Pool

// release ends a read's subscription and gives its channel back to replyChans, emptied. Once
// Unsubscribe has returned nothing more is sent to the channel (nats.go drops the
// subscription's channel under its lock); a channel whose subscription could not be ended is
// left to the collector.
func release(sub *nats.Subscription, ch chan *nats.Msg) {
	if err := sub.Unsubscribe(); err != nil {
		return
	}
	for {
		select {
		case <-ch:
		default:
			replyChans.Put(ch)
			return
		}
	}
}

// next is the next reply, or ctx's error (every read has a deadline: Stream.ctx).
func next(ctx context.Context, replies <-chan *nats.Msg) (*nats.Msg, error) {
	select {
	case m := <-replies:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// inbox is a new inbox of the connection ending in a token from a cryptographic source, so
// that no other connection can guess where this request's replies go.
func (s *Stream) inbox() (string, error) {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	prefix := s.nc.Opts.InboxPrefix
	if prefix == "" {
		prefix = nats.InboxPrefix[:len(nats.InboxPrefix)-1]
	}
	return prefix + "." + base64.RawURLEncoding.EncodeToString(b), nil
}

// request sends body to subject with a new inbox as its reply and returns the first reply
// accept takes; the others are dropped. A "no responders" status ends it with
// nats.ErrNoResponders.
func (s *Stream) request(ctx context.Context, subject string, body []byte, accept func(*nats.Msg) bool) (*nats.Msg, error) {
	inbox, err := s.inbox()
	if err != nil {
		return nil, err
	}
	sub, replies, err := s.subscribe(inbox, 1+replyRoom)
	if err != nil {
		return nil, err
	}
	defer release(sub, replies)
	if err := s.nc.PublishRequest(subject, inbox, body); err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", s.Name, err)
	}
	for stray := 0; stray <= maxStray; stray++ {
		m, err := next(ctx, replies)
		if err != nil {
			return nil, fmt.Errorf("reading stream %s: %w", s.Name, err)
		}
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			return nil, fmt.Errorf("reading stream %s: %w", s.Name, nats.ErrNoResponders)
		}
		if accept(m) {
			return m, nil
		}
	}
	return nil, s.strayError()
}

// matches reports whether the literal subject matches filter: a pattern covering a literal
// subject matches it (match.Covers checks tokens only, so '$' and the like need no rule).
func matches(filter, subject string) bool {
	return subject != "" && match.Covers(filter, subject)
}

func (s *Stream) strayError() error {
	return fmt.Errorf("reading stream %s: more than %d replies on the request's inbox were not of this stream: another connection is sending to it", s.Name, maxStray)
}

// asked reports whether a message of subject and seq is one req asks for: on the subject it
// names (a filter's match), at the sequence it names, or at or after it for a next-by-subject.
func (s *Stream) asked(req getRequest, subject string, seq uint64) bool {
	switch {
	case req.LastFor != "":
		return matches(req.LastFor, subject)
	case req.NextFor != "":
		return matches(req.NextFor, subject) && seq >= req.Seq
	default:
		return seq == req.Seq
	}
}

// ofRequest reports whether a direct get's reply answers req: a status (which names no
// stream), or a message of this stream that req asks for, after the sequence after (0: none).
func (s *Stream) ofRequest(req getRequest, m *nats.Msg, after uint64) bool {
	if m.Header.Get("Status") != "" && len(m.Data) == 0 {
		return true
	}
	if m.Header.Get(streamHeader) != s.Name {
		return false
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil || seq <= after {
		return false
	}
	if req.StartTime != nil && req.Seq == 0 {
		// A start time names no sequence: the filter and the order still hold.
		return req.NextFor == "" || matches(req.NextFor, m.Header.Get(jetstream.SubjectHeader))
	}
	return s.asked(req, m.Header.Get(jetstream.SubjectHeader), seq)
}

// continues reports whether a reply of a batch follows the message at sequence after (0: none
// yet): its Nats-Last-Sequence names it. A reply without the header (a status other than the
// end of a batch) ends the batch as it says.
func continues(m *nats.Msg, after uint64) bool {
	last := m.Header.Get(lastSeqHeader)
	if last == "" {
		return m.Header.Get("Status") != "" && m.Header.Get("Status") != "204"
	}
	return last == strconv.FormatUint(after, 10)
}

// parseDirect reads one direct-get reply: a message, the end of a batch (eob), or nothing.
func (s *Stream) parseDirect(resp *nats.Msg) (m *Msg, eob bool, err error) {
	if status := resp.Header.Get("Status"); status != "" && len(resp.Data) == 0 {
		switch status {
		case "204":
			return nil, true, nil
		case "404":
			return nil, false, nil
		default:
			return nil, false, fmt.Errorf("reading stream %s: %s %s", s.Name, status, resp.Header.Get("Description"))
		}
	}
	seq, err := strconv.ParseUint(resp.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, false, fmt.Errorf("reading stream %s: reply without a sequence", s.Name)
	}
	t, _ := time.Parse(time.RFC3339Nano, resp.Header.Get(jetstream.TimeStampHeaer))
	return &Msg{
		Subject: resp.Header.Get(jetstream.SubjectHeader),
		Seq:     seq,
		Time:    t,
		Header:  resp.Header,
		Data:    resp.Data,
	}, false, nil
}

// Backward walks the messages matching one filter from newest to oldest, below a sequence.
// It reads a window of sequences at a time, oldest first within the window, and grows the
// next window from the density it saw, aiming at `want` messages per window.
type Backward struct {
	s      *Stream
	filter string
	want   int
	// lo is the lowest sequence already covered; everything from lo up was read.
	lo uint64
	// bound is the exclusive upper bound of what Next has not returned yet.
	bound  uint64
	window uint64
	// above is the number of matches at or above lo, when known, to size batches exactly.
	above      uint64
	aboveKnown bool
	buf        []Msg // newest last
	done       bool
}

// Backward returns a reader of the messages matching filter with a sequence below before
// (0: from the newest), aiming at want messages per window.
func (s *Stream) Backward(filter string, before uint64, want int) *Backward {
	want = max(want, 1)
	b := &Backward{s: s, filter: filter, want: want, window: uint64(want) * 2}
	if before == 0 || before > s.LastSeq+1 {
		before = s.LastSeq + 1
		b.aboveKnown = true
	}
	b.lo, b.bound = before, before
	if s.LastSeq == 0 {
		b.done = true
	}
	return b
}

// Bound is the exclusive upper bound of the messages Next has not returned yet: a reader
// created with Backward(filter, Bound(), want) continues where this one stands.
func (b *Backward) Bound() uint64 { return b.bound }

// Peek returns the next message without consuming it, or nil at the end.
func (b *Backward) Peek(ctx context.Context) (*Msg, error) {
	for len(b.buf) == 0 && !b.done {
		if err := b.fill(ctx); err != nil {
			return nil, err
		}
	}
	if len(b.buf) == 0 {
		return nil, nil
	}
	return &b.buf[len(b.buf)-1], nil
}

// Next returns the next older message, or nil at the end.
func (b *Backward) Next(ctx context.Context) (*Msg, error) {
	m, err := b.Peek(ctx)
	if m == nil || err != nil {
		return nil, err
	}
	b.buf = b.buf[:len(b.buf)-1]
	b.bound = m.Seq
	return m, nil
}

// fill reads the next window below lo.
func (b *Backward) fill(ctx context.Context) error {
	first := max(b.s.FirstSeq, 1)
	upper := b.lo
	if upper <= first {
		b.done = true
		return nil
	}
	start := first
	if upper-first > b.window {
		start = upper - b.window
	}
	var msgs []Msg
	if b.s.Direct {
		// One message first: it says how many matches lie at or above it, so the rest of the
		// window is fetched in exactly sized batches instead of reading past the window.
		r, err := b.s.forward(ctx, getRequest{Seq: start, NextFor: b.filter}, 1, 0)
		if err != nil {
			return err
		}
		if len(r.msgs) == 1 && r.msgs[0].Seq < upper {
			msgs = append(msgs, r.msgs[0])
			// The window's size bounds how many matches it holds; the counts say exactly, unless
			// messages were appended or removed meanwhile (rest then reads on or stops early).
			expected := upper - r.msgs[0].Seq
			if r.hasPending && b.aboveKnown && r.pendingAfterFirst+1 >= b.above {
				expected = min(expected, r.pendingAfterFirst+1-b.above)
			}
			if r.hasPending {
				b.above, b.aboveKnown = r.pendingAfterFirst+1, true
			}
			msgs, err = b.rest(ctx, msgs, upper, int(min(max(expected, 2)-1, uint64(maxBatch))))
			if err != nil {
				return err
			}
		} else if len(r.msgs) == 1 && r.hasPending {
			b.above, b.aboveKnown = r.pendingAfterFirst+1, true
		} else if len(r.msgs) == 0 {
			b.above, b.aboveKnown = 0, true
		}
	} else {
		from := start
		for {
			m, err := b.s.get(ctx, getRequest{Seq: from, NextFor: b.filter})
			if errors.Is(err, ErrNotFound) {
				break
			}
			if err != nil {
				return err
			}
			if m.Seq >= upper {
				break
			}
			msgs = append(msgs, *m)
			from = m.Seq + 1
		}
	}
	b.buf = msgs // oldest first: Next takes from the end
	b.lo = start
	if start <= first {
		// Nothing is left below this window.
		b.done = true
	}
	b.grow(len(msgs))
	return nil
}

// rest reads the remaining matches of a window after the first one, in batches of size
// (adjusted as the window proves larger), until it reaches upper.
func (b *Backward) rest(ctx context.Context, msgs []Msg, upper uint64, size int) ([]Msg, error) {
	for {
		if msgs[len(msgs)-1].Seq+1 >= upper {
			return msgs, nil
		}
		size = max(size, 1)
		r, err := b.s.forward(ctx, getRequest{Seq: msgs[len(msgs)-1].Seq + 1, NextFor: b.filter}, size, 0)
		if err != nil {
			return nil, err
		}
		for _, m := range r.msgs {
			if m.Seq >= upper {
				return msgs, nil
			}
			msgs = append(msgs, m)
		}
		if len(r.msgs) < size {
			return msgs, nil
		}
		size = min(size*2, maxBatch)
	}
}

// grow sizes the next window from the density of matches in the last one.
func (b *Backward) grow(found int) {
	const maxWindow = 1 << 40
	next := b.window * 8
	if found > 0 {
		next = b.window * uint64(b.want) / uint64(found)
		next = max(next, uint64(b.want))
		next = min(next, b.window*8)
	}
	b.window = min(max(next, 1), maxWindow)
}
