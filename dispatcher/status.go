package dispatcher

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// FieldManager is the dispatcher's server-side-apply field manager. It owns status.health and
// the Disabled and CircuitOpen conditions, and nothing else.
const FieldManager = "webhook-operator-dispatcher"

// statusWriter writes each endpoint's health to its status: at once on a state change
// (circuit, disabled), otherwise at most every interval while deliveries flow, and every
// idleInterval for idle endpoints, so thousands of endpoints do not flood the API server.
type statusWriter struct {
	d            *Dispatcher
	interval     time.Duration
	idleInterval time.Duration

	mu        sync.Mutex
	urgent    map[string]bool
	active    map[string]bool
	lastWrite map[string]time.Time
	lastHash  map[string]uint64
}

func newStatusWriter(d *Dispatcher, interval time.Duration) *statusWriter {
	return &statusWriter{d: d, interval: interval, idleInterval: max(60*interval, 5*time.Minute),
		urgent: map[string]bool{}, active: map[string]bool{}, lastWrite: map[string]time.Time{}, lastHash: map[string]uint64{}}
}

func (s *statusWriter) mark(ep string, urgent bool) {
	s.mu.Lock()
	s.active[ep] = true
	if urgent {
		s.urgent[ep] = true
	}
	s.mu.Unlock()
}

func (s *statusWriter) forget(ep string) {
	s.mu.Lock()
	delete(s.urgent, ep)
	delete(s.active, ep)
	delete(s.lastWrite, ep)
	delete(s.lastHash, ep)
	s.mu.Unlock()
}

// run writes statuses while this replica holds the lease. Each tick first writes what is
// urgent (state changes), then goes on through the endpoints from where the previous tick
// stopped, for at most passBudget: with thousands of endpoints a full pass of writes (at
// start) takes minutes, and a state change must not wait behind it.
func (s *statusWriter) run(ctx context.Context) {
	tick := time.NewTicker(min(s.interval, 500*time.Millisecond))
	defer tick.Stop()
	cursor := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !s.d.isLeader() {
			continue
		}
		s.mu.Lock()
		urgent := make([]string, 0, len(s.urgent))
		for ep := range s.urgent {
			urgent = append(urgent, ep)
		}
		s.mu.Unlock()
		for _, ep := range urgent {
			s.consider(ctx, ep)
		}
		names := s.d.endpointNames()
		if len(names) == 0 {
			continue
		}
		deadline := time.Now().Add(passBudget)
		n := 0
		for ; n < len(names) && ctx.Err() == nil; n++ {
			if n > 0 && time.Now().After(deadline) {
				break
			}
			s.consider(ctx, names[(cursor+n)%len(names)])
		}
		cursor = (cursor + n) % len(names)
	}
}

// passBudget bounds the time one tick spends on endpoints that are not urgent.
const passBudget = time.Second

// consider writes one endpoint's status if it is due.
func (s *statusWriter) consider(ctx context.Context, ep string) {
	now := time.Now()
	dirty := false
	if w := s.d.worker(ep); w != nil {
		dirty = w.dirty.Swap(false)
	}
	s.mu.Lock()
	urgent, active, last := s.urgent[ep], s.active[ep] || dirty, s.lastWrite[ep]
	due := urgent || (active && now.Sub(last) >= s.interval) || now.Sub(last) >= s.idleInterval
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
		s.d.log.V(1).Info("writing endpoint status", "endpoint", ep, "error", err.Error())
		s.mark(ep, urgent)
	}
}

// write applies one endpoint's health block and conditions.
func (s *statusWriter) write(ctx context.Context, ep string, force bool) error {
	w := s.d.worker(ep)
	if w == nil {
		return nil
	}
	c := w.cfg.Load()
	if c == nil || c.Deleting {
		return nil
	}
	now := time.Now()
	st := s.d.health.snapshot(ep, c.Policy, now)
	window := healthWindow(c.Policy)
	attempts, failures, _, _ := st.totals(now, window)
	pending := st.Scheduled
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if ci, err := s.d.js.Consumer(ictx, s.d.names.DeliveriesStream(), s.d.names.EndpointConsumer(ep)); err == nil {
		info := ci.CachedInfo()
		if fresh, err := ci.Info(ictx); err == nil {
			info = fresh
		}
		pending += int64(info.NumPending) + int64(info.NumAckPending)
	}
	cancel()
	w.metrics.pending.Set(float64(pending))

	health := map[string]any{
		"window":              (&metav1.Duration{Duration: window}).Duration.String(),
		"attempts":            attempts,
		"failures":            failures,
		"consecutiveFailures": st.Consecutive,
		"circuitState":        string(st.circuit()),
		"pending":             pending,
		"deadLettered":        st.DeadLettered,
		"delivered":           st.Delivered,
	}
	if attempts > 0 {
		health["successRate"] = fmt.Sprintf("%.1f%%", float64(attempts-failures)*100/float64(attempts))
	}
	if !st.LastSuccess.IsZero() {
		health["lastSuccessTime"] = st.LastSuccess.UTC().Format(time.RFC3339)
	}
	if f := st.LastFailure; f != nil {
		lf := map[string]any{"time": f.Time.UTC().Format(time.RFC3339), "reason": f.Reason}
		if f.StatusCode != 0 {
			lf["statusCode"] = f.StatusCode
		}
		if f.Message != "" {
			lf["message"] = f.Message
		}
		health["lastFailure"] = lf
	}
	if st.circuit() != v1alpha1.CircuitClosed && !st.OpenedAt.IsZero() {
		health["circuitOpenedAt"] = st.OpenedAt.UTC().Format(time.RFC3339)
	}
	if st.disabled() {
		health["disabledSince"] = st.DisabledSince.UTC().Format(time.RFC3339)
		health["disabledReason"] = st.DisabledReason
	}
	disabled := condition(v1alpha1.ConditionDisabled, metav1.ConditionFalse, v1alpha1.ReasonEnabled, "deliveries are attempted")
	if st.disabled() {
		disabled = condition(v1alpha1.ConditionDisabled, metav1.ConditionTrue, st.DisabledBy,
			fmt.Sprintf("auto-disabled since %s: %s; deliveries are dead-lettered with reason endpoint_disabled; re-enable with `kubectl webhooks enable %s`",
				st.DisabledSince.UTC().Format(time.RFC3339), st.DisabledReason, ep))
	}
	circuit := condition(v1alpha1.ConditionCircuitOpen, metav1.ConditionFalse, v1alpha1.ReasonCircuitClosed, "the circuit is closed")
	switch st.circuit() {
	case v1alpha1.CircuitOpen:
		circuit = condition(v1alpha1.ConditionCircuitOpen, metav1.ConditionTrue, v1alpha1.ReasonCircuitOpen,
			fmt.Sprintf("opened at %s after %d consecutive failed attempts; deliveries are parked until a probe at %s",
				st.OpenedAt.UTC().Format(time.RFC3339), st.Consecutive, st.OpenedAt.Add(c.Policy.Circuit.OpenDuration).UTC().Format(time.RFC3339)))
	case v1alpha1.CircuitHalfOpen:
		circuit = condition(v1alpha1.ConditionCircuitOpen, metav1.ConditionTrue, v1alpha1.ReasonCircuitHalfOpen, "half-open: probing with one delivery")
	}

	hash := hashOf(health, disabled, circuit)
	s.mu.Lock()
	same := s.lastHash[ep] == hash
	s.mu.Unlock()
	if same && !force {
		// Nothing changed: no write, however long ago the last one was.
		s.touch(ep, now, hash)
		return nil
	}
	health["updatedAt"] = now.UTC().Format(time.RFC3339)

	var cur v1alpha1.WebhookEndpoint
	if err := s.d.cache.Get(ctx, types.NamespacedName{Namespace: s.d.namespace, Name: ep}, &cur); err != nil {
		return client.IgnoreNotFound(err)
	}
	conds := []any{}
	for _, cd := range []metav1.Condition{disabled, circuit} {
		cd.ObservedGeneration = cur.Generation
		cd.LastTransitionTime = metav1.NewTime(now)
		for _, old := range cur.Status.Conditions {
			if old.Type == cd.Type && old.Status == cd.Status {
				cd.LastTransitionTime = old.LastTransitionTime
			}
		}
		conds = append(conds, map[string]any{"type": cd.Type, "status": string(cd.Status), "reason": cd.Reason,
			"message": cd.Message, "observedGeneration": cd.ObservedGeneration, "lastTransitionTime": cd.LastTransitionTime.UTC().Format(time.RFC3339)})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "WebhookEndpoint",
		"metadata":   map[string]any{"name": ep, "namespace": s.d.namespace},
		"status":     map[string]any{"health": health, "conditions": conds},
	}}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.d.client.Status().Apply(actx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return client.IgnoreNotFound(err)
	}
	s.touch(ep, now, hash)
	return nil
}

func (s *statusWriter) touch(ep string, now time.Time, hash uint64) {
	s.mu.Lock()
	s.lastWrite[ep], s.lastHash[ep] = now, hash
	s.mu.Unlock()
}

func condition(t string, st metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: st, Reason: reason, Message: msg}
}

func hashOf(v ...any) uint64 {
	b, _ := json.Marshal(v)
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// transitions reports state changes: a Kubernetes Event on the endpoint, an immediate status
// write, and a wake-up of the endpoint's worker.
func (d *Dispatcher) transitions(ep string, trs []transition, st sharedState) {
	if w := d.worker(ep); w != nil {
		w.wake()
		switch st.circuit() {
		case v1alpha1.CircuitOpen:
			w.metrics.circuit.Set(2)
		case v1alpha1.CircuitHalfOpen:
			w.metrics.circuit.Set(1)
		default:
			w.metrics.circuit.Set(0)
		}
		if st.disabled() {
			w.metrics.disabled.Set(1)
		} else {
			w.metrics.disabled.Set(0)
		}
	}
	if len(trs) == 0 {
		return
	}
	d.status.mark(ep, true)
	var obj v1alpha1.WebhookEndpoint
	if err := d.cache.Get(context.Background(), types.NamespacedName{Namespace: d.namespace, Name: ep}, &obj); err != nil {
		return
	}
	for _, t := range trs {
		kind := corev1.EventTypeNormal
		if t.Type == "Disabled" || t.Type == "CircuitOpened" {
			kind = corev1.EventTypeWarning
		}
		d.recorder.Event(&obj, kind, t.Type, t.Message)
		d.log.Info(t.Message, "endpoint", ep, "transition", t.Type)
	}
}
