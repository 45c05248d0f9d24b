package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/erasure"
	"github.com/webhook-operator/webhook-operator/internal/quota"
	"github.com/webhook-operator/webhook-operator/internal/records"
	"github.com/webhook-operator/webhook-operator/internal/streamread"
)

// DefaultRetentionInterval is how often payloads past their retention are removed.
const DefaultRetentionInterval = time.Minute

// retentionBudget bounds the messages one sweep reads per namespace; what is left waits for
// the next sweep.
const retentionBudget = 20_000

// maxEarly bounds the dead letters one sweep key remembers as due before their turn (see
// earlyDeadLetters); one beyond it loses its payload when its turn comes, at its own store time.
const maxEarly = 10_000

// RetentionSweep removes payloads past their retention from the delivery log and the dead
// letters: a delivery-log record or a dead letter older than its endpoint's payload retention
// (quota.Retention: spec.payloadRetention, within the namespace's WebhookQuota retention) is
// kept without its payload (records.PayloadExpired), as an erasure does (erasure.Engine's
// StripLog and StripDeadLetter: the fold's counts do not change).
//
// A stream's messages are in the order they were stored, so each sweep reads, from where the
// last one stopped, only what has become old enough since. An endpoint's own shorter
// retention is swept on its subject; the namespace's retention on the whole stream, which
// also covers the records of endpoints deleted since. Without a namespace retention, the
// records of a deleted endpoint keep their payloads as long as their records. It is a manager
// Runnable: it runs on the leader only, and starts each namespace from the streams' first
// message after a restart.
//
// A dead letter's retention counts from when its payload was first dead-lettered: one written
// of a replay (records.HRetainFrom, the original's time) is due before the dead letters stored
// around it. Each sweep therefore also reads what was stored since it last looked, remembers
// such dead letters (earlyDeadLetters), and strips each once its own time has passed.
type RetentionSweep struct {
	Client client.Client
	NATS   *JetStream
	// Interval between sweeps (DefaultRetentionInterval when 0).
	Interval time.Duration

	now func() time.Time

	mu sync.Mutex
	// next is where each sweep continues: by namespace, stream and endpoint ("" for the
	// namespace's sweep of the whole stream).
	next map[sweepKey]uint64
	// early are, by sweep key of a dead-letter stream, the dead letters after next whose
	// retention counts from before they were stored.
	early map[sweepKey]*earlyDeadLetters
}

// earlyDeadLetters are dead letters stored after a sweep's cursor that are due before it
// reaches them: their sequence and when their retention counts from, and the next sequence
// to look at for more.
type earlyDeadLetters struct {
	scanned uint64
	due     map[uint64]time.Time
}

type sweepKey struct{ ns, stream, endpoint string }

// SetupWithManager adds the sweep to mgr, as a Runnable on the leader.
func (s *RetentionSweep) SetupWithManager(mgr ctrl.Manager) error {
	if s.Interval <= 0 {
		s.Interval = DefaultRetentionInterval
	}
	s.now, s.next, s.early = time.Now, map[sweepKey]uint64{}, map[sweepKey]*earlyDeadLetters{}
	return mgr.Add(s)
}

// Start sweeps every interval until ctx ends.
func (s *RetentionSweep) Start(ctx context.Context) error {
	log := ctrl.LoggerFrom(ctx).WithName("retention")
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := s.sweep(ctx); err != nil && ctx.Err() == nil {
			log.Info("removing expired payloads", "error", err.Error())
		}
	}
}

// sweepPlan is what one namespace's sweep does: the retention of its whole streams (0: none)
// and of the endpoints whose own is shorter.
type sweepPlan struct {
	log, dlq  time.Duration
	endpoints map[string][2]time.Duration
	// exists are the namespace's endpoints (whose dispatchers fold the log).
	exists map[string]bool
}

// plans are the namespaces with a payload retention somewhere.
func (s *RetentionSweep) plans(ctx context.Context) (map[string]*sweepPlan, error) {
	quotas := &v1alpha1.WebhookQuotaList{}
	if err := s.Client.List(ctx, quotas); err != nil {
		return nil, err
	}
	eps := &v1alpha1.WebhookEndpointList{}
	if err := s.Client.List(ctx, eps); err != nil {
		return nil, err
	}
	specs := map[string]*v1alpha1.WebhookQuotaSpec{}
	plans := map[string]*sweepPlan{}
	plan := func(ns string) *sweepPlan {
		p := plans[ns]
		if p == nil {
			p = &sweepPlan{endpoints: map[string][2]time.Duration{}, exists: map[string]bool{}}
			plans[ns] = p
		}
		return p
	}
	for i := range quotas.Items {
		q := &quotas.Items[i]
		if q.Name != v1alpha1.QuotaName || !q.DeletionTimestamp.IsZero() || q.Spec.Retention == nil {
			continue
		}
		specs[q.Namespace] = &q.Spec
		p := plan(q.Namespace)
		p.log, p.dlq = quota.Retention(&q.Spec, nil)
	}
	for i := range eps.Items {
		ep := &eps.Items[i]
		log, dlq := quota.Retention(specs[ep.Namespace], ep.Spec.PayloadRetention)
		if log == 0 && dlq == 0 {
			continue
		}
		p := plan(ep.Namespace)
		// Only what the namespace's sweep of the whole stream does not already do.
		own := [2]time.Duration{}
		if log > 0 && (p.log == 0 || log < p.log) {
			own[0] = log
		}
		if dlq > 0 && (p.dlq == 0 || dlq < p.dlq) {
			own[1] = dlq
		}
		if own != [2]time.Duration{} {
			p.endpoints[ep.Name] = own
		}
	}
	for i := range eps.Items {
		if p := plans[eps.Items[i].Namespace]; p != nil {
			p.exists[eps.Items[i].Name] = true
		}
	}
	return plans, nil
}

// sweep removes what expired, namespace by namespace.
func (s *RetentionSweep) sweep(ctx context.Context) error {
	plans, err := s.plans(ctx)
	if err != nil {
		return err
	}
	s.forgetOthers(plans)
	var errs []error
	for ns, p := range plans {
		if ctx.Err() != nil {
			return nil
		}
		if err := s.sweepNamespace(ctx, ns, p); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// forgetOthers drops the cursors of namespaces without a retention now.
func (s *RetentionSweep) forgetOthers(plans map[string]*sweepPlan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.next {
		if _, ok := plans[k.ns]; !ok {
			delete(s.next, k)
		}
	}
	for k := range s.early {
		if _, ok := plans[k.ns]; !ok {
			delete(s.early, k)
		}
	}
}

// sweepNamespace removes namespace ns's expired payloads, within retentionBudget messages.
func (s *RetentionSweep) sweepNamespace(ctx context.Context, ns string, p *sweepPlan) error {
	set := s.NATS.Config().For(ns)
	budget := retentionBudget
	return s.NATS.DoWithin(ctx, ns, erasureBatchTimeout, func(ctx context.Context, js jetstream.JetStream) error {
		e := &erasure.Engine{JS: js, Set: set, Now: s.now}
		e.Folded = foldLookup(set, func() jetstream.JetStream { return js }, p.exists)
		var counts erasure.Counts
		defer func() { expiredMetrics.add(ns, counts) }()
		type job struct {
			stream, endpoint, filter string
			age                      time.Duration
		}
		var jobs []job
		if p.log > 0 {
			jobs = append(jobs, job{set.AttemptsStream(), "", set.AttemptsSubjects()[0], p.log})
		}
		if p.dlq > 0 {
			jobs = append(jobs, job{set.DeadLetterStream(), "", set.DeadLetterFilter(""), p.dlq})
		}
		for ep, own := range p.endpoints {
			if own[0] > 0 {
				jobs = append(jobs, job{set.AttemptsStream(), ep, set.AttemptSubject(ep), own[0]})
			}
			if own[1] > 0 {
				jobs = append(jobs, job{set.DeadLetterStream(), ep, set.DeadLetterFilter(ep), own[1]})
			}
		}
		for _, j := range jobs {
			if budget <= 0 {
				return nil
			}
			key, cutoff := sweepKey{ns, j.stream, j.endpoint}, s.now().Add(-j.age)
			n, err := s.sweepOne(ctx, e, key, j.filter, cutoff, budget, &counts)
			budget -= n
			if err != nil {
				return err
			}
			if j.stream == set.DeadLetterStream() && budget > 0 {
				n, err := s.sweepEarly(ctx, e, key, j.filter, cutoff, budget, &counts)
				budget -= n
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// sweepOne removes the payloads of the messages of stream on filter stored before cutoff,
// from the key's cursor; it stops at the first younger message, at a log record the health
// counts do not include yet, or after budget messages. It returns how many it read.
func (s *RetentionSweep) sweepOne(ctx context.Context, e *erasure.Engine, key sweepKey, filter string, cutoff time.Time, budget int, counts *erasure.Counts) (int, error) {
	st, err := streamread.Open(ctx, e.JS.Conn(), e.JS, key.stream)
	if err != nil {
		return 0, err
	}
	st.MaxBytes = 8 << 20
	s.mu.Lock()
	from := max(s.next[key], st.FirstSeq)
	s.mu.Unlock()
	read := 0
	defer func() {
		s.mu.Lock()
		s.next[key] = from
		s.mu.Unlock()
	}()
	for read < budget {
		msgs, err := st.Forward(ctx, filter, from, min(256, budget-read))
		if err != nil || len(msgs) == 0 {
			return read, err
		}
		for i := range msgs {
			m := &msgs[i]
			if !m.Time.Before(cutoff) {
				return read, nil
			}
			read++
			if key.stream == e.Set.AttemptsStream() {
				n, wait, err := e.StripLog(ctx, m, func(*records.LogRecord) bool { return true }, records.PayloadExpired)
				if err != nil || wait != "" {
					return read, err
				}
				counts.LogRecords += int64(n)
			} else {
				done, err := e.StripDeadLetter(ctx, m, records.PayloadExpired)
				if err != nil {
					return read, err
				}
				if done {
					counts.DeadLetters++
				}
			}
			from = m.Seq + 1
		}
	}
	return read, nil
}

// sweepEarly strips the dead letters of key's stream on filter that are due (their retention
// counted from before cutoff) although stored after the cursor next: it reads, within budget,
// what was stored since it last looked, remembers those whose retention counts from before
// they were stored (a replay's), and strips the ones whose time has passed. It returns how
// many messages it read.
func (s *RetentionSweep) sweepEarly(ctx context.Context, e *erasure.Engine, key sweepKey, filter string, cutoff time.Time, budget int, counts *erasure.Counts) (int, error) {
	st, err := streamread.Open(ctx, e.JS.Conn(), e.JS, key.stream)
	if err != nil {
		return 0, err
	}
	st.MaxBytes = 8 << 20
	s.mu.Lock()
	next := max(s.next[key], st.FirstSeq)
	idx := s.early[key]
	if idx == nil {
		idx = &earlyDeadLetters{scanned: next, due: map[uint64]time.Time{}}
		s.early[key] = idx
	}
	s.mu.Unlock()
	// s.early[key] is this sweep's alone: sweeps of one namespace do not overlap.
	idx.scanned = max(idx.scanned, next)
	read := 0
	for read < budget {
		msgs, err := st.Forward(ctx, filter, idx.scanned, min(256, budget-read))
		if err != nil {
			return read, err
		}
		if len(msgs) == 0 {
			break
		}
		for i := range msgs {
			m := &msgs[i]
			read++
			idx.scanned = m.Seq + 1
			if from := records.RetainFrom(m.Header, m.Time); from.Before(m.Time) && records.DeadLetterHasPayload(m.Header) && len(idx.due) < maxEarly {
				idx.due[m.Seq] = from
			}
		}
	}
	for seq, from := range idx.due {
		if seq < next {
			delete(idx.due, seq) // the cursor passed it: it was swept in its turn
			continue
		}
		if !from.Before(cutoff) {
			continue
		}
		msgs, err := st.Forward(ctx, filter, seq, 1)
		if err != nil {
			return read, err
		}
		read++
		delete(idx.due, seq)
		if len(msgs) == 1 && msgs[0].Seq == seq {
			done, err := e.StripDeadLetter(ctx, &msgs[0], records.PayloadExpired)
			if err != nil {
				return read, err
			}
			if done {
				counts.DeadLetters++
			}
		}
	}
	return read, nil
}
