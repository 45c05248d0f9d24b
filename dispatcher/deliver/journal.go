package deliver

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Journal is where a dispatcher's workers store what becomes of deliveries, in its namespace's
// streams: held copies of events (within the deliveries stream's hold room), scheduled
// retries, dead letters, and the delivery log (through the LogWriter's batches). Writes are
// bounded by the grace period of a stop (hard), not by the stop itself.
type Journal struct {
	js    jetstream.JetStream
	names streams.NamespaceNames
	logs  *LogWriter
	room  *Room
	// parks are the deliveries stream's handles every endpoint's parkReader reads with.
	parks      *parkStream
	maxPayload int64
	hard       context.Context
	log        logr.Logger
}

// NewJournal writes through js into the streams names; hard ends writes in flight.
func NewJournal(js jetstream.JetStream, names streams.NamespaceNames, logs *LogWriter, room *Room, maxPayload int64, hard context.Context, log logr.Logger) *Journal {
	return &Journal{js: js, names: names, logs: logs, room: room, parks: &parkStream{js: js, name: names.DeliveriesStream()}, maxPayload: maxPayload, hard: hard, log: log}
}

// scheduleRetry publishes the delivery's next attempt as a message schedule due at, on the
// subjects of the endpoint's lane.
func (j *Journal) scheduleRetry(ep string, lane streams.Lane, msg jetstream.Msg, meta records.DeliveryMeta, at time.Time, redelivered bool) error {
	meta.Redelivered = redelivered
	wait, target := j.names.RetryTarget(ep, meta.DeliveryID, lane)
	out := records.NewDelivery(wait, msg.Headers(), msg.Data(), meta)
	out.Header.Set("Nats-Schedule", "@at "+at.UTC().Format(time.RFC3339Nano))
	out.Header.Set("Nats-Schedule-Target", target)
	out.Header.Set(records.HeaderMsgID, retryMsgID(meta))
	if !records.Fits(out, j.maxPayload) {
		return tooLarge(records.TooLarge(records.MsgSize(out), j.maxPayload))
	}
	// A stop asked meanwhile does not abandon the write: the grace period bounds it.
	pctx, cancel := context.WithTimeout(j.hard, 10*time.Second)
	defer cancel()
	_, err := j.js.PublishMsg(pctx, out)
	return err
}

// deadLetter stores the delivery in the dead-letter stream.
func (j *Journal) deadLetter(ep string, msg jetstream.Msg, meta records.DeliveryMeta, reason, why string, last *records.Response, now time.Time) (records.DeadLetter, error) {
	dl := records.DeadLetterOf(msg.Headers(), meta, reason, why, last, now)
	if md, err := msg.Metadata(); err == nil {
		dl.Identify(md.Stream, md.Sequence.Stream, j.names.Namespace(), ep)
	}
	out := records.DeadLetterMessage(j.names.DeadLetterSubject(ep, subjectToken(dl.DeliveryID)), dl, msg.Data(), j.maxPayload)
	pctx, cancel := context.WithTimeout(j.hard, 10*time.Second)
	defer cancel()
	_, err := j.js.PublishMsg(pctx, out)
	return dl, err
}

// writeLog writes rec to the delivery log subject; done is told whether it was stored.
func (j *Journal) writeLog(subject string, rec *records.LogRecord, alone bool, done func(ok bool)) {
	j.logs.Write(subject, rec, alone, done)
}

// heldPending reports whether an endpoint's consumer on the deliveries stream still has
// deliveries to bring (the ones its endpoint held, among others).
func (j *Journal) heldPending(ctx context.Context, endpoint string) (bool, error) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := j.js.Consumer(ictx, j.names.DeliveriesStream(), j.names.EndpointConsumer(endpoint))
	if err != nil {
		return true, err
	}
	return cons.CachedInfo().NumPending > 0, nil
}
