package deliver

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/streamread"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// A shared-lane endpoint parks what it cannot deliver now on its park subject
// (streams.NamespaceNames.ParkSubject), which no consumer reads. The holder of the endpoint's
// partition moves it back (parkReader), oldest first, by direct gets, onto the endpoint's queue
// subject whenever the endpoint may deliver: a batch at a time, while the queue holds less
// than what the endpoint's replicas take at once, so every replica delivers what was parked
// (each with its share of the endpoint's limits) and a queue never fills with what it cannot
// take. A moved delivery keeps its delivery id; the copy on the queue names the parked one
// (its message id), so a move repeated after a crash is de-duplicated.
//
// A deleted endpoint's holder reads its scheduled retries by direct gets too, and hands each
// to the worker, which dead-letters it; a settled one is deleted (its acknowledgement), one
// handed back stays and is read again. They count as redelivered: the delivery log settles
// one whose outcome was logged before.

// parkBatch bounds one read of a park.
const parkBatch = 128

// parkReader reads one filter of the deliveries stream (an endpoint's park, or its scheduled
// retries) for its worker.
type parkReader struct {
	w      *Worker
	filter string
	// move: the park's, moved onto the endpoint's queue subject; otherwise (scheduled
	// retries) handed to the worker.
	move bool

	mu sync.Mutex
	// known is how many messages the last reading found there (-1: not read yet).
	known int64
	// cursor is the next sequence to read; inflight the sequences read and not yet settled.
	cursor   uint64
	inflight map[uint64]bool // made by the first message handed to the worker
	reading  bool
	// noted says something was parked (or counted) while a read ran: the read that found
	// nothing does not clear the count, and the worker reads again.
	noted bool
	// notBefore delays the next read after a message was handed back (the endpoint paused).
	notBefore time.Time
	// emptyAt is when the count last went to nothing (recheck).
	emptyAt time.Time
	// st and stream are the deliveries stream's handles (parkStream's, shared by every
	// reader of the dispatcher), set by the first read.
	st     *streamread.Stream
	stream jetstream.Stream
}

// parkStream opens the deliveries stream's handles once for every parkReader of a dispatcher:
// a reader of each endpoint keeping its own (the stream's information included) cost about
// 2 KiB per idle endpoint. Both are safe for concurrent use (a streamread.Stream is not
// changed after Open; a jetstream.Stream keeps its information atomically).
type parkStream struct {
	js   jetstream.JetStream
	name string

	mu     sync.Mutex
	st     *streamread.Stream
	stream jetstream.Stream
}

// open returns the handles, opening them the first time (again after a failure).
func (s *parkStream) open(ctx context.Context) (*streamread.Stream, jetstream.Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st != nil {
		return s.st, s.stream, nil
	}
	st, err := streamread.Open(ctx, s.js.Conn(), s.js, s.name)
	if err != nil {
		return nil, nil, err
	}
	st.MaxBytes = 4 << 20
	stream, err := s.js.Stream(ctx, s.name)
	if err != nil {
		return nil, nil, err
	}
	s.st, s.stream = st, stream
	return st, stream, nil
}

func newParkReader(w *Worker, filter string, move bool) *parkReader {
	p := &parkReader{}
	p.init(w, filter, move)
	return p
}

// init readies p, held in place (a worker's park reader, in its struct).
func (p *parkReader) init(w *Worker, filter string, move bool) {
	p.w, p.filter, p.move, p.known, p.cursor = w, filter, move, -1, 1
}

// noteParked says something was parked here: read it when there is room.
func (p *parkReader) noteParked() {
	p.mu.Lock()
	if p.known <= 0 {
		p.known = 1
	}
	p.noted = p.noted || p.reading
	p.mu.Unlock()
	p.w.Wake()
}

// setKnown records the count the namespace's last reading found (watchParks).
func (p *parkReader) setKnown(n int64) {
	p.mu.Lock()
	wake := n > 0 && p.known <= 0
	if !p.reading || n > 0 {
		p.known = n
	}
	p.noted = p.noted || (p.reading && n > 0)
	p.mu.Unlock()
	if wake {
		p.w.Wake()
	}
}

// waiting reports whether the park may hold deliveries not yet read. A park not read yet
// waits for the shared lane's first count of every park (watchParks, as the intake starts),
// which says what it holds: a dispatcher starting with thousands of idle endpoints does not
// read each one's park (two requests each) to find it empty.
func (p *parkReader) waiting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.known < 0 && p.move && p.w.f.Intake != nil && !p.w.f.Intake.Counted() {
		return false
	}
	return p.known != 0 && !p.reading
}

// recheck makes a reader that found nothing read again once every has passed since, and says
// how long until then (0: it reads at its next turn; -1: it is not empty). A deleted
// endpoint's readers recheck: what is written for it while it is deleted (a retry its attempt
// in flight scheduled, a park) is noted as it is written, and a note that raced with a read
// would otherwise wait for the retry's own time.
func (p *parkReader) recheck(every time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.known != 0 || p.reading {
		return -1
	}
	if d := every - time.Since(p.emptyAt); d > 0 {
		return d
	}
	p.known = 1
	return 0
}

// Pending is how many messages were found there at the last reading.
func (p *parkReader) Pending() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.known, 0)
}

// read reads up to n messages, on a runner: a park's are moved to the queue, unless local
// (the holder's half-open probe takes one itself); other messages are handed to the worker.
func (p *parkReader) read(ctx context.Context, n int, local bool) {
	p.mu.Lock()
	if p.reading || p.known == 0 || n <= 0 {
		p.mu.Unlock()
		return
	}
	if d := time.Until(p.notBefore); d > 0 {
		p.mu.Unlock()
		p.w.arm(d)
		return
	}
	p.reading = true
	p.mu.Unlock()
	p.w.f.Runners.Go(func() {
		got, err := p.readNow(ctx, n, local)
		p.mu.Lock()
		p.reading = false
		noted := p.noted
		p.noted = false
		if err == nil && got == 0 && !noted {
			p.known = int64(len(p.inflight))
			if p.known == 0 {
				p.emptyAt = time.Now()
			}
		}
		p.mu.Unlock()
		if noted {
			// What was parked while this read ran may be past where it read: read again.
			p.w.Wake()
		}
		if err != nil {
			p.w.f.Log.V(1).Info("reading a park", "endpoint", p.w.name, "filter", p.filter, "error", err.Error())
			p.w.arm(time.Second)
		}
	})
}

func (p *parkReader) open(ctx context.Context) error {
	if p.st != nil {
		return nil
	}
	st, stream, err := p.w.f.parks.open(ctx)
	if err != nil {
		return err
	}
	p.st, p.stream = st, stream
	return nil
}

// readNow reads up to n unsettled messages from the cursor and hands them to the worker; at
// the end it starts again from the beginning (what was handed back is read again).
func (p *parkReader) readNow(ctx context.Context, n int, local bool) (int, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.open(rctx); err != nil {
		return 0, err
	}
	if p.move && !local {
		return p.moveNow(rctx, n)
	}
	p.mu.Lock()
	from := p.cursor
	p.mu.Unlock()
	msgs, err := p.st.Forward(rctx, p.filter, from, min(n, parkBatch))
	if err != nil {
		return 0, err
	}
	got := 0
	for _, m := range msgs {
		p.mu.Lock()
		p.cursor = m.Seq + 1
		busy := p.inflight[m.Seq]
		if !busy {
			if p.inflight == nil {
				p.inflight = map[uint64]bool{}
			}
			p.inflight[m.Seq] = true
		}
		p.mu.Unlock()
		if busy {
			continue
		}
		got++
		pm := &pulled{msg: &nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data},
			md: &jetstream.MsgMetadata{Stream: p.w.f.parks.name, Sequence: jetstream.SequencePair{Stream: m.Seq},
				NumDelivered: 2, Timestamp: m.Time},
			parked: &parkRef{r: p, seq: m.Seq}}
		p.w.receive(pm)
	}
	if len(msgs) == 0 {
		p.mu.Lock()
		p.cursor = 1
		p.mu.Unlock()
	}
	return got, nil
}

// moveNow moves up to n parked deliveries onto the endpoint's queue subject, less what the
// queue holds for it already.
func (p *parkReader) moveNow(ctx context.Context, n int) (int, error) {
	queue := p.w.f.Settings.Names.QueueSubject(p.w.name)
	info, err := p.stream.Info(ctx, jetstream.WithSubjectFilter(queue))
	if err != nil {
		return 0, err
	}
	for _, c := range info.State.Subjects {
		n -= int(c)
	}
	if n <= 0 {
		// The queue holds enough: look again soon.
		p.w.arm(200 * time.Millisecond)
		return 1, nil
	}
	msgs, err := p.st.Forward(ctx, p.filter, 1, min(n, parkBatch))
	if err != nil {
		return 0, err
	}
	// The batch is published at once (pipelined, in order) and, once stored, deleted from
	// the park several at a time: a publish and a delete waited for one after the other
	// moved a few hundred deliveries a second on a replicated stream.
	moved := make([]uint64, 0, len(msgs))
	acks := make([]jetstream.PubAckFuture, 0, len(msgs))
	var failed error
	for _, m := range msgs {
		p.mu.Lock()
		busy := p.inflight[m.Seq]
		p.mu.Unlock()
		if busy {
			continue // the holder's probe has it
		}
		out := &nats.Msg{Subject: queue, Header: m.Header, Data: m.Data}
		out.Header.Set(jetstream.MsgIDHeader, out.Header.Get(jetstream.MsgIDHeader)+"/unpark/"+strconv.FormatUint(m.Seq, 10))
		f, err := p.w.f.JS.PublishMsgAsync(out, jetstream.WithStallWait(5*time.Second))
		if err != nil {
			failed = err
			break
		}
		moved, acks = append(moved, m.Seq), append(acks, f)
	}
	stored := 0
wait:
	for _, f := range acks {
		select {
		case <-f.Ok():
			stored++
		case err := <-f.Err():
			failed = err
			break wait
		case <-ctx.Done():
			failed = ctx.Err()
			break wait
		}
	}
	// Only what was stored is deleted: the rest stays parked and is moved again (its copy, if
	// it was stored after all, is de-duplicated by its message id).
	if err := p.deleteMoved(ctx, moved[:stored]); err != nil {
		return 0, err
	}
	if failed != nil {
		return 0, failed
	}
	if len(msgs) > 0 {
		p.w.arm(50 * time.Millisecond)
	}
	return len(msgs), nil
}

// moveDeletes is how many deletes of moved messages are in flight at once.
const moveDeletes = 16

// deleteMoved deletes from the park the messages whose copies are on the queue.
func (p *parkReader) deleteMoved(ctx context.Context, seqs []uint64) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	slots := make(chan struct{}, moveDeletes)
	for _, seq := range seqs {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if err := p.stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				mu.Lock()
				first = cmp.Or(first, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// parkRef is one message read from a park.
type parkRef struct {
	r   *parkReader
	seq uint64
}

// delete removes the settled message from the stream.
func (ref *parkRef) delete() error {
	p := ref.r
	ctx, cancel := context.WithTimeout(p.w.f.Hard, 10*time.Second)
	defer cancel()
	err := p.stream.DeleteMsg(ctx, ref.seq)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && !streams.IsNotFound(err) {
		// Still there: it is read again (and settled from the delivery log).
		ref.handBack()
		return err
	}
	p.mu.Lock()
	delete(p.inflight, ref.seq)
	if p.known > 0 {
		if p.known--; p.known == 0 {
			p.emptyAt = time.Now()
		}
	}
	p.mu.Unlock()
	return nil
}

// handBack leaves the message in the park, to be read again.
func (ref *parkRef) handBack() {
	p := ref.r
	p.mu.Lock()
	delete(p.inflight, ref.seq)
	p.cursor = min(p.cursor, ref.seq)
	p.notBefore = time.Now().Add(time.Second)
	if p.known <= 0 {
		p.known = 1
	}
	p.mu.Unlock()
}
