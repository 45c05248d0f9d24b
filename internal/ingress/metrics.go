package ingress

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the ingress's Prometheus metrics. Namespace labels appear only on events
// JetStream stored (a namespace with an events stream), so callers cannot make series up.
type Metrics struct {
	requests  *prometheus.CounterVec   // route, code
	duration  *prometheus.HistogramVec // route: request to response
	publish   prometheus.Histogram     // publish to acknowledgement
	published *prometheus.CounterVec   // namespace, outcome: stored, duplicate
	rejected  *prometheus.CounterVec   // reason
	inflight  prometheus.Gauge
	authCache *prometheus.CounterVec // result: hit, miss
	body      prometheus.Gauge       // bytes of request bodies held
	conns     prometheus.Gauge       // connections open
	// byRoute caches the handles of (route, code): two routes, a few codes.
	byRoute sync.Map
}

// Reasons an event (or a request) is refused, the label of webhook_ingress_rejected_total.
const (
	RejectUnauthenticated = "unauthenticated"
	RejectForbidden       = "forbidden"
	RejectInvalid         = "invalid"
	RejectTooLarge        = "too_large"
	RejectRateLimited     = "rate_limited"
	RejectOverloaded      = "overloaded"
	RejectNoStream        = "no_stream"
	RejectUnavailable     = "unavailable"
	// RejectConnections counts connections closed at once: over --max-connections or
	// --max-connections-per-client.
	RejectConnections = "connections"
)

// NewMetrics registers the metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	buckets := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "webhook", Subsystem: "ingress", Name: "requests_total",
			Help: "Requests to the ingress by route (events, cloudevents) and status code."}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "webhook", Subsystem: "ingress", Name: "request_duration_seconds",
			Help: "Time from a request's arrival to its response (202 only after JetStream acknowledged every event).", Buckets: buckets}, []string{"route"}),
		publish: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "webhook", Subsystem: "ingress", Name: "publish_duration_seconds",
			Help: "Time from publishing one event to JetStream's acknowledgement.", Buckets: buckets}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "webhook", Subsystem: "ingress", Name: "events_total",
			Help: "Events JetStream acknowledged, by namespace and outcome: stored, or duplicate (the id was already stored)."}, []string{"namespace", "outcome"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "webhook", Subsystem: "ingress", Name: "rejected_total",
			Help: "Events (or whole requests, or connections) refused, by reason: unauthenticated, forbidden, invalid, too_large, rate_limited, overloaded, no_stream, unavailable, connections."}, []string{"reason"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "webhook", Subsystem: "ingress", Name: "requests_in_flight",
			Help: "Requests being handled now (bounded by --max-concurrent-requests)."}),
		authCache: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "webhook", Subsystem: "ingress", Name: "auth_cache_total",
			Help: "Authorization decisions looked up, by result: hit (cached) or miss (a TokenReview and a SubjectAccessReview)."}, []string{"result"}),
		body: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "webhook", Subsystem: "ingress", Name: "body_bytes",
			Help: "Bytes of request bodies held now (bounded by --max-body-bytes-in-flight)."}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "webhook", Subsystem: "ingress", Name: "connections",
			Help: "Connections open now (bounded by --max-connections)."}),
	}
	reg.MustRegister(m.requests, m.duration, m.publish, m.published, m.rejected, m.inflight, m.authCache, m.body, m.conns)
	return m
}

func (m *Metrics) request(route string, code int, seconds float64) {
	if m == nil {
		return
	}
	h := m.handles(route, code)
	h.requests.Inc()
	h.duration.Observe(seconds)
}

// routeHandles are the series of one route and status code, looked up once.
type routeHandles struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

type routeKey struct {
	route string
	code  int
}

func (m *Metrics) handles(route string, code int) routeHandles {
	k := routeKey{route, code}
	if h, ok := m.byRoute.Load(k); ok {
		return h.(routeHandles)
	}
	h := routeHandles{requests: m.requests.WithLabelValues(route, strconv.Itoa(code)), duration: m.duration.WithLabelValues(route)}
	m.byRoute.Store(k, h)
	return h
}

func (m *Metrics) reject(reason string, n int) {
	if m != nil && n > 0 {
		m.rejected.WithLabelValues(reason).Add(float64(n))
	}
}

func (m *Metrics) stored(namespace string, duplicate bool, seconds float64) {
	if m == nil {
		return
	}
	outcome := "stored"
	if duplicate {
		outcome = "duplicate"
	}
	m.published.WithLabelValues(namespace, outcome).Inc()
	m.publish.Observe(seconds)
}

// AuthLookup counts one authorization lookup (Authorizer.Observe).
func (m *Metrics) AuthLookup(hit bool) {
	if m == nil {
		return
	}
	if hit {
		m.authCache.WithLabelValues("hit").Inc()
	} else {
		m.authCache.WithLabelValues("miss").Inc()
	}
}

func (m *Metrics) bodyBytes(delta int64) {
	if m != nil {
		m.body.Add(float64(delta))
	}
}

func (m *Metrics) connections(delta int) {
	if m != nil {
		m.conns.Add(float64(delta))
	}
}
