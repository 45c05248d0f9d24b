package controllers

import (
	"context"
	"fmt"
)

// The dispatchers run in tenants' namespaces, as ServiceAccounts a tenant may run pods of its
// own as; so their secure metrics (--metrics-secure) know scrapers without the API server:
// mutual TLS with the installation's scraper CA (metricsauth.ClientCertServerOptions). The
// CA's certificate, public, comes from --dispatcher-metrics-ca-secret
// (Options.DispatcherMetricsCA), a Secret of the controller's namespace; the controller
// mirrors its ca.crt, and nothing else, into each dispatcher namespace as
// names.MetricsCASecret, mounted at metricsCAMountPath. The scraper's client certificate and
// key never leave the namespace of the scraper. A dispatcher's ServiceAccount holds no
// TokenReview or SubjectAccessReview grant.

// Where a dispatcher reads the scraper CA, and the one key mirrored.
const (
	metricsCAMountPath = "/etc/webhook-operator/metrics-ca"
	metricsCAKey       = "ca.crt"
)

// metricsCA reads the scraper CA's certificate from --dispatcher-metrics-ca-secret, again only
// when its resourceVersion changed; nil when metrics are not secure or no such Secret is
// configured (the controller's command refuses secure metrics without one; a dispatcher
// refuses them without its CA file). A missing Secret, or one without ca.crt, is an error:
// the dispatchers could not serve their metrics.
func (r *DispatcherReconciler) metricsCA(ctx context.Context) (*mirror, error) {
	key := r.Options.DispatcherMetricsCA
	if !r.Options.Config.MetricsSecure || key.Name == "" {
		return nil, nil
	}
	m, err := r.readMirror(ctx, key, &r.scrapCA, func(data map[string][]byte) map[string][]byte {
		if v, ok := data[metricsCAKey]; ok {
			return map[string][]byte{metricsCAKey: v}
		}
		return map[string][]byte{}
	})
	if err != nil {
		return nil, fmt.Errorf("the scraper CA Secret %s (--dispatcher-metrics-ca-secret): %w", key, err)
	}
	if !m.has(metricsCAKey) {
		return nil, fmt.Errorf("the scraper CA Secret %s (--dispatcher-metrics-ca-secret) has no %s", key, metricsCAKey)
	}
	return m, nil
}
