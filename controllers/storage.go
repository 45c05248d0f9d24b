package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// DefaultStorageCheckInterval is how often the controller reads each namespace's dead-letter
// stream and delivery log, and how long a reading serves every endpoint of the namespace.
const DefaultStorageCheckInterval = 30 * time.Second

// storageNearlyFullPercent is how full a stream must be to count as at its byte limit: a
// dead-letter stream this full refuses a dead letter as large as the remaining room, and a
// delivery log this full is dropping its oldest records as new ones come.
const storageNearlyFullPercent = 95

// storageWatch knows, per namespace, whether its dead letters, its deliveries stream or its
// delivery log reached their bounds, as a StorageLimitReached condition. One reading of a
// namespace's three streams serves all its endpoints for an interval, so a thousand endpoints do not each ask.
// Between reconciles it reads again every interval the namespaces it was asked about, and when
// a namespace's condition changes it has all the namespace's endpoints reconciled; an
// unchanged reading makes no reconcile and no status write.
type storageWatch struct {
	nats     *JetStream
	client   client.Client
	interval time.Duration

	mu         sync.Mutex
	namespaces map[string]storageReading
	dirty      map[string]bool
	changed    chan event.TypedGenericEvent[string]
}

// storageReading is a namespace's condition as last read, and when.
type storageReading struct {
	at   time.Time
	cond *metav1.Condition
}

func newStorageWatch(js *JetStream, c client.Client, interval time.Duration) *storageWatch {
	if interval <= 0 {
		interval = DefaultStorageCheckInterval
	}
	return &storageWatch{nats: js, client: c, interval: interval,
		namespaces: map[string]storageReading{}, dirty: map[string]bool{},
		changed: make(chan event.TypedGenericEvent[string], 1)}
}

// condition is namespace ns's StorageLimitReached condition: the last reading while it is
// younger than the interval, else a new one. Nil when NATS cannot tell.
func (w *storageWatch) condition(ctx context.Context, ns string) (*metav1.Condition, error) {
	w.mu.Lock()
	r, ok := w.namespaces[ns]
	w.mu.Unlock()
	if ok && r.cond != nil && time.Since(r.at) < w.interval {
		return r.cond, nil
	}
	return w.refresh(ctx, ns)
}

// refresh reads namespace ns's streams, remembers the condition and, when it differs from the
// one read before, marks the namespace for its endpoints to be reconciled.
func (w *storageWatch) refresh(ctx context.Context, ns string) (*metav1.Condition, error) {
	set, err := w.nats.set(ctx, ns)
	if err != nil {
		return nil, err
	}
	var dlq, deliveries, log *jetstream.StreamInfo
	err = w.nats.Do(ctx, ns, func(ctx context.Context, js jetstream.JetStream) error {
		var err error
		if dlq, err = streamInfo(ctx, js, set.DeadLetterStream()); err != nil {
			return err
		}
		if deliveries, err = streamInfo(ctx, js, set.DeliveriesStream()); err != nil {
			return err
		}
		log, err = streamInfo(ctx, js, set.AttemptsStream())
		return err
	})
	if err != nil {
		return nil, err
	}
	cond := storageCondition(set, dlq, deliveries, log)
	w.mu.Lock()
	before, seen := w.namespaces[ns]
	w.namespaces[ns] = storageReading{at: time.Now(), cond: cond}
	notify := seen && before.cond != nil && !sameCondition(before.cond, cond)
	if notify {
		w.dirty[ns] = true
	}
	w.mu.Unlock()
	if notify {
		select {
		case w.changed <- event.TypedGenericEvent[string]{Object: ns}:
		default: // one is on its way; it takes every namespace marked
		}
	}
	return cond, nil
}

func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.CachedInfo(), nil
}

func sameCondition(a, b *metav1.Condition) bool {
	return a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message
}

// takeChanged returns the namespaces whose condition changed since the last call.
func (w *storageWatch) takeChanged() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.dirty))
	for ns := range w.dirty {
		out = append(out, ns)
	}
	clear(w.dirty)
	return out
}

// Start reads every known namespace again each interval until ctx ends; a namespace without
// endpoints, or whose streams are gone, is forgotten. It is a manager Runnable: it runs on the
// leader only.
func (w *storageWatch) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("storage")
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		w.mu.Lock()
		due := make([]string, 0, len(w.namespaces))
		for ns, r := range w.namespaces {
			if time.Since(r.at) >= w.interval/2 {
				due = append(due, ns)
			}
		}
		w.mu.Unlock()
		for _, ns := range due {
			if ctx.Err() != nil {
				return nil
			}
			list := &v1alpha1.WebhookEndpointList{}
			err := w.client.List(ctx, list, client.InNamespace(ns), client.Limit(1))
			if err == nil && len(list.Items) == 0 {
				w.forget(ns)
				continue
			}
			if _, err := w.refresh(ctx, ns); err != nil {
				if errors.Is(err, jetstream.ErrStreamNotFound) {
					w.forget(ns)
					continue
				}
				log.V(1).Info("cannot read the namespace's streams", "namespace", ns, "error", err.Error())
			}
		}
	}
}

func (w *storageWatch) forget(ns string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.namespaces, ns)
	delete(w.dirty, ns)
}

// storageCondition is the StorageLimitReached condition of set's namespace, from its
// dead-letter stream, deliveries stream and delivery log as the server reports them (their own
// bounds, so a change of the installation's flags shows once the streams are updated). A full
// dead-letter stream comes first: it holds deliveries back; a deliveries stream at its hold
// threshold next: held events wait in the events stream; a full log only forgets early.
func storageCondition(set streams.Set, dlq, deliveries, log *jetstream.StreamInfo) *metav1.Condition {
	ns := set.Namespace()
	logFull := atByteLimit(log)
	logMsg := ""
	if logFull {
		logMsg = fmt.Sprintf("Delivery log %s (the record of every attempt of namespace %s) is at its size limit of %s: its oldest records are being dropped before they are %s old (--attempts-max-age), so `kubectl webhooks log` reaches back less far. %s",
			log.Config.Name, ns, size(log.Config.MaxBytes), age(log.Config.MaxAge),
			raise(set.Bounds().Attempts, "Raise the installation's --attempts-max-bytes (chart value streams.attemptsMaxBytes).",
				"The bound is the namespace's WebhookQuota (spec.storage.deliveryLog): ask the platform team to raise it."))
	}
	if what := dlqFull(dlq); what != "" {
		msg := fmt.Sprintf("Dead-letter stream %s (the dead letters of namespace %s, kept until removed) is full: %s. New dead letters are refused: a delivery that would be dead-lettered stays queued and the dispatcher retries writing its dead letter until there is room. Replay the dead letters still wanted (`kubectl webhooks dlq list`, `kubectl webhooks replay`), then have a NATS administrator purge the stream (`nats stream purge %s`), %s",
			dlq.Config.Name, ns, what, dlq.Config.Name,
			raise(set.Bounds().DeadLetters, "or raise the installation's --dead-letter-max-bytes (chart value streams.deadLetterMaxBytes) or set --dead-letter-max-age.",
				"or ask the platform team to raise the namespace's WebhookQuota (spec.storage.deadLetters), which sets this bound."))
		if logFull {
			msg += " " + logMsg
		}
		return conditions.True(v1alpha1.ConditionStorageLimitReached, v1alpha1.ReasonDeadLetterStreamFull, msg)
	}
	if what := deliveriesFull(deliveries); what != "" {
		msg := fmt.Sprintf("Deliveries stream %s (retries, replays, test deliveries and the events held by endpoints of namespace %s that are suspended or whose circuit is open) %s, the most held events may take: endpoints that hold leave their events in the events stream, none is dropped, and they are delivered once the endpoint delivers again (while the events stream keeps them, --events-max-age). Resume suspended endpoints or fix the receivers of open circuits, delete endpoints no longer wanted, %s",
			deliveries.Config.Name, ns, what,
			raise(set.Bounds().Deliveries, "or raise the installation's --deliveries-max-bytes / --deliveries-max-msgs (chart values streams.deliveriesMaxBytes, streams.deliveriesMaxMsgs).",
				"or ask the platform team to raise the namespace's WebhookQuota (spec.storage.deliveries), which sets this bound."))
		if logFull {
			msg += " " + logMsg
		}
		return conditions.True(v1alpha1.ConditionStorageLimitReached, v1alpha1.ReasonDeliveriesStreamFull, msg)
	}
	if logFull {
		return conditions.True(v1alpha1.ConditionStorageLimitReached, v1alpha1.ReasonDeliveryLogAtLimit, logMsg)
	}
	return conditions.False(v1alpha1.ConditionStorageLimitReached, v1alpha1.ReasonWithinLimits,
		fmt.Sprintf("dead-letter stream %s (limit %s), deliveries stream %s (limit %s) and delivery log %s (limit %s) have room",
			dlq.Config.Name, limit(dlq.Config.MaxBytes), deliveries.Config.Name, limit(deliveries.Config.MaxBytes),
			log.Config.Name, limit(log.Config.MaxBytes)))
}

// deliveriesFull says how the deliveries stream is at its hold threshold
// (streams.DeliveriesHoldPercent of its bytes or messages bound), or "" when it has room. The
// figures are rounded to a percent, as dlqFull's.
func deliveriesFull(s *jetstream.StreamInfo) string {
	b, m := s.Config.MaxBytes, s.Config.MaxMsgs
	switch {
	case b > 0 && s.State.Bytes*100 >= uint64(b)*streams.DeliveriesHoldPercent:
		return fmt.Sprintf("holds %d%% of its %s limit, at or over the %d%%", min(s.State.Bytes*100/uint64(b), 100), size(b), streams.DeliveriesHoldPercent)
	case m > 0 && s.State.Msgs*100 >= uint64(m)*streams.DeliveriesHoldPercent:
		return fmt.Sprintf("holds %d%% of its limit of %d messages, at or over the %d%%", min(s.State.Msgs*100/uint64(m), 100), m, streams.DeliveriesHoldPercent)
	}
	return ""
}

// dlqFull says how the dead-letter stream is full, or "" when it has room. The figures are
// rounded to a percent so that a full stream's message changes seldom (each change is a
// status write on every endpoint of the namespace).
func dlqFull(s *jetstream.StreamInfo) string {
	switch {
	case atByteLimit(s):
		return fmt.Sprintf("it holds %d%% of its %s limit", min(s.State.Bytes*100/uint64(s.Config.MaxBytes), 100), size(s.Config.MaxBytes))
	case s.Config.MaxMsgs > 0 && s.State.Msgs >= uint64(s.Config.MaxMsgs):
		return fmt.Sprintf("it holds its limit of %d dead letters", s.Config.MaxMsgs)
	}
	return ""
}

func atByteLimit(s *jetstream.StreamInfo) bool {
	return s.Config.MaxBytes > 0 && s.State.Bytes*100 >= uint64(s.Config.MaxBytes)*storageNearlyFullPercent
}

// size is a byte count as the installation's flags write it (64Mi).
func size(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

func limit(n int64) string {
	if n <= 0 {
		return "none"
	}
	return size(n)
}

// age is a stream's MaxAge in words: whole days as days (30 days), else as a duration.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "any age"
	case d%(24*time.Hour) == 0:
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	}
	return d.String()
}
