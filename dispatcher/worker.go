package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/records"
)

// mode is what a worker may do right now.
type mode int

const (
	modePaused mode = iota // suspended, circuit open, not configured, or waiting for leadership
	modeProbe              // half-open: this replica delivers one at a time
	modeRun                // deliver normally (a disabled endpoint runs to dead-letter)
)

// probeTimeout is how long a half-open probe may stay with a silent replica before another
// replica takes it over.
func probeTimeout(c *endpointConfig) time.Duration { return c.Timeout + 10*time.Second }

// worker delivers one endpoint: it pulls from the endpoint's durable consumer, limits
// concurrency and rate, sends, and decides each delivery's fate.
type worker struct {
	d    *Dispatcher
	name string

	cfg    atomic.Pointer[endpointConfig]
	client atomic.Pointer[http.Client]
	// changed wakes the worker when its configuration or shared state changed.
	changed chan struct{}

	slots   *slots
	limiter *rate.Limiter
	ramped  atomic.Bool // limits are below the configuration: ramping up after the circuit closed
	// unlimited says the limiter allows any rate, so deliveries need not reserve a token.
	unlimited atomic.Bool
	// busy says the last pull session received messages (see consume).
	busy    atomic.Bool
	keys    keyQueues
	metrics *endpointMetrics

	inflight sync.WaitGroup
	// dirty says deliveries happened since the status was last written.
	dirty atomic.Bool
	// active counts messages being worked on here; probeBusy is the half-open probe token.
	active    atomic.Int64
	probeBusy atomic.Bool
	cancel    context.CancelFunc
	done      chan struct{}
}

func newWorker(d *Dispatcher, name string) *worker {
	return &worker{
		d:       d,
		name:    name,
		changed: make(chan struct{}, 1),
		slots:   newSlots(1),
		limiter: rate.NewLimiter(rate.Inf, 1),
		keys:    keyQueues{busy: map[string][]jetstream.Msg{}},
		metrics: d.metrics.forEndpoint(d.namespace, name),
		done:    make(chan struct{}),
	}
}

// configure installs a new configuration.
func (w *worker) configure(c *endpointConfig) {
	old := w.cfg.Swap(c)
	if !sameTransport(old, c) || w.client.Load() == nil {
		prev := w.client.Swap(newClient(newTransport(w.d.guard, c.MaxInFlight, c.TLS)))
		if prev != nil {
			// Idle connections of the old transport are closed once in-flight requests end.
			go func() { time.Sleep(c.Timeout + time.Second); prev.CloseIdleConnections() }()
		}
	}
	w.applyLimits(c, w.d.health.snapshot(w.name, c.Policy, time.Now()))
	w.wake()
}

func (w *worker) wake() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// applyLimits sets concurrency and rate for the current configuration and ramp-up.
func (w *worker) applyLimits(c *endpointConfig, st sharedState) {
	f := rampFactor(&st, c.Policy, time.Now())
	// While limited, mode() keeps calling here, so the full limits come back when the ramp ends.
	w.ramped.Store(f < 1)
	conc := max(1, int(math.Ceil(float64(c.MaxInFlight)*f)))
	w.slots.setLimit(conc)
	w.metrics.concLimit.Set(float64(conc))
	limit, burst := rate.Inf, 1
	if c.RateLimit > 0 {
		// Rate-limited endpoints are delivered by one replica at a time (the lease holder),
		// so its token bucket is the endpoint's.
		limit, burst = rate.Limit(c.RateLimit), max(1, c.Burst)
	}
	if f < 1 {
		// Slow start after the circuit closes: from 1/s doubling up to ~1000/s over the ramp.
		ramp := rate.Limit(math.Pow(2, 10*f))
		if limit == rate.Inf || ramp < limit {
			limit, burst = ramp, 1
		}
	}
	if limit != rate.Inf {
		w.unlimited.Store(false)
	}
	if w.limiter.Limit() != limit || w.limiter.Burst() != burst {
		w.limiter.SetLimit(limit)
		w.limiter.SetBurst(burst)
	}
	w.unlimited.Store(limit == rate.Inf)
	if limit == rate.Inf {
		w.metrics.rateLimit.Set(math.Inf(1))
	} else {
		w.metrics.rateLimit.Set(float64(limit))
	}
}

// mode decides what the worker may do now, and when to look again.
func (w *worker) mode(ctx context.Context) (mode, time.Duration) {
	c := w.cfg.Load()
	if c == nil || c.Deleting || c.Suspend {
		return modePaused, time.Minute
	}
	if singleActive(c) && !w.d.isLeader() {
		return modePaused, 2 * time.Second
	}
	now := time.Now()
	if disabled, needsSync := w.d.health.fast(w.name); disabled {
		return modeRun, time.Minute // dead-letter what arrives, quickly
	} else if !needsSync && !w.d.health.ramping(w.name, c.Policy, now) {
		if w.ramped.Load() {
			w.applyLimits(c, w.d.health.snapshot(w.name, c.Policy, now)) // the ramp is over: full speed
		}
		return modeRun, time.Minute // closed circuit, no failure streak: the common case, lock-free
	}
	st := w.d.health.snapshot(w.name, c.Policy, now)
	switch st.circuit() {
	case v1alpha1.CircuitOpen:
		due := st.OpenedAt.Add(c.Policy.Circuit.OpenDuration)
		if now.Before(due) {
			return modePaused, due.Sub(now)
		}
		tr, st2, err := w.d.health.update(ctx, w.name, c.Policy, func(s *sharedState, now time.Time) []transition {
			return s.tryHalfOpen(c.Policy, w.d.identity, now, probeTimeout(c))
		})
		if err != nil {
			return modePaused, time.Second
		}
		w.d.transitions(w.name, tr, st2)
		if st2.circuit() == v1alpha1.CircuitHalfOpen && st2.ProbeOwner == w.d.identity {
			return modeProbe, 0
		}
		return modePaused, time.Second
	case v1alpha1.CircuitHalfOpen:
		if st.ProbeOwner == w.d.identity {
			return modeProbe, 0
		}
		if now.After(st.ProbeAt.Add(probeTimeout(c))) {
			_, st2, err := w.d.health.update(ctx, w.name, c.Policy, func(s *sharedState, now time.Time) []transition {
				return s.tryHalfOpen(c.Policy, w.d.identity, now, probeTimeout(c))
			})
			if err == nil && st2.ProbeOwner == w.d.identity {
				return modeProbe, 0
			}
		}
		return modePaused, time.Second
	}
	if rampFactor(&st, c.Policy, now) < 1 {
		w.applyLimits(c, st)
		return modeRun, 500 * time.Millisecond
	}
	if w.ramped.Load() {
		w.applyLimits(c, st)
	}
	return modeRun, time.Minute
}

// run is the worker's loop until ctx ends; in-flight deliveries finish within grace.
func (w *worker) run(ctx context.Context) {
	defer close(w.done)
	var cons jetstream.Consumer
	for ctx.Err() == nil {
		m, recheck := w.mode(ctx)
		if m != modePaused && cons == nil {
			var err error
			cons, err = w.d.js.Consumer(ctx, w.d.names.DeliveriesStream(), w.d.names.EndpointConsumer(w.name))
			if err != nil {
				// The controller creates the consumer; wait for it.
				cons = nil
				m, recheck = modePaused, 2*time.Second
			}
		}
		switch m {
		case modePaused:
			w.waitChange(ctx, recheck)
		case modeProbe:
			w.probe(ctx, cons)
		case modeRun:
			if err := w.consume(ctx, cons, recheck); err != nil {
				if errors.Is(err, jetstream.ErrConsumerNotFound) {
					cons = nil
				}
				w.waitChange(ctx, time.Second)
			} else if c := w.cfg.Load(); c != nil && c.PerKey {
				// Let the server return what the ended session could not take to its
				// redelivery queue before pulling again: that queue is served first, in order.
				sleepCtx(ctx, perKeySessionGap)
			}
		}
	}
}

func (w *worker) waitChange(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-w.changed:
	case <-t.C:
	}
}

// busyHeartbeat is the pull heartbeat of an endpoint that is receiving deliveries.
const busyHeartbeat = time.Second

// perKeySessionGap is how long a PerKey endpoint waits between two pull sessions.
const perKeySessionGap = 200 * time.Millisecond

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// consume pulls and delivers until the mode changes, recheck passes, or ctx ends.
func (w *worker) consume(ctx context.Context, cons jetstream.Consumer, recheck time.Duration) error {
	c := w.cfg.Load()
	batch := min(max(c.MaxInFlight, 1), 512)
	if c.PerKey {
		batch = 512
	}
	// Under load the server sometimes ends a pull request without the client noticing (the
	// consumer then shows messages pending and no waiting pull, and nothing is delivered).
	// The iterator notices after two missed heartbeats and pulls again. Idle endpoints keep the
	// default heartbeat (15s, cheap with thousands of them); a session that receives messages
	// is replaced at once by one with a 1s heartbeat, so a lost pull holds a busy endpoint up
	// for about 2s instead of 30s.
	//
	// A PerKey endpoint keeps one session while it delivers. A session that ends while
	// messages stream hands the server messages it can no longer deliver; it puts them on its
	// redelivery queue for the next session, which may by then have received later ones, and a
	// key's events would go out of order. So a PerKey session starts with the busy heartbeat
	// instead of switching to it, and its recheck timer only re-evaluates the mode.
	keepSession := c.PerKey
	busy := w.busy.Load() || keepSession
	opts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(batch), jetstream.PullExpiry(30 * time.Second)}
	if busy {
		opts = append(opts, jetstream.PullHeartbeat(busyHeartbeat))
	}
	it, err := cons.Messages(opts...)
	if err != nil {
		return err
	}
	received := false
	defer func() { w.busy.Store(received) }()
	becameBusy := make(chan struct{})
	// stillRuns re-evaluates the mode: whether this session may go on, and when to look again.
	stillRuns := func() (bool, time.Duration) {
		m, next := w.mode(ctx)
		return m == modeRun && !pullChanged(c, w.cfg.Load()), next
	}
	stop := make(chan struct{})
	var stopped sync.WaitGroup
	stopped.Add(1)
	go func() {
		defer stopped.Done()
		t := time.NewTimer(recheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				it.Drain()
				return
			case <-stop:
				return
			case <-t.C:
				if keepSession {
					if ok, next := stillRuns(); ok {
						t.Reset(next)
						continue
					}
				}
				it.Drain()
				return
			case <-becameBusy:
				it.Drain() // the next session uses the busy heartbeat
				return
			case <-w.changed:
				if ok, _ := stillRuns(); !ok {
					it.Drain()
					// Let the next loop see the change too.
					w.wake()
					return
				}
			}
		}
	}()
	defer func() { close(stop); stopped.Wait() }()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrNoHeartbeat) {
				continue // the iterator pulls again
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			return err
		}
		if !received && !busy {
			close(becameBusy)
		}
		received = true
		if ctx.Err() != nil {
			_ = msg.Nak()
			continue
		}
		if c.PerKey {
			w.enqueueKeyed(ctx, msg)
			continue
		}
		// The consumer's MaxAckPending bounds how many messages are out at once.
		w.inflight.Add(1)
		w.d.runners.Go(func() {
			defer w.inflight.Done()
			w.runMsg(ctx, msg)
		})
	}
}

// probe fetches one message while the circuit is half-open and this replica owns the probe,
// when nothing of this endpoint is being worked on here.
func (w *worker) probe(ctx context.Context, cons jetstream.Consumer) {
	if w.active.Load() > 0 || w.probeBusy.Load() {
		w.waitChange(ctx, 200*time.Millisecond)
		return
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		w.waitChange(ctx, time.Second)
		return
	}
	for msg := range batch.Messages() {
		if w.cfg.Load().PerKey {
			w.enqueueKeyed(ctx, msg)
			continue
		}
		w.inflight.Add(1)
		w.d.runners.Go(func() {
			defer w.inflight.Done()
			w.runMsg(ctx, msg)
		})
	}
	w.waitChange(ctx, 100*time.Millisecond)
}

// heldRetry is a PerKey delivery retrying in place.
type heldRetry struct {
	meta records.DeliveryMeta
	wait time.Duration
}

// deliver makes one attempt of msg (or of a held PerKey retry) and settles the message:
// acknowledged after success, after a retry was scheduled, or after it was dead-lettered.
// It returns a held retry when a PerKey delivery must retry in place.
func (w *worker) deliver(ctx context.Context, msg jetstream.Msg, held *heldRetry) *heldRetry {
	c := w.cfg.Load()
	if c == nil {
		_ = msg.Nak()
		return nil
	}
	var meta records.DeliveryMeta
	if held != nil {
		meta = held.meta
	} else {
		meta = records.ParseDeliveryMeta(msg.Headers())
		if msg.Headers().Get("Nats-Scheduler") != "" {
			w.d.health.addLocal(w.name, func(d *delta) { d.Scheduled-- })
		}
	}
	if meta.Namespace == "" {
		meta.Namespace = w.d.namespace
	}
	if meta.Endpoint == "" {
		meta.Endpoint = w.name
	}
	if meta.DeliveryID == "" || meta.EventID == "" {
		w.deadLetter(ctx, msg, meta, records.ReasonInvalidEvent, "the delivery has no delivery id or event id header", nil, false)
		return nil
	}
	now := time.Now()
	if disabled, _ := w.d.health.fast(w.name); disabled {
		st := w.d.health.snapshot(w.name, c.Policy, now)
		w.deadLetter(ctx, msg, meta, records.ReasonEndpointDisabled,
			fmt.Sprintf("the endpoint is disabled since %s: %s", st.DisabledSince.UTC().Format(time.RFC3339), st.DisabledReason), nil, false)
		return nil
	}
	if len(msg.Data()) > w.d.cfg.MaxEventBytes {
		w.deadLetter(ctx, msg, meta, records.ReasonPayloadTooLarge,
			fmt.Sprintf("the event is %d bytes; the installation delivers at most %d", len(msg.Data()), w.d.cfg.MaxEventBytes), nil, false)
		return nil
	}

	attempt := meta.Attempts + 1
	h := msg.Headers()
	req := &request{Meta: meta, Attempt: attempt, Body: msg.Data(),
		ContentType: h.Get(records.HeaderContentType), TraceParent: h.Get(records.HeaderTraceParent), TraceState: h.Get(records.HeaderTraceState),
		Forward: records.ForwardedHeaders(h)}
	o := send(w.d.hardCtx, w.client.Load(), c, req, now)
	if w.d.hardCtx.Err() != nil {
		// Shutting down past the grace period: this attempt does not count; redeliver.
		_ = msg.Nak()
		return nil
	}
	w.metrics.latency.Observe(o.Latency.Seconds())
	o.Body, o.Err = c.scrub(o.Body), c.scrub(o.Err)
	rec := records.LogRecord{
		DeliveryID: meta.DeliveryID, EventID: meta.EventID, EventType: meta.EventType, Namespace: w.d.namespace, Endpoint: w.name,
		Attempt: attempt, Time: o.Start.UTC(), LatencyMS: o.Latency.Milliseconds(), LatencyUS: o.Latency.Microseconds(), Reason: o.Reason, RequestHeaders: o.Sent,
		Response: records.Response{StatusCode: o.StatusCode, Body: o.Body, Truncated: o.Truncated, Error: o.Err}, ReplayOf: meta.ReplayOf,
		Test: meta.Test,
	}

	if o.Success {
		w.metrics.succeeded.Inc()
		w.d.health.addLocal(w.name, func(d *delta) {
			d.Attempts++
			d.Completed++
			d.Delivered++
			if o.Start.After(d.LastSuccess) {
				d.LastSuccess = o.Start
			}
		})
		if _, needsSync := w.d.health.fast(w.name); needsSync {
			tr, st2, err := w.d.health.update(ctx, w.name, c.Policy, func(s *sharedState, now time.Time) []transition { return s.onSuccess(c.Policy, now) })
			if err == nil {
				w.d.transitions(w.name, tr, st2)
			}
		}
		rec.State = records.StateSucceeded
		w.publishLogFast(&rec)
		_ = msg.Ack()
		w.dirty.Store(true)
		return nil
	}

	// A failed attempt.
	w.metrics.failed.Inc()
	fail := &failureInfo{Time: o.Start.UTC(), StatusCode: o.StatusCode, Reason: o.Reason, Message: truncate(o.Err, 512)}
	w.d.health.addLocal(w.name, func(d *delta) {
		d.Attempts++
		d.Failures++
		d.LastFailure = fail
	})
	tr, st2, err := w.d.health.update(ctx, w.name, c.Policy, func(s *sharedState, now time.Time) []transition { return s.onFailure(c.Policy, now) })
	if err == nil {
		w.d.transitions(w.name, tr, st2)
	}
	meta.Attempts = attempt
	meta.History = append(meta.History, records.Attempt{N: attempt, Time: o.Start.UTC(), StatusCode: o.StatusCode,
		LatencyMS: o.Latency.Milliseconds(), LatencyUS: o.Latency.Microseconds(), Reason: o.Reason, Error: truncate(o.Err, 256)})
	last := &records.Response{StatusCode: o.StatusCode, Body: o.Body, Truncated: o.Truncated, Error: o.Err}

	// What follows a failed attempt: a retry, or a dead letter when the attempts or the
	// policy's maxRetryDuration are used up, or at once for a one-shot test delivery.
	wait, verdict := c.Policy.After(attempt, o.RetryAfter, meta.Created, time.Now(), rand.Float64)
	if reason, why := giveUp(meta, verdict, attempt, c.Policy.MaxRetryDuration); reason != "" {
		rec.State, rec.DeadLetterReason = records.StateDeadLetter, reason
		w.deadLetterWith(ctx, msg, meta, reason, why+"; last: "+describe(o), last, true, &rec)
		return nil
	}
	next := time.Now().Add(wait)
	rec.State = records.StateFailed
	rec.NextAttemptAt = &next
	if c.PerKey || wait < w.d.inPlaceRetryMax {
		// Short waits (and every retry of a PerKey endpoint, which must not be overtaken) are
		// waited out here; long ones become message schedules that hold nothing.
		w.publishLog(ctx, &rec)
		return &heldRetry{meta: meta, wait: wait}
	}
	if err := w.scheduleRetry(ctx, msg, meta, next); err != nil {
		w.d.log.Error(err, "scheduling a retry; the delivery will be attempted again", "endpoint", w.name, "delivery", meta.DeliveryID)
		_ = msg.NakWithDelay(time.Second)
		return nil
	}
	w.metrics.retries.Inc()
	w.d.health.addLocal(w.name, func(d *delta) { d.Scheduled++ })
	w.publishLog(ctx, &rec)
	_ = msg.Ack()
	w.dirty.Store(true)
	return nil
}

// giveUp says why a delivery whose attempt n just failed gets no further attempt (a dead-letter
// reason and its explanation), or "" when it is retried.
func giveUp(meta records.DeliveryMeta, verdict policy.Verdict, n int, limit time.Duration) (string, string) {
	switch {
	case meta.Test:
		return records.ReasonTestFailed, "the test delivery's one attempt failed (test deliveries are not retried)"
	case verdict == policy.Exhausted:
		return records.ReasonExhausted, fmt.Sprintf("%d attempts without a successful response", n)
	case verdict == policy.RetryDurationExceeded:
		return records.ReasonRetryDurationExceeded, fmt.Sprintf("%d attempts without a successful response, and the next would start more than maxRetryDuration (%s) after the delivery was created at %s",
			n, limit, meta.Created.UTC().Format(time.RFC3339))
	}
	return "", ""
}

// scheduleRetry publishes the delivery's next attempt as a JetStream message schedule: it
// waits on its own subject, holding nothing of the endpoint's consumer, and the server
// publishes it onto the delivery subject when due.
func (w *worker) scheduleRetry(ctx context.Context, msg jetstream.Msg, meta records.DeliveryMeta, at time.Time) error {
	names := w.d.names
	out := nats.NewMsg(names.RetrySubject(w.name, meta.DeliveryID))
	for k, v := range msg.Headers() {
		if len(k) > 5 && (k[:5] == "Nats-" || k[:5] == "nats-") {
			continue
		}
		out.Header[k] = v
	}
	records.SetDeliveryMeta(out.Header, meta)
	out.Header.Set("Nats-Schedule", "@at "+at.UTC().Format(time.RFC3339Nano))
	out.Header.Set("Nats-Schedule-Target", names.DeliverySubject(w.name))
	out.Header.Set(records.HeaderMsgID, meta.DeliveryID+"/retry/"+strconv.Itoa(meta.Attempts))
	out.Data = msg.Data()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := w.d.js.PublishMsg(pctx, out)
	return err
}

// deadLetter writes the delivery to the dead-letter stream, then acknowledges it. countFailure
// says the receiver failed it (it counts towards the failure rate); otherwise it was given up
// for another reason (disabled, invalid, too large).
func (w *worker) deadLetter(ctx context.Context, msg jetstream.Msg, meta records.DeliveryMeta, reason, message string, last *records.Response, countFailure bool) {
	w.deadLetterWith(ctx, msg, meta, reason, message, last, countFailure, nil)
}

// deadLetterWith is deadLetter with the delivery-log record of the final attempt, when there
// was one.
func (w *worker) deadLetterWith(ctx context.Context, msg jetstream.Msg, meta records.DeliveryMeta, reason, message string, last *records.Response, countFailure bool, final *records.LogRecord) {
	h := nats.Header{}
	for k, v := range msg.Headers() {
		h[k] = append([]string(nil), v...)
	}
	records.SetDeliveryMeta(h, meta)
	now := time.Now()
	dl := records.NewDeadLetter(h, reason, message, last, now)
	if dl.DeliveryID == "" {
		// An invalid delivery still gets a stable id, so writing it twice keeps one.
		md, _ := msg.Metadata()
		if md != nil {
			dl.DeliveryID = fmt.Sprintf("invalid-%d", md.Sequence.Stream)
		}
	}
	out := records.DeadLetterMsg(w.d.names.DeadLetterSubject(w.name, subjectToken(dl.DeliveryID)), dl, msg.Data())
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := w.d.js.PublishMsg(pctx, out)
	cancel()
	if err != nil {
		w.d.log.Error(err, "writing a dead letter; the delivery stays queued", "endpoint", w.name, "delivery", dl.DeliveryID)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	w.metrics.deadLetterReason(reason)
	if countFailure {
		w.d.health.addLocal(w.name, func(d *delta) { d.Completed++; d.Failed++; d.DeadLettered++ })
		if c := w.cfg.Load(); c != nil {
			tr, st, err := w.d.health.update(ctx, w.name, c.Policy, func(s *sharedState, now time.Time) []transition { return s.onDeadLetter(c.Policy, now) })
			if err == nil {
				w.d.transitions(w.name, tr, st)
			}
		}
	} else {
		w.d.health.addLocal(w.name, func(d *delta) { d.DeadLettered++ })
	}
	if final != nil {
		w.publishLog(ctx, final)
	} else {
		rec := records.LogRecord{DeliveryID: dl.DeliveryID, EventID: dl.EventID, EventType: dl.EventType, Namespace: w.d.namespace,
			Endpoint: w.name, State: records.StateDeadLetter, Attempt: meta.Attempts, Time: now.UTC(), DeadLetterReason: reason,
			ReplayOf: meta.ReplayOf, Reason: reason}
		rec.Response.Error = message
		w.publishLog(ctx, &rec)
	}
	_ = msg.Ack()
	w.dirty.Store(true)
}

// publishLog appends a record to the delivery log; a failure to log never blocks delivery.
func (w *worker) publishLog(ctx context.Context, rec *records.LogRecord) {
	b := rec.AppendJSON(make([]byte, 0, 1024))
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.d.js.Publish(pctx, w.d.names.AttemptSubject(w.name), b); err != nil {
		w.d.log.V(1).Info("delivery log write failed", "endpoint", w.name, "delivery", rec.DeliveryID, "error", err.Error())
	}
}

// publishLogFast appends a success to the delivery log without waiting for (or asking for)
// JetStream's acknowledgement: a success is already recorded by the acknowledged delivery, and
// this saves a round trip per delivery. Failures and dead letters use publishLog.
func (w *worker) publishLogFast(rec *records.LogRecord) {
	b := rec.AppendJSON(make([]byte, 0, 1024))
	if err := w.d.nc.Publish(w.d.names.AttemptSubject(w.name), b); err != nil {
		w.d.log.V(1).Info("delivery log write failed", "endpoint", w.name, "delivery", rec.DeliveryID, "error", err.Error())
	}
}

// stop waits for the worker's loop and its in-flight deliveries.
func (w *worker) wait() {
	<-w.done
	w.inflight.Wait()
}

func describe(o outcome) string {
	if o.StatusCode != 0 {
		return fmt.Sprintf("HTTP %d (%s)", o.StatusCode, o.Reason)
	}
	if strings.HasPrefix(o.Err, o.Reason) {
		return truncate(o.Err, 200)
	}
	return fmt.Sprintf("%s: %s", o.Reason, truncate(o.Err, 200))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// subjectToken makes s safe as one subject token.
func subjectToken(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '.' || c == '*' || c == '>' || c <= ' ' || c > '~' {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
}

// slots is a semaphore whose size can change while held.
type slots struct {
	mu    sync.Mutex
	cond  *sync.Cond
	limit int
	used  int
}

func newSlots(limit int) *slots {
	s := &slots{limit: limit}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *slots) setLimit(n int) {
	s.mu.Lock()
	s.limit = n
	s.mu.Unlock()
	s.cond.Broadcast()
}

// acquire waits for a slot; false when ctx ended first.
func (s *slots) acquire(ctx context.Context) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used < s.limit {
		s.used++
		return true
	}
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	for s.used >= s.limit {
		if ctx.Err() != nil {
			return false
		}
		s.cond.Wait()
	}
	s.used++
	return true
}

func (s *slots) release() {
	s.mu.Lock()
	s.used--
	s.mu.Unlock()
	s.cond.Signal()
}

// pullChanged reports whether a new configuration changes how the worker pulls.
func pullChanged(a, b *endpointConfig) bool {
	return b == nil || a.PerKey != b.PerKey || a.MaxInFlight != b.MaxInFlight || a.Suspend != b.Suspend || a.Deleting != b.Deleting
}

// singleActive reports whether only the lease holder delivers this endpoint: PerKey endpoints
// (no two replicas may hold one key) and rate-limited ones (one token bucket is the limit).
func singleActive(c *endpointConfig) bool { return c.PerKey || c.RateLimit > 0 }
