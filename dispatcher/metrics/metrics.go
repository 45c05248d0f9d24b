// Package metrics holds the dispatcher's Prometheus metrics, labelled by namespace and
// endpoint; every stage updates them through one endpoint's handles (Endpoint).
package metrics

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the dispatcher's Prometheus metrics, labelled by namespace and endpoint.
type Metrics struct {
	deliveries *prometheus.CounterVec   // outcome: succeeded, failed, dead_letter
	latency    *prometheus.HistogramVec // attempt latency
	retries    *prometheus.CounterVec
	deadLetter *prometheus.CounterVec // reason
	circuit    *prometheus.GaugeVec   // 0 closed, 1 half-open, 2 open
	pending    *prometheus.GaugeVec
	disabled   *prometheus.GaugeVec
	routed     *prometheus.CounterVec // events taken from the events stream, by namespace
	fanout     *prometheus.CounterVec // events held in the deliveries stream, by namespace
	filtered   *prometheus.CounterVec // events an endpoint's filter rejected
	rateLimit  *prometheus.GaugeVec   // requests per second allowed now
	concLimit  *prometheus.GaugeVec   // requests in flight allowed now
	held       *prometheus.GaugeVec   // bytes of messages held in memory
}

// Label sets of the metrics.
var (
	byEndpoint  = []string{"namespace", "endpoint"}
	byNamespace = []string{"namespace"}
)

func counter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "webhook", Name: name, Help: help}, labels)
}

func gauge(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "webhook", Name: name, Help: help}, labels)
}

// New registers the metrics with reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deliveries: counter("deliveries_total", "Delivery attempts by outcome: succeeded, failed (a retry follows) or dead_letter.", append(byEndpoint, "outcome")...),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "webhook", Name: "attempt_duration_seconds",
			Help:    "Latency of delivery attempts, from sending the request to reading the response.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}}, byEndpoint),
		retries:    counter("retries_scheduled_total", "Retries scheduled.", byEndpoint...),
		deadLetter: counter("dead_letters_total", "Deliveries sent to the dead-letter stream, by reason.", append(byEndpoint, "reason")...),
		circuit:    gauge("circuit_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open.", byEndpoint...),
		pending:    gauge("consumer_pending", "Deliveries waiting: queued, in flight or waiting for a retry.", byEndpoint...),
		disabled:   gauge("endpoint_disabled", "1 while the endpoint is auto-disabled.", byEndpoint...),
		routed:     counter("events_routed_total", "Events endpoints took from the events stream to deliver, one per endpoint whose patterns match.", byNamespace...),
		fanout:     counter("deliveries_created_total", "Deliveries written to the deliveries stream by endpoints that hold their events (suspended, circuit open, or lagging behind the events stream's limits).", byNamespace...),
		filtered:   counter("events_filtered_total", "Events of a matching type the endpoint's filter (spec.filter) rejected: not delivered, not in the delivery log.", byEndpoint...),
		rateLimit: gauge("endpoint_rate_limit", "Requests per second this replica may send the endpoint now: spec.rateLimit, or less while ramping up after the circuit closed; +Inf when unlimited.",
			byEndpoint...),
		concLimit: gauge("endpoint_concurrency_limit", "Requests this replica may have in flight to the endpoint now: its share of spec.maxInFlight (the replicas' shares add up to it), or less while ramping up after the circuit closed.",
			byEndpoint...),
		held: gauge("dispatcher_held_bytes", "Bytes of events and deliveries this dispatcher holds in memory (bounded by --memory-budget).", byNamespace...),
	}
	reg.MustRegister(m.deliveries, m.latency, m.retries, m.deadLetter, m.circuit, m.pending, m.disabled, m.routed, m.fanout, m.filtered, m.rateLimit, m.concLimit, m.held)
	return m
}

// Held is the gauge of bytes held in memory by the dispatcher of namespace ns.
func (m *Metrics) Held(ns string) prometheus.Gauge { return m.held.WithLabelValues(ns) }

// Endpoint are one endpoint's metric handles. Its series exist from the first delivery,
// retry, dead letter or state change on: an endpoint that never delivers (thousands of idle
// ones in a shared dispatcher) costs no series, and the gauges set meanwhile are remembered and
// exported from then on.
type Endpoint struct {
	m      *Metrics
	ns, ep string

	once sync.Once
	h    atomic.Pointer[handles]

	mu                            sync.Mutex
	pending, rateLimit, concLimit float64
	circuit, disabled             float64
}

// handles are an endpoint's series, looked up once instead of per delivery.
type handles struct {
	succeeded, failed, deadLettered, retries, held, routed, filtered prometheus.Counter
	latency                                                          prometheus.Observer
	pending, rateLimit, concLimit, circuit, disabled                 prometheus.Gauge
}

// Endpoint returns the handles of endpoint ep of namespace ns.
func (m *Metrics) Endpoint(ns, ep string) *Endpoint {
	return &Endpoint{m: m, ns: ns, ep: ep, rateLimit: math.Inf(1)}
}

// series creates the endpoint's series (once) and returns them.
func (e *Endpoint) series() *handles {
	if h := e.h.Load(); h != nil {
		return h
	}
	e.once.Do(func() {
		m, ns, ep := e.m, e.ns, e.ep
		h := &handles{
			succeeded:    m.deliveries.WithLabelValues(ns, ep, "succeeded"),
			failed:       m.deliveries.WithLabelValues(ns, ep, "failed"),
			deadLettered: m.deliveries.WithLabelValues(ns, ep, "dead_letter"),
			latency:      m.latency.WithLabelValues(ns, ep),
			retries:      m.retries.WithLabelValues(ns, ep),
			held:         m.fanout.WithLabelValues(ns),
			routed:       m.routed.WithLabelValues(ns),
			filtered:     m.filtered.WithLabelValues(ns, ep),
			circuit:      m.circuit.WithLabelValues(ns, ep),
			pending:      m.pending.WithLabelValues(ns, ep),
			disabled:     m.disabled.WithLabelValues(ns, ep),
			rateLimit:    m.rateLimit.WithLabelValues(ns, ep),
			concLimit:    m.concLimit.WithLabelValues(ns, ep),
		}
		e.mu.Lock()
		h.pending.Set(e.pending)
		h.rateLimit.Set(e.rateLimit)
		h.concLimit.Set(e.concLimit)
		h.circuit.Set(e.circuit)
		h.disabled.Set(e.disabled)
		e.h.Store(h)
		e.mu.Unlock()
	})
	return e.h.Load()
}

// setGauge remembers a gauge's value and exports it once the series exist.
func (e *Endpoint) setGauge(field *float64, get func(*handles) prometheus.Gauge, v float64) {
	e.mu.Lock()
	*field = v
	h := e.h.Load()
	e.mu.Unlock()
	if h != nil {
		get(h).Set(v)
	}
}

// Succeeded counts a successful attempt.
func (e *Endpoint) Succeeded() { e.series().succeeded.Inc() }

// Failed counts a failed attempt.
func (e *Endpoint) Failed() { e.series().failed.Inc() }

// Latency observes an attempt's latency in seconds.
func (e *Endpoint) Latency(seconds float64) { e.series().latency.Observe(seconds) }

// Retried counts a retry scheduled.
func (e *Endpoint) Retried() { e.series().retries.Inc() }

// Routed counts an event taken from the events stream; Held one held in the deliveries stream
// instead (see deliver's hold).
func (e *Endpoint) Routed() { e.series().routed.Inc() }

// Filtered counts an event the endpoint's filter rejected.
func (e *Endpoint) Filtered() { e.series().filtered.Inc() }

// Held counts an event held in the deliveries stream.
func (e *Endpoint) Held() { e.series().held.Inc() }

// Pending sets the deliveries waiting.
func (e *Endpoint) Pending(v float64) {
	e.setGauge(&e.pending, func(h *handles) prometheus.Gauge { return h.pending }, v)
}

// RateLimit sets the requests per second this replica may send now (+Inf: unlimited).
func (e *Endpoint) RateLimit(v float64) {
	e.setGauge(&e.rateLimit, func(h *handles) prometheus.Gauge { return h.rateLimit }, v)
}

// ConcLimit sets the requests this replica may have in flight now.
func (e *Endpoint) ConcLimit(v float64) {
	e.setGauge(&e.concLimit, func(h *handles) prometheus.Gauge { return h.concLimit }, v)
}

// DeadLettered counts a dead letter with its reason.
func (e *Endpoint) DeadLettered(reason string) {
	e.series().deadLettered.Inc()
	e.m.deadLetter.WithLabelValues(e.ns, e.ep, reason).Inc()
}

// State sets the circuit (0 closed, 1 half-open, 2 open) and disabled gauges.
func (e *Endpoint) State(circuit float64, disabled bool) {
	d := 0.0
	if disabled {
		d = 1
	}
	h := e.series()
	e.mu.Lock()
	e.circuit, e.disabled = circuit, d
	e.mu.Unlock()
	h.circuit.Set(circuit)
	h.disabled.Set(d)
}

// Forget removes a deleted endpoint's series.
func (e *Endpoint) Forget() {
	l := prometheus.Labels{"namespace": e.ns, "endpoint": e.ep}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{
		e.m.deliveries, e.m.latency, e.m.retries, e.m.filtered, e.m.deadLetter, e.m.circuit, e.m.pending, e.m.disabled, e.m.rateLimit, e.m.concLimit,
	} {
		v.DeletePartialMatch(l)
	}
}
