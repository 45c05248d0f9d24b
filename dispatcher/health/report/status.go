package report

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	acv1alpha1 "github.com/webhook-operator/webhook-operator/api/applyconfiguration/api/v1alpha1"
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/internal/conditions"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// FieldManager is the dispatcher's server-side-apply field manager. It owns status.health and
// the Disabled and CircuitOpen conditions, and nothing else.
const FieldManager = "webhook-operator-dispatcher"

// StatusWriter writes the health of each endpoint whose partition this replica holds to its
// status: at once on a state change (circuit, disabled), otherwise at most every interval
// while deliveries flow; an idle endpoint is looked at rarely (see consider) and written only
// when its status would change, so thousands of endpoints do not flood the API server, not
// even when a dispatcher starts.
type StatusWriter struct {
	StatusConfig
	idleInterval time.Duration

	mu     sync.Mutex
	urgent map[string]bool
	active map[string]bool
	// last is what each endpoint's status last got: one entry per endpoint, thousands idle.
	last map[string]lastStatus
	// stream is the deliveries stream's handle (deliveries).
	stream jetstream.Stream
}

// lastStatus is when an endpoint's status was last written or found unchanged, the hash of
// what it says, and the pending count it got.
type lastStatus struct {
	at      time.Time
	hash    uint64
	pending int64
}

// StatusConfig is what a StatusWriter needs.
type StatusConfig struct {
	Endpoints Endpoints
	// Store has the endpoints' shared state.
	Store Snapshots
	// Holds says whether this replica holds an endpoint's partition: only the holder writes
	// its status.
	Holds func(ep string) bool
	JS    jetstream.JetStream
	Names streams.NamespaceNames
	// Waiting is how many deliveries a shared-lane endpoint has parked and queued in the
	// deliveries stream (the intake's last reading; nil: none).
	Waiting func(ep string) int64
	// Reader reads endpoints (the informer cache); Client applies their status.
	Reader client.Reader
	Client client.Client
	// Interval is the least time between two writes of an active endpoint's status.
	Interval time.Duration
	Log      logr.Logger
}

// Snapshots read the latest known state of an endpoint (state.Store).
type Snapshots interface {
	Snapshot(ep string) state.State
}

// NewStatusWriter returns a status writer with nothing written yet.
func NewStatusWriter(c StatusConfig) *StatusWriter {
	return &StatusWriter{StatusConfig: c, idleInterval: max(60*c.Interval, 5*time.Minute),
		urgent: map[string]bool{}, active: map[string]bool{}, last: map[string]lastStatus{}}
}

// Mark asks for an endpoint's status to be written: at once when urgent, else when due.
func (s *StatusWriter) Mark(ep string, urgent bool) {
	s.mu.Lock()
	s.active[ep] = true
	if urgent {
		s.urgent[ep] = true
	}
	s.mu.Unlock()
}

// Forget drops what the writer knows of a deleted endpoint.
func (s *StatusWriter) Forget(ep string) {
	s.mu.Lock()
	delete(s.urgent, ep)
	delete(s.active, ep)
	delete(s.last, ep)
	s.mu.Unlock()
}

// Run writes the statuses of the endpoints whose partitions this replica holds. Each tick
// looks at what was marked (state changes first, then endpoints whose deliveries or counts
// changed); every fullPassEvery it also goes through all endpoints, from where the last pass
// stopped and for at most passBudget, for those looked at rarely (see consider): with
// thousands of endpoints a full pass of writes takes minutes, and a state change must not
// wait behind it.
func (s *StatusWriter) Run(ctx context.Context) {
	tick := time.NewTicker(min(s.Interval, 500*time.Millisecond))
	defer tick.Stop()
	cursor := 0
	var nextPass time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.mu.Lock()
		marked := make([]string, 0, len(s.urgent)+len(s.active))
		for ep := range s.urgent {
			marked = append(marked, ep)
		}
		for ep := range s.active {
			if !s.urgent[ep] {
				marked = append(marked, ep)
			}
		}
		s.mu.Unlock()
		for _, ep := range marked {
			if s.Holds(ep) {
				s.consider(ctx, ep)
			}
		}
		if time.Now().Before(nextPass) {
			continue
		}
		names := s.Endpoints.Names()
		if len(names) == 0 {
			continue
		}
		deadline := time.Now().Add(passBudget)
		n := 0
		for ; n < len(names) && ctx.Err() == nil; n++ {
			if n > 0 && time.Now().After(deadline) {
				break
			}
			if ep := names[(cursor+n)%len(names)]; s.Holds(ep) {
				s.consider(ctx, ep)
			}
		}
		if n == len(names) || cursor+n >= len(names) {
			// A whole pass done: the next one later.
			nextPass = time.Now().Add(fullPassEvery)
		}
		cursor = (cursor + n) % len(names)
	}
}

// fullPassEvery is how often the writer goes through every endpoint.
const fullPassEvery = 10 * time.Second

// staleAfter is how often an idle endpoint's status is looked at again: about the slice of a
// 72h health window that ages out at a time.
const staleAfter = time.Hour

// passBudget bounds the time one tick spends on endpoints that are not urgent.
const passBudget = time.Second

// consider writes one endpoint's status if it is due.
func (s *StatusWriter) consider(ctx context.Context, ep string) {
	now := time.Now()
	dirty := false
	if sv, ok := s.Endpoints.Served(ep); ok {
		dirty = sv.Dirty.Swap(false)
	}
	s.mu.Lock()
	urgent, active, l := s.urgent[ep], s.active[ep] || dirty, s.last[ep]
	last := l.at
	// An idle endpoint is looked at once (its status may be stale from before a restart),
	// then every idleInterval while deliveries wait for it, and otherwise every staleAfter, as
	// the health window's oldest counts age out: nothing else changes its status without
	// marking it (a delivery, a fold, a state change).
	idle := last.IsZero() || now.Sub(last) >= s.idleInterval && l.pending != 0 || now.Sub(last) >= staleAfter
	due := urgent || (active && now.Sub(last) >= s.Interval) || idle
	if due {
		delete(s.urgent, ep)
		delete(s.active, ep)
	} else if dirty {
		s.active[ep] = true
	}
	s.mu.Unlock()
	if !due {
		return
	}
	if err := s.write(ctx, ep, urgent); err != nil {
		s.Log.V(1).Info("writing endpoint status", "endpoint", ep, "error", err.Error())
		s.Mark(ep, urgent)
	}
}

// write applies one endpoint's health block and conditions, unless they are what was last
// written (and the write is not forced).
func (s *StatusWriter) write(ctx context.Context, ep string, force bool) error {
	sv, ok := s.Endpoints.Served(ep)
	if !ok {
		return nil
	}
	c := sv.Config
	if c == nil || c.Deleting {
		return nil
	}
	now := time.Now()
	st := s.Store.Snapshot(ep)
	pending, err := s.pending(ctx, ep, c.Lane, len(c.Draining) > 0)
	if err != nil {
		return err
	}
	sv.Metrics.Pending(float64(pending))
	s.mu.Lock()
	l := s.last[ep]
	l.pending = pending
	s.last[ep] = l
	s.mu.Unlock()
	health := deliveryHealth(&st, *c.Policy, pending, now)
	disabled, circuit := stateConditions(&st, *c.Policy, ep)

	hash := hashOf(health, disabled, circuit)
	s.mu.Lock()
	same := s.last[ep].hash == hash
	s.mu.Unlock()
	if same && !force {
		// Nothing changed: no write, however long ago the last one was.
		s.touch(ep, now, hash)
		return nil
	}
	var cur v1alpha1.WebhookEndpoint
	if err := s.Reader.Get(ctx, types.NamespacedName{Namespace: s.Names.Namespace(), Name: ep}, &cur); err != nil {
		return client.IgnoreNotFound(err)
	}
	conds := conditions.Set(cur.Status.Conditions, cur.Generation, now, disabled, circuit)
	if !force && written(cur.Status.Health, health) && conditions.Written(cur.Status.Conditions, conds) {
		// The status already says this (written before a restart, or by the replica that
		// held the endpoint before): a dispatcher starting with thousands of unchanged
		// endpoints writes none of them.
		s.touch(ep, now, hash)
		return nil
	}
	health.UpdatedAt = &metav1.Time{Time: now}
	ac := acv1alpha1.WebhookEndpoint(ep, s.Names.Namespace()).WithStatus(acv1alpha1.WebhookEndpointStatus().
		WithHealth(healthApply(health)).WithConditions(conditions.Apply(conds)...))
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.Client.Status().Apply(actx, ac, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return client.IgnoreNotFound(err)
	}
	s.touch(ep, now, hash)
	return nil
}

// written reports whether the status' health block is h but for its update time.
func written(cur *v1alpha1.DeliveryHealth, h v1alpha1.DeliveryHealth) bool {
	if cur == nil {
		return false
	}
	c := *cur
	c.UpdatedAt = nil
	return equality.Semantic.DeepEqual(c, h)
}

// deliveryHealth is the health block of an endpoint's status (without its update time).
func deliveryHealth(st *state.State, p policy.Policy, pending int64, now time.Time) v1alpha1.DeliveryHealth {
	window := state.Window(p)
	attempts, failures, _, _ := st.Totals(now, window)
	h := v1alpha1.DeliveryHealth{Window: &metav1.Duration{Duration: window}, Attempts: attempts, Failures: failures,
		ConsecutiveFailures: int32(st.Consecutive), CircuitState: st.CircuitState(), Pending: pending,
		DeadLettered: st.DeadLettered, Delivered: st.Delivered, Filtered: st.Filtered}
	if attempts > 0 {
		h.SuccessRate = fmt.Sprintf("%.1f%%", float64(attempts-failures)*100/float64(attempts))
	}
	if !st.LastSuccess.IsZero() {
		h.LastSuccessTime = second(st.LastSuccess)
	}
	if f := st.LastFailure; f != nil {
		h.LastFailure = &v1alpha1.AttemptFailure{Time: *second(f.Time), StatusCode: int32(f.StatusCode), Reason: f.Reason, Message: f.Message}
	}
	if st.CircuitState() != v1alpha1.CircuitClosed && !st.OpenedAt.IsZero() {
		h.CircuitOpenedAt = second(st.OpenedAt)
	}
	if st.Disabled() {
		h.DisabledSince, h.DisabledReason = second(st.DisabledSince), st.DisabledReason
	}
	return h
}

// second is t as the API server stores it: UTC, to the second.
func second(t time.Time) *metav1.Time { return &metav1.Time{Time: t.UTC().Truncate(time.Second)} }

// healthApply is the apply configuration of a health block: every field set, so the
// dispatcher owns them all and one left out is removed.
func healthApply(h v1alpha1.DeliveryHealth) *acv1alpha1.DeliveryHealthApplyConfiguration {
	a := acv1alpha1.DeliveryHealth().WithWindow(*h.Window).WithAttempts(h.Attempts).WithFailures(h.Failures).
		WithConsecutiveFailures(h.ConsecutiveFailures).WithCircuitState(h.CircuitState).WithPending(h.Pending).
		WithDeadLettered(h.DeadLettered).WithDelivered(h.Delivered).WithFiltered(h.Filtered).WithUpdatedAt(*h.UpdatedAt)
	if h.SuccessRate != "" {
		a.WithSuccessRate(h.SuccessRate)
	}
	if h.LastSuccessTime != nil {
		a.WithLastSuccessTime(*h.LastSuccessTime)
	}
	if f := h.LastFailure; f != nil {
		lf := acv1alpha1.AttemptFailure().WithTime(f.Time).WithReason(f.Reason)
		if f.StatusCode != 0 {
			lf.WithStatusCode(f.StatusCode)
		}
		if f.Message != "" {
			lf.WithMessage(f.Message)
		}
		a.WithLastFailure(lf)
	}
	if h.CircuitOpenedAt != nil {
		a.WithCircuitOpenedAt(*h.CircuitOpenedAt)
	}
	if h.DisabledSince != nil {
		a.WithDisabledSince(*h.DisabledSince).WithDisabledReason(h.DisabledReason)
	}
	return a
}

// stateConditions are the dispatcher's conditions of an endpoint: Disabled and CircuitOpen.
func stateConditions(st *state.State, p policy.Policy, ep string) (disabled, circuit *metav1.Condition) {
	disabled = conditions.False(v1alpha1.ConditionDisabled, v1alpha1.ReasonEnabled, "deliveries are attempted")
	if st.Disabled() {
		disabled = conditions.True(v1alpha1.ConditionDisabled, st.DisabledBy,
			fmt.Sprintf("auto-disabled since %s: %s; deliveries are dead-lettered with reason endpoint_disabled; re-enable with `kubectl webhooks enable %s`",
				st.DisabledSince.UTC().Format(time.RFC3339), st.DisabledReason, ep))
	}
	circuit = conditions.False(v1alpha1.ConditionCircuitOpen, v1alpha1.ReasonCircuitClosed, "the circuit is closed")
	switch st.CircuitState() {
	case v1alpha1.CircuitOpen:
		circuit = conditions.True(v1alpha1.ConditionCircuitOpen, v1alpha1.ReasonCircuitOpen,
			fmt.Sprintf("opened at %s after %d consecutive failed attempts; deliveries are parked until a probe at %s",
				st.OpenedAt.UTC().Format(time.RFC3339), st.Consecutive, st.OpenedAt.Add(p.Circuit.OpenDuration).UTC().Format(time.RFC3339)))
	case v1alpha1.CircuitHalfOpen:
		circuit = conditions.True(v1alpha1.ConditionCircuitOpen, v1alpha1.ReasonCircuitHalfOpen, "half-open: probing with one delivery")
	}
	return disabled, circuit
}

func (s *StatusWriter) touch(ep string, now time.Time, hash uint64) {
	s.mu.Lock()
	l := s.last[ep]
	l.at, l.hash = now, hash
	s.last[ep] = l
	s.mu.Unlock()
}

func hashOf(v ...any) uint64 {
	b, _ := json.Marshal(v)
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// pending is how many deliveries wait for an endpoint: events and deliveries queued and
// unacknowledged in its own consumers (on its namespace's events stream and on the deliveries
// stream; a shared-lane endpoint has them only while it drains an earlier version's), what a
// shared-lane endpoint parked and has queued, and scheduled retries waiting in the deliveries
// stream. All are read from the server, so no crash can make the figure drift. Events the
// shared lane's intake has not read yet are the namespace's, not one endpoint's.
func (s *StatusWriter) pending(ctx context.Context, ep string, lane streams.Lane, draining bool) (int64, error) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int64
	// An endpoint of the shared lane with none of its own consumers left (nothing draining)
	// has no consumer and no retry of its own lane: one request reads what waits for it, not
	// five (thousands of idle endpoints are looked at as a dispatcher starts, and hourly).
	own := lane != streams.LaneShared || draining
	if own {
		for _, stream := range []string{s.Names.EventsStream(), s.Names.DeliveriesStream()} {
			// Consumer reads the consumer's current state.
			if ci, err := s.JS.Consumer(ictx, stream, s.Names.EndpointConsumer(ep)); err == nil {
				info := ci.CachedInfo()
				n += int64(info.NumPending) + int64(info.NumAckPending)
			}
		}
	}
	var filters []string
	if own {
		filters = append(filters, s.Names.RetryFilter(ep))
	}
	if lane == streams.LaneShared {
		filters = append(filters, s.Names.ScheduleFilter(ep))
		if s.Waiting != nil {
			n += s.Waiting(ep)
		}
	}
	if len(filters) == 0 {
		return n, nil
	}
	st, err := s.deliveries(ictx)
	if err != nil {
		return 0, err
	}
	for _, f := range filters {
		info, err := st.Info(ictx, jetstream.WithSubjectFilter(f))
		if err != nil {
			s.mu.Lock()
			s.stream = nil // read it again next time
			s.mu.Unlock()
			return 0, err
		}
		for _, c := range info.State.Subjects {
			n += int64(c)
		}
	}
	return n, nil
}

// deliveries is the handle on the namespace's deliveries stream, read once (a handle reads
// by name: it serves a stream made again as well) and again after a failed read.
func (s *StatusWriter) deliveries(ctx context.Context) (jetstream.Stream, error) {
	s.mu.Lock()
	st := s.stream
	s.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := s.JS.Stream(ctx, s.Names.DeliveriesStream())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.stream = st
	s.mu.Unlock()
	return st, nil
}
