// Package pull is the dispatcher's JetStream pull client: one subscription brings the messages
// of every durable consumer it pulls (a Source each), requested as their workers have room,
// with no goroutine per consumer. It knows the stream layout's consumers only by name.
package pull

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Puller brings the messages of every worker of a dispatcher over one subscription. A Source
// is one durable consumer pulled by one worker; it keeps as many messages requested from the
// server as its worker wants (SetWant), re-requesting as requests are fulfilled or expire, with
// no goroutine of its own: an idle endpoint costs one pull request waiting at the server (with
// a heartbeat every idleHeartbeat), and nothing in this process but a few hundred bytes.
//
// Requests never end early: a worker that wants nothing more stops asking and settles what
// still arrives (a paused worker hands it back), so no message is ever stranded at a
// subscription that went away (the server would keep it until its ack wait ran out).
type Puller struct {
	nc        *nats.Conn
	apiPrefix string
	// inbox prefixes every request's reply subject: <inbox><source>.<request>. A new one after
	// every reconnect (renewInbox).
	inbox atomic.Pointer[string]
	// epoch counts the connections made again: a message received in an earlier one may have
	// been delivered again since (see Stamp.Again).
	epoch     atomic.Uint64
	pullBytes int
	log       logr.Logger

	sub *nats.Subscription

	// foreign, when set (auth callout), says a stream is another namespace's: a consumer
	// there is pulled only once the connection was granted it (see Regrant).
	foreign func(stream string) bool
	// granted are the consumers on foreign streams the last (re)connection was asked with.
	granted map[string]bool
	regrant chan struct{}
	// asked is when a renewal was last asked for (unix nanoseconds).
	asked atomic.Int64

	// idleExpiry is how long an idle source's request lasts (nanoseconds; SetIdleExpiry).
	idleExpiry atomic.Int64
	// quiet stops every source's requests (SetQuiet); received counts the messages received.
	quiet    atomic.Bool
	received atomic.Uint64

	mu       sync.Mutex
	sources  map[uint64]*Source
	byCons   map[consumerKey]*Source
	nextID   uint64
	stopped  chan struct{}
	stopOnce sync.Once
}

type consumerKey struct{ stream, consumer string }

// Request sizing and liveness.
const (
	// busyExpiry and busyHeartbeat shape the requests of a source that received messages
	// lately; idleExpiry and idleHeartbeat those of an idle one (fewer messages while idle).
	busyExpiry    = 30 * time.Second
	busyHeartbeat = 5 * time.Second
	idleExpiry    = 90 * time.Second
	// A source whose requests with a heartbeat have heard nothing (message, heartbeat or
	// status) for two heartbeats and this grace has lost them (a consumer leader moved, a
	// server went away): they are forgotten and requested again. An idle request has no
	// heartbeat (thousands of idle endpoints would hear little else); it is lost when it has
	// not ended this grace after it expired.
	lostGrace = 2 * time.Second
	// sweepEvery is how often lost requests and missing consumers are looked at.
	sweepEvery = time.Second
	// missingRetry is how soon a consumer that did not exist is asked again.
	missingRetry = 2 * time.Second
	// maxBatch bounds one request.
	maxBatch = 1024
	// regrantDelay is how long a new consumer on a foreign stream waits before the connection
	// is renewed (so that the controller, which made the consumer, answers the callout with
	// it); regrantEvery bounds how often it is renewed.
	regrantDelay = time.Second
	regrantEvery = 10 * time.Second
)

// NewPuller subscribes to the replies of every request it will make. pullBytes bounds what one
// request may bring. foreign, when set, says which streams are other namespaces' (see Regrant).
func NewPuller(nc *nats.Conn, pullBytes int, foreign func(stream string) bool, log logr.Logger) (*Puller, error) {
	p := &Puller{nc: nc, apiPrefix: "$JS.API.", pullBytes: pullBytes, log: log,
		foreign: foreign, granted: map[string]bool{}, regrant: make(chan struct{}, 1),
		sources: map[uint64]*Source{}, byCons: map[consumerKey]*Source{}, stopped: make(chan struct{})}
	p.idleExpiry.Store(int64(idleExpiry))
	if err := p.renewInbox(); err != nil {
		return nil, err
	}
	go p.regrants()
	status := nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	go func() {
		t := time.NewTicker(sweepEvery)
		defer t.Stop()
		for {
			select {
			case <-p.stopped:
				nc.RemoveStatusListener(status)
				return
			case s := <-status:
				if s == nats.CLOSED {
					return
				}
				p.epoch.Add(1)
				// The requests made before a reconnect are forgotten, and a new inbox leaves them
				// without interest, so the server hands them nothing more (delivered to the old
				// inbox, now resubscribed, what they took would be lost to the requests' count
				// and come again only after the consumers' ack wait). The new connection was
				// granted the foreign consumers known when it was asked for.
				if err := p.renewInbox(); err != nil {
					p.log.Info("a new inbox for pull requests after a reconnect", "error", err.Error())
				}
				p.grantAll()
				p.each(func(s *Source) { s.reset() })
			case <-t.C:
				p.each(func(s *Source) { s.sweep(time.Now()) })
			}
		}
	}()
	return p, nil
}

// Regrant asks for the connection to be renewed, so that the auth callout grants the
// dispatcher the consumers the controller made since on other namespaces' events streams: a
// bus identity's permissions are decided when it connects. Calls within regrantEvery of the
// last renewal wait for it to pass.
func (p *Puller) Regrant() {
	p.asked.Store(time.Now().UnixNano())
	select {
	case p.regrant <- struct{}{}:
	default:
	}
}

// regrants renews the connection when asked, at most every regrantEvery.
func (p *Puller) regrants() {
	var last time.Time
	for {
		select {
		case <-p.stopped:
			return
		case <-p.regrant:
		}
		wait := max(regrantDelay, time.Until(last.Add(regrantEvery)))
		select {
		case <-p.stopped:
			return
		case <-time.After(wait):
		}
		if !last.IsZero() && p.asked.Load() < last.UnixNano() {
			// Asked before the last renewal began, which granted what was asked for then:
			// another would only cost the pull requests on their way again.
			continue
		}
		last = time.Now()
		p.mu.Lock()
		for _, s := range p.sources {
			if p.foreign != nil && p.foreign(s.key.stream) {
				p.granted[s.key.consumer] = true // asked for now; confirmed by the reconnect
			}
		}
		p.mu.Unlock()
		p.log.Info("renewing the NATS connection for consumers on other namespaces' events streams")
		if err := p.nc.ForceReconnect(); err != nil {
			p.log.Info("renewing the NATS connection", "error", err.Error())
		}
	}
}

// grantAll marks every foreign source as granted (after a reconnection) and releases them.
func (p *Puller) grantAll() {
	if p.foreign == nil {
		return
	}
	p.mu.Lock()
	var held []*Source
	// What the connection holds now: the foreign sources there are (a closed one asks again).
	p.granted = map[string]bool{}
	for _, s := range p.sources {
		if p.foreign(s.key.stream) {
			p.granted[s.key.consumer] = true
			held = append(held, s)
		}
	}
	p.mu.Unlock()
	for _, s := range held {
		s.mu.Lock()
		s.held = false
		s.mu.Unlock()
	}
}

// PermissionDenied tells the puller the server refused a publish (an asynchronous error of
// the connection): a refused pull on a foreign consumer renews the connection.
func (p *Puller) PermissionDenied(err error) {
	if p.foreign != nil && err != nil && strings.Contains(err.Error(), p.apiPrefix+"CONSUMER.MSG.NEXT.") {
		p.Regrant()
	}
}

// renewInbox subscribes to the replies of a new inbox and ends the subscription of the last
// one: requests still waiting at the server under the old inbox have no interest left.
func (p *Puller) renewInbox() error {
	inbox := p.nc.NewInbox() + "."
	sub, err := p.nc.Subscribe(inbox+">", p.receive)
	if err != nil {
		return err
	}
	// What arrives is bounded by what was requested (and the byte budget's pulls): never drop.
	_ = sub.SetPendingLimits(-1, -1)
	p.mu.Lock()
	old := p.sub
	p.sub = sub
	p.inbox.Store(&inbox)
	p.mu.Unlock()
	if old != nil {
		_ = old.Unsubscribe()
	}
	return nil
}

// SetIdleExpiry sets how long an idle source's request lasts (0: the default, 90 s), and
// bounds a busy one's: how long a request may outlive the dispatcher that made it (see
// SetQuiet).
func (p *Puller) SetIdleExpiry(d time.Duration) {
	if d > 0 {
		p.idleExpiry.Store(int64(d))
	}
}

// SetQuiet stops (true) or resumes (false) every source's requests. While quiet, no request is
// made and those outstanding run out (what they bring is handled as always), so that once
// Quiesced says none is left the connection may close with nothing asked of the server: a
// request whose reply crossed the account boundary keeps its interest on the consumer
// leader's server until it expires, and a message the server hands it then waits for the
// consumer's ack wait.
func (p *Puller) SetQuiet(on bool) {
	p.quiet.Store(on)
	if !on {
		p.each(func(s *Source) {
			s.mu.Lock()
			s.refillAndUnlock(time.Now(), false)
		})
	}
}

// Quiesced reports whether no request is outstanding, and how many messages were received in
// all.
func (p *Puller) Quiesced() (none bool, received uint64) {
	n := 0
	p.each(func(s *Source) {
		s.mu.Lock()
		n += len(s.reqs)
		s.mu.Unlock()
	})
	return n == 0, p.received.Load()
}

// Stop ends the subscription; sources stop requesting.
func (p *Puller) Stop() {
	p.stopOnce.Do(func() {
		close(p.stopped)
		p.mu.Lock()
		sub := p.sub
		p.mu.Unlock()
		_ = sub.Unsubscribe()
	})
}

func (p *Puller) expiry() time.Duration { return time.Duration(p.idleExpiry.Load()) }

func (p *Puller) each(f func(*Source)) {
	p.mu.Lock()
	all := make([]*Source, 0, len(p.sources))
	for _, s := range p.sources {
		all = append(all, s)
	}
	p.mu.Unlock()
	for _, s := range all {
		f(s)
	}
}

// Handler is what a source tells its worker.
type Handler interface {
	// Pulled hands over a message; it is called on the puller's goroutine and must not block.
	Pulled(m *Msg)
	// SourceChanged says the source's consumer went missing or came back.
	SourceChanged()
}

// Source is one consumer pulled for one worker.
type Source struct {
	p        *Puller
	id       string
	key      consumerKey
	subject  string
	handler  Handler
	maxBytes int

	mu          sync.Mutex
	want        int
	outstanding int
	reqs        map[uint64]*pullReq
	order       []uint64 // request ids, oldest first, to account messages to
	nextReq     uint64
	lastHeard   time.Time
	busy        bool // the source received messages since its last idle request
	missing     bool
	missingAt   time.Time
	// held says the source waits for the connection to be granted its consumer.
	held bool
	// oversize says a request ended on a message larger than its max_bytes: the next asks
	// for that one message alone, with no byte bound, so it is delivered or dead-lettered
	// instead of blocking the consumer for good (a message stored through an account with a
	// larger max_payload than the dispatcher's).
	oversize bool
	closed   bool
	// maxSeq is the highest stream sequence the source received: a consumer delivers new
	// messages in stream order, so one at or below it was delivered before, whatever its
	// delivery count says (a consumer's new leader may count from 1 again).
	maxSeq uint64
	// nextCheck is when sweep next has something to look at (unix nanoseconds).
	nextCheck atomic.Int64
}

type pullReq struct {
	remaining int
	heartbeat time.Duration
	// deadline is when the request, had it ended, would have said so.
	deadline time.Time
}

// Source registers the consumer stream/consumer of a worker.
func (p *Puller) Source(stream, consumer string, h Handler) *Source {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nextID++
	s := &Source{p: p, id: strconv.FormatUint(p.nextID, 36), key: consumerKey{stream, consumer},
		subject: p.apiPrefix + "CONSUMER.MSG.NEXT." + stream + "." + consumer, handler: h, maxBytes: p.pullBytes, reqs: map[uint64]*pullReq{}}
	p.sources[p.nextID] = s
	p.byCons[s.key] = s
	if p.foreign != nil && p.foreign(stream) && !p.granted[consumer] {
		s.held = true
		p.Regrant()
	}
	return s
}

// Close forgets the source: nothing more is requested; what still arrives for it is handed
// back to the server.
func (s *Source) Close() {
	s.mu.Lock()
	s.closed, s.want = true, 0
	s.mu.Unlock()
	p := s.p
	p.mu.Lock()
	id, _ := strconv.ParseUint(s.id, 36, 64)
	delete(p.sources, id)
	if p.byCons[s.key] == s {
		delete(p.byCons, s.key)
	}
	p.mu.Unlock()
}

// SetWant sets how many messages the worker wants requested and not yet received, and
// requests more when enough are missing.
func (s *Source) SetWant(n int) {
	s.mu.Lock()
	s.want = max(n, 0)
	send := s.refillLocked(time.Now())
	s.mu.Unlock()
	s.send(send)
}

// Missing reports whether the source's consumer did not exist at the last request.
func (s *Source) Missing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.missing
}

// Outstanding is how many messages are requested and not yet received.
func (s *Source) Outstanding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outstanding
}

type pullRequest struct {
	Batch     int   `json:"batch"`
	MaxBytes  int   `json:"max_bytes,omitempty"`
	Expires   int64 `json:"expires"`
	Heartbeat int64 `json:"idle_heartbeat,omitempty"`
}

type outgoing struct {
	reply string
	body  []byte
}

// refillLocked decides the next request: what is wanted beyond what is outstanding, once at
// least half of it (or all, when nothing is outstanding) is missing.
func (s *Source) refillLocked(now time.Time) *outgoing {
	if s.closed || s.missing || s.held || s.p.quiet.Load() {
		return nil
	}
	need := s.want - s.outstanding
	if need <= 0 || (s.outstanding > 0 && need < (s.want+1)/2) {
		return nil
	}
	n, maxBytes := min(need, maxBatch), s.maxBytes
	if s.oversize {
		if s.outstanding > 0 {
			return nil
		}
		n, maxBytes = 1, 0
	}
	exp, hb := s.p.expiry(), time.Duration(0)
	if s.busy {
		// Never longer than an idle one (SetIdleExpiry bounds how long any request lasts).
		exp, hb = min(busyExpiry, exp), busyHeartbeat
		if 2*hb >= exp {
			hb = 0
		}
	}
	s.busy = false
	s.nextReq++
	r := &pullReq{remaining: n, heartbeat: hb, deadline: now.Add(exp + lostGrace)}
	s.reqs[s.nextReq] = r
	next := r.deadline
	if hb > 0 {
		next = now.Add(2*hb + lostGrace)
	}
	if next.UnixNano() < s.nextCheck.Load() {
		s.nextCheck.Store(next.UnixNano())
	}
	s.order = append(s.order, s.nextReq)
	s.outstanding += n
	if len(s.reqs) == 1 {
		s.lastHeard = now
	}
	body, _ := json.Marshal(pullRequest{Batch: n, MaxBytes: maxBytes, Expires: int64(exp), Heartbeat: int64(hb)})
	return &outgoing{reply: *s.p.inbox.Load() + s.id + "." + strconv.FormatUint(s.nextReq, 36), body: body}
}

func (s *Source) send(o *outgoing) {
	if o == nil {
		return
	}
	if err := s.p.nc.PublishRequest(s.subject, o.reply, o.body); err != nil {
		s.p.log.V(1).Info("pull request", "consumer", s.key.consumer, "error", err.Error())
		s.mu.Lock()
		s.dropAllLocked()
		s.mu.Unlock()
	}
}

// dropAllLocked forgets every request (they were lost).
func (s *Source) dropAllLocked() {
	s.reqs, s.order, s.outstanding = map[uint64]*pullReq{}, nil, 0
}

// reset forgets every request after a reconnect and requests again.
func (s *Source) reset() {
	s.mu.Lock()
	s.dropAllLocked()
	s.missing = false
	o := s.refillLocked(time.Now())
	s.mu.Unlock()
	s.send(o)
}

// sweep forgets requests that went silent and asks a missing consumer again. A source with
// nothing to look at before nextCheck is passed over without a lock (thousands of idle ones).
func (s *Source) sweep(now time.Time) {
	if now.UnixNano() < s.nextCheck.Load() {
		return
	}
	s.mu.Lock()
	changed := false
	if s.missing && now.Sub(s.missingAt) >= missingRetry {
		s.missing, changed = false, true
	}
	for id, r := range s.reqs {
		if r.heartbeat > 0 && now.Sub(s.lastHeard) > 2*r.heartbeat+lostGrace {
			s.dropAllLocked()
			break
		}
		if now.After(r.deadline) {
			s.endLocked(id)
		}
	}
	s.refillAndUnlock(now, changed)
}

// refillAndUnlock requests what is missing, notes when to look again, unlocks, and tells the
// worker when the consumer went missing or came back.
func (s *Source) refillAndUnlock(now time.Time, changed bool) {
	o := s.refillLocked(now)
	s.nextCheck.Store(s.nextCheckLocked())
	s.mu.Unlock()
	s.send(o)
	if changed {
		s.handler.SourceChanged()
	}
}

// nextCheckLocked is when sweep has something to look at next.
func (s *Source) nextCheckLocked() int64 {
	next := int64(math.MaxInt64)
	if s.missing {
		next = s.missingAt.Add(missingRetry).UnixNano()
	}
	for _, r := range s.reqs {
		next = min(next, r.deadline.UnixNano())
		if r.heartbeat > 0 {
			next = min(next, s.lastHeard.Add(2*r.heartbeat+lostGrace).UnixNano())
		}
	}
	return next
}

// receive handles every reply: messages (their ack subject names the consumer) and the
// statuses of requests (their subject names the request).
func (p *Puller) receive(m *nats.Msg) {
	if m.Reply != "" && (len(m.Data) > 0 || m.Header.Get("Status") == "") {
		p.message(m)
		return
	}
	rest, ok := strings.CutPrefix(m.Subject, *p.inbox.Load())
	if !ok {
		return
	}
	srcTok, reqTok, _ := strings.Cut(rest, ".")
	sid, err1 := strconv.ParseUint(srcTok, 36, 64)
	rid, err2 := strconv.ParseUint(reqTok, 36, 64)
	if err1 != nil || err2 != nil {
		return
	}
	p.mu.Lock()
	s := p.sources[sid]
	p.mu.Unlock()
	if s != nil {
		s.status(rid, m)
	}
}

// message hands a message to its source's worker, or back to the server when no worker takes
// it any more.
func (p *Puller) message(m *nats.Msg) {
	p.received.Add(1)
	pm := &Msg{Msg: m, Stamp: Stamp{p: p, epoch: p.epoch.Load()}}
	md, err := m.Metadata()
	if err != nil {
		return
	}
	pm.Meta = md
	p.mu.Lock()
	s := p.byCons[consumerKey{md.Stream, md.Consumer}]
	p.mu.Unlock()
	if s == nil {
		_ = m.Nak()
		return
	}
	pm.Source = s
	s.mu.Lock()
	s.lastHeard, s.busy, s.oversize = time.Now(), true, false
	pm.Stamp.resent = md.Sequence.Stream <= s.maxSeq
	s.maxSeq = max(s.maxSeq, md.Sequence.Stream)
	s.accountLocked(1)
	o := s.refillLocked(s.lastHeard)
	closed := s.closed
	s.mu.Unlock()
	if closed {
		_ = m.Nak()
		return
	}
	s.send(o)
	s.handler.Pulled(pm)
}

// endLocked forgets request rid and what it had still to bring.
func (s *Source) endLocked(rid uint64) {
	r := s.reqs[rid]
	if r == nil {
		return
	}
	s.outstanding -= r.remaining
	delete(s.reqs, rid)
	for i, id := range s.order {
		if id == rid {
			s.order = append(s.order[:i:i], s.order[i+1:]...)
			break
		}
	}
}

// accountLocked counts n received messages against the oldest requests.
func (s *Source) accountLocked(n int) {
	for n > 0 && len(s.order) > 0 {
		id := s.order[0]
		r := s.reqs[id]
		if r == nil {
			s.order = s.order[1:]
			continue
		}
		k := min(n, r.remaining)
		r.remaining -= k
		s.outstanding -= k
		n -= k
		if r.remaining == 0 {
			delete(s.reqs, id)
			s.order = s.order[1:]
		}
	}
}

// status handles a status of request rid: a heartbeat, or the end of the request (expired,
// refused, the consumer gone), with how many of its messages never came.
func (s *Source) status(rid uint64, m *nats.Msg) {
	code := m.Header.Get("Status")
	s.mu.Lock()
	now := time.Now()
	s.lastHeard = now
	missingNow := false
	switch code {
	case "100":
		// Idle heartbeat: the request is alive.
	case "503":
		// No responders: the consumer does not exist (yet, or any more).
		if !s.missing {
			missingNow = true
		}
		s.missing, s.missingAt = true, now
		s.dropAllLocked()
	default:
		// 404, 408, 409: the request ended.
		s.endLocked(rid)
		if code == "409" && strings.Contains(m.Header.Get("Description"), "Exceeds MaxBytes") {
			s.oversize = true
		}
		if strings.Contains(strings.ToLower(m.Header.Get("Description")), "consumer deleted") {
			missingNow = !s.missing
			s.missing, s.missingAt = true, now
			s.dropAllLocked()
		}
	}
	s.refillAndUnlock(now, missingNow)
}

// Msg is a message a Source brought.
type Msg struct {
	Msg *nats.Msg
	// Meta is its metadata, parsed from its reply subject.
	Meta   *nats.MsgMetadata
	Source *Source
	Stamp  Stamp
}

// JetStreamMeta is a message's metadata as a jetstream.Msg gives it.
func JetStreamMeta(md *nats.MsgMetadata) *jetstream.MsgMetadata {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: md.Sequence.Stream, Consumer: md.Sequence.Consumer},
		NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp, Stream: md.Stream,
		Consumer: md.Consumer, Domain: md.Domain}
}

// Stamp is how a message came: what Again needs to know later.
type Stamp struct {
	// resent says the source received a message of this stream sequence or a later one
	// before: this one is delivered again (see Source.maxSeq).
	resent bool
	// p is the puller it came through, epoch its connection then.
	p     *Puller
	epoch uint64
}

// Resent is the stamp of a message known to have come before (read again from the stream).
func Resent() Stamp { return Stamp{resent: true} }

// Again says a message its consumer delivered once may have been delivered again since: its
// source received a later message of the stream before it, or the connection was made again
// after it came (a nats-server restart), when the server delivers again what was not
// acknowledged, and that copy may have been settled already while this one waited.
func (s Stamp) Again() bool {
	return s.resent || (s.p != nil && s.p.epoch.Load() != s.epoch)
}
