// Package metricsauth is how the controller and every dispatcher serve /metrics: as kubebuilder
// v4 scaffolds it, over HTTPS, authenticated with a TokenReview of the scraper's bearer token
// and authorized with a SubjectAccessReview of `get` on the /metrics non-resource URL
// (controller-runtime's filters.WithAuthenticationAndAuthorization). A scraper needs a token
// whose identity is bound to a ClusterRole with that rule (the chart's metrics-reader), and
// the serving process needs to create TokenReviews and SubjectAccessReviews.
package metricsauth

import (
	"crypto/tls"

	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// ServerOptions are the metrics server options for addr ("0" disables the server). With
// secure, the server speaks HTTPS with a self-signed certificate (generated in memory, so a
// read-only root filesystem is fine; scrapers skip its verification or trust it otherwise),
// HTTP/1.1 only (HTTP/2's rapid-reset and stream attacks, as kubebuilder disables it), and
// every request must carry a bearer token allowed to get /metrics. Without secure it is plain
// HTTP open to whoever reaches the port: for the local stack, or behind a NetworkPolicy.
func ServerOptions(addr string, secure bool) metricsserver.Options {
	o := metricsserver.Options{BindAddress: addr}
	if secure {
		o.SecureServing = true
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
		o.TLSOpts = []func(*tls.Config){func(c *tls.Config) {
			c.NextProtos = []string{"http/1.1"}
			c.MinVersion = tls.VersionTLS12
		}}
	}
	return o
}
