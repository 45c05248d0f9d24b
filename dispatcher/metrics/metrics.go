// Package metrics holds the dispatcher's Prometheus metrics, labelled by namespace and
// endpoint; every stage updates them through one endpoint's handles (Endpoint).
package metrics

import (
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
	routed     *prometheus.CounterVec // events routed, by namespace
	fanout     *prometheus.CounterVec // deliveries written by the router
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
		routed:     counter("events_routed_total", "Events the router handled.", byNamespace...),
		fanout:     counter("deliveries_created_total", "Deliveries the router wrote, one per matching endpoint.", byNamespace...),
		filtered:   counter("events_filtered_total", "Events of a matching type the endpoint's filter (spec.filter) rejected: not delivered, not in the delivery log.", byEndpoint...),
		rateLimit: gauge("endpoint_rate_limit", "Requests per second this replica may send the endpoint now: spec.rateLimit, or less while ramping up after the circuit closed; +Inf when unlimited.",
			byEndpoint...),
		concLimit: gauge("endpoint_concurrency_limit", "Requests this replica may have in flight to the endpoint now: spec.maxInFlight, or less while ramping up after the circuit closed.",
			byEndpoint...),
		held: gauge("dispatcher_held_bytes", "Bytes of events and deliveries this dispatcher holds in memory (bounded by --memory-budget).", byNamespace...),
	}
	reg.MustRegister(m.deliveries, m.latency, m.retries, m.deadLetter, m.circuit, m.pending, m.disabled, m.routed, m.fanout, m.filtered, m.rateLimit, m.concLimit, m.held)
	return m
}

// Routed counts the events the router of namespace ns handled.
func (m *Metrics) Routed(ns string) prometheus.Counter { return m.routed.WithLabelValues(ns) }

// Fanout counts the deliveries the router of namespace ns wrote.
func (m *Metrics) Fanout(ns string) prometheus.Counter { return m.fanout.WithLabelValues(ns) }

// Held is the gauge of bytes held in memory by the dispatcher of namespace ns.
func (m *Metrics) Held(ns string) prometheus.Gauge { return m.held.WithLabelValues(ns) }

// Endpoint are one endpoint's metric handles, looked up once instead of per delivery.
type Endpoint struct {
	Succeeded, Failed prometheus.Counter
	Latency           prometheus.Observer
	Retries           prometheus.Counter
	Filtered          prometheus.Counter
	Pending           prometheus.Gauge
	RateLimit         prometheus.Gauge
	ConcLimit         prometheus.Gauge
	deadLettered      prometheus.Counter
	circuit, disabled prometheus.Gauge
	m                 *Metrics
	ns, ep            string
}

// Endpoint returns the handles of endpoint ep of namespace ns.
func (m *Metrics) Endpoint(ns, ep string) *Endpoint {
	return &Endpoint{
		Succeeded:    m.deliveries.WithLabelValues(ns, ep, "succeeded"),
		Failed:       m.deliveries.WithLabelValues(ns, ep, "failed"),
		deadLettered: m.deliveries.WithLabelValues(ns, ep, "dead_letter"),
		Latency:      m.latency.WithLabelValues(ns, ep),
		Retries:      m.retries.WithLabelValues(ns, ep),
		Filtered:     m.filtered.WithLabelValues(ns, ep),
		circuit:      m.circuit.WithLabelValues(ns, ep),
		Pending:      m.pending.WithLabelValues(ns, ep),
		disabled:     m.disabled.WithLabelValues(ns, ep),
		RateLimit:    m.rateLimit.WithLabelValues(ns, ep),
		ConcLimit:    m.concLimit.WithLabelValues(ns, ep),
		m:            m, ns: ns, ep: ep,
	}
}

// DeadLettered counts a dead letter with its reason.
func (e *Endpoint) DeadLettered(reason string) {
	e.deadLettered.Inc()
	e.m.deadLetter.WithLabelValues(e.ns, e.ep, reason).Inc()
}

// State sets the circuit (0 closed, 1 half-open, 2 open) and disabled gauges.
func (e *Endpoint) State(circuit float64, disabled bool) {
	e.circuit.Set(circuit)
	if disabled {
		e.disabled.Set(1)
	} else {
		e.disabled.Set(0)
	}
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
