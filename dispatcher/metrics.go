package dispatcher

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the dispatcher's Prometheus metrics, labelled by namespace and endpoint.
type metrics struct {
	deliveries *prometheus.CounterVec   // outcome: succeeded, failed, dead_letter
	latency    *prometheus.HistogramVec // attempt latency
	retries    *prometheus.CounterVec
	deadLetter *prometheus.CounterVec // reason
	circuit    *prometheus.GaugeVec   // 0 closed, 1 half-open, 2 open
	pending    *prometheus.GaugeVec
	disabled   *prometheus.GaugeVec
	routed     *prometheus.CounterVec // events routed, by namespace
	fanout     *prometheus.CounterVec // deliveries written by the router
	rateLimit  *prometheus.GaugeVec   // requests per second allowed now
	concLimit  *prometheus.GaugeVec   // requests in flight allowed now
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "webhook", Name: "deliveries_total",
			Help: "Delivery attempts by outcome: succeeded, failed (a retry follows) or dead_letter."}, []string{"namespace", "endpoint", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "webhook", Name: "attempt_duration_seconds",
			Help:    "Latency of delivery attempts, from sending the request to reading the response.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}}, []string{"namespace", "endpoint"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "webhook", Name: "retries_scheduled_total",
			Help: "Retries scheduled."}, []string{"namespace", "endpoint"}),
		deadLetter: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "webhook", Name: "dead_letters_total",
			Help: "Deliveries sent to the dead-letter stream, by reason."}, []string{"namespace", "endpoint", "reason"}),
		circuit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "webhook", Name: "circuit_state",
			Help: "Circuit breaker state: 0 closed, 1 half-open, 2 open."}, []string{"namespace", "endpoint"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "webhook", Name: "consumer_pending",
			Help: "Deliveries waiting: queued, in flight or waiting for a retry."}, []string{"namespace", "endpoint"}),
		disabled: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "webhook", Name: "endpoint_disabled",
			Help: "1 while the endpoint is auto-disabled."}, []string{"namespace", "endpoint"}),
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "webhook", Name: "events_routed_total",
			Help: "Events the router handled."}, []string{"namespace"}),
		fanout: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "webhook", Name: "deliveries_created_total",
			Help: "Deliveries the router wrote, one per matching endpoint."}, []string{"namespace"}),
		rateLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "webhook", Name: "endpoint_rate_limit",
			Help: "Requests per second this replica may send the endpoint now: spec.rateLimit, or less while ramping up after the circuit closed; +Inf when unlimited."}, []string{"namespace", "endpoint"}),
		concLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "webhook", Name: "endpoint_concurrency_limit",
			Help: "Requests this replica may have in flight to the endpoint now: spec.maxInFlight, or less while ramping up after the circuit closed."}, []string{"namespace", "endpoint"}),
	}
	reg.MustRegister(m.deliveries, m.latency, m.retries, m.deadLetter, m.circuit, m.pending, m.disabled, m.routed, m.fanout, m.rateLimit, m.concLimit)
	return m
}

// endpointMetrics are one endpoint's metric handles, looked up once instead of per delivery.
type endpointMetrics struct {
	succeeded, failed, deadLettered prometheus.Counter
	latency                         prometheus.Observer
	retries                         prometheus.Counter
	circuit, pending, disabled      prometheus.Gauge
	rateLimit, concLimit            prometheus.Gauge
	m                               *metrics
	ns, ep                          string
}

func (m *metrics) forEndpoint(ns, ep string) *endpointMetrics {
	return &endpointMetrics{
		succeeded:    m.deliveries.WithLabelValues(ns, ep, "succeeded"),
		failed:       m.deliveries.WithLabelValues(ns, ep, "failed"),
		deadLettered: m.deliveries.WithLabelValues(ns, ep, "dead_letter"),
		latency:      m.latency.WithLabelValues(ns, ep),
		retries:      m.retries.WithLabelValues(ns, ep),
		circuit:      m.circuit.WithLabelValues(ns, ep),
		pending:      m.pending.WithLabelValues(ns, ep),
		disabled:     m.disabled.WithLabelValues(ns, ep),
		rateLimit:    m.rateLimit.WithLabelValues(ns, ep),
		concLimit:    m.concLimit.WithLabelValues(ns, ep),
		m:            m, ns: ns, ep: ep,
	}
}

func (e *endpointMetrics) deadLetterReason(reason string) {
	e.deadLettered.Inc()
	e.m.deadLetter.WithLabelValues(e.ns, e.ep, reason).Inc()
}

// forget removes a deleted endpoint's series.
func (e *endpointMetrics) forget() {
	l := prometheus.Labels{"namespace": e.ns, "endpoint": e.ep}
	e.m.deliveries.DeletePartialMatch(l)
	e.m.latency.DeletePartialMatch(l)
	e.m.retries.DeletePartialMatch(l)
	e.m.deadLetter.DeletePartialMatch(l)
	e.m.circuit.DeletePartialMatch(l)
	e.m.pending.DeletePartialMatch(l)
	e.m.disabled.DeletePartialMatch(l)
	e.m.rateLimit.DeletePartialMatch(l)
	e.m.concLimit.DeletePartialMatch(l)
}
