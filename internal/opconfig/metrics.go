package opconfig

import "github.com/prometheus/client_golang/prometheus"

// NATSConnectedMetric is webhook_nats_connected: 1 while connected reports true, else 0,
// read at every scrape. The controller and every dispatcher register it with the connection
// Connect returned (the NATSUnreachable alert of the chart's PrometheusRule reads it).
func NATSConnectedMetric(connected func() bool) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "webhook", Name: "nats_connected",
		Help: "1 while this process is connected to NATS, 0 while it is not (it reconnects by itself)."},
		func() float64 {
			if connected() {
				return 1
			}
			return 0
		})
}
