package settle

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
)

// LogWriter writes every worker's delivery-log records: an endpoint's records that wait while
// its previous message is being stored go out together, in one message (records.LogBatch),
// and each delivery is acknowledged when the message holding its record is stored. Under load
// a message carries tens of records, so the server stores (and the fold reads) a fraction of
// the messages; alone, a record goes out at once, as before.
//
// A record is batched only when no other write can produce it: the outcome of a delivery's
// first delivery (its message was never delivered before, nor was the message it was copied
// from). A record that a crash could make written twice (the delivery was redelivered, and may
// have been attempted with this outcome already) is written alone, with its own message id,
// which the stream de-duplicates. And before a redelivered message is attempted again, its
// delivery is looked up in the log (see decided): an outcome a batch holds already is not
// attempted, written or counted again. So the log holds each outcome once, whatever crashes
// when, and the counts folded from it stay exact.
type LogWriter struct {
	js  jetstream.JetStream
	log logr.Logger
	// maxBytes bounds one message's records.
	maxBytes int
	hard     context.Context

	mu       sync.Mutex
	subjects map[string]*logSubject
	stopped  bool
	kick     chan struct{}
}

// logSubject is one endpoint's log: what waits, and whether a message of it is being stored.
type logSubject struct {
	queue   []logWrite
	storing bool
}

// maxLogBatch bounds the records of one message.
const maxLogBatch = 128

type logWrite struct {
	entry records.LogEntry
	alone bool
	done  func(ok bool)
}

// NewLogWriter writes through js to a server accepting messages of maxPayload bytes.
func NewLogWriter(js jetstream.JetStream, maxPayload int64, log logr.Logger) *LogWriter {
	return &LogWriter{js: js, log: log, maxBytes: int(max(min(maxPayload/2, 1<<20), 64<<10)), subjects: map[string]*logSubject{},
		kick: make(chan struct{}, 1), hard: context.Background()}
}

// Write queues rec for subject; done is called once the record is stored (true) or could not be
// (false: the caller leaves its delivery to be redelivered). alone says the record must be
// written alone (see LogWriter).
func (l *LogWriter) Write(subject string, rec *records.LogRecord, alone bool, done func(ok bool)) {
	e := records.EncodeLog(rec, make([]byte, 0, 1024))
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		done(false)
		return
	}
	s := l.subjects[subject]
	if s == nil {
		s = &logSubject{}
		l.subjects[subject] = s
	}
	s.queue = append(s.queue, logWrite{entry: e, alone: alone, done: done})
	storing := s.storing
	l.mu.Unlock()
	if !storing {
		l.wake()
	}
}

func (l *LogWriter) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Run writes until ctx ends; what is queued then is written, and what arrives later fails.
// hard bounds how long a write may take once ctx ended.
func (l *LogWriter) Run(ctx, hard context.Context) {
	l.hard = hard
	for {
		select {
		case <-l.kick:
			l.flush()
		case <-ctx.Done():
			l.mu.Lock()
			l.stopped = true
			l.mu.Unlock()
			for l.flush() {
				time.Sleep(time.Millisecond)
			}
			return
		}
	}
}

// flush sends the next message of every endpoint that has records waiting and none being
// stored: its batch of what may be batched, or a record that must go alone. It reports whether
// anything is left waiting.
func (l *LogWriter) flush() (left bool) {
	type send struct {
		subject string
		writes  []logWrite
	}
	var sends []send
	l.mu.Lock()
	for subject, s := range l.subjects {
		if len(s.queue) == 0 {
			if !s.storing {
				delete(l.subjects, subject) // an endpoint's entry goes when it is idle
			}
			continue
		}
		if s.storing {
			left = true
			continue
		}
		n, size := 0, 0
		for n < len(s.queue) && n < maxLogBatch && !s.queue[n].alone && (n == 0 || size+len(s.queue[n].entry.JSON) <= l.maxBytes) {
			size += len(s.queue[n].entry.JSON) + 1
			n++
		}
		if n == 0 {
			n = 1 // one that goes alone
		}
		sends = append(sends, send{subject, s.queue[:n:n]})
		s.queue = s.queue[n:]
		s.storing = true
		left = left || len(s.queue) > 0
	}
	l.mu.Unlock()
	for _, sd := range sends {
		l.publish(sd.subject, sd.writes)
	}
	return left
}

// stored ends the store of subject's message: what waited meanwhile goes next.
func (l *LogWriter) stored(subject string) {
	l.mu.Lock()
	if s := l.subjects[subject]; s != nil {
		s.storing = false
	}
	l.mu.Unlock()
	l.wake()
}

// publish writes one message of writes and calls their done when it is stored or given up:
// written again (the same message, which the stream de-duplicates if the first landed) while
// the server does not answer, for at most 15s.
func (l *LogWriter) publish(subject string, writes []logWrite) {
	entries := make([]records.LogEntry, len(writes))
	for i, w := range writes {
		entries[i] = w.entry
	}
	msg := records.LogBatch(subject, entries)
	finish := func(ok bool) {
		l.stored(subject)
		for _, w := range writes {
			w.done(ok)
		}
	}
	f, err := l.js.PublishMsgAsync(msg, jetstream.WithStallWait(5*time.Second))
	if err != nil {
		go l.retry(msg, finish, err)
		return
	}
	go func() {
		select {
		case <-f.Ok():
			finish(true)
		case err := <-f.Err():
			l.retry(msg, finish, err)
		}
	}()
}

func (l *LogWriter) retry(msg *nats.Msg, finish func(bool), err error) {
	ctx, cancel := context.WithTimeout(l.hard, 15*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		l.log.V(1).Info("delivery log write failed; writing it again", "subject", msg.Subject, "error", err.Error())
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = l.js.PublishMsg(pctx, msg)
		pcancel()
		if err == nil {
			finish(true)
			return
		}
	}
	finish(false)
}
