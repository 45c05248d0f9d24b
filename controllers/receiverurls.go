package controllers

import (
	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
	"github.com/webhook-operator/webhook-operator/internal/egressproxy"
	"github.com/webhook-operator/webhook-operator/internal/netguard"
)

// receiverURLs checks the other URLs an endpoint names under the installation's outbound
// policy, as spec.url is: the token endpoint of spec.auth (https unless the installation
// allows http, and not a refused literal address) and the proxy of spec.proxy (http or https,
// its literal address not refused: a tenant's proxy is a destination like any other). It
// returns the field refused and why. The URL of spec.urlFrom is in a Secret the controller
// does not read: the dispatcher checks it.
func receiverURLs(guard netguard.Policy, spec *v1alpha1.WebhookEndpointSpec) (string, error) {
	if a := spec.Auth; a != nil && a.OAuth2ClientCredentials != nil {
		if err := guard.CheckURL(a.OAuth2ClientCredentials.TokenURL); err != nil {
			return "spec.auth.oauth2ClientCredentials.tokenURL", err
		}
	}
	if p := spec.Proxy; p != nil {
		if _, err := egressproxy.Parse(p.URL); err != nil {
			return "spec.proxy.url", err
		}
		// The tunnel carries TLS to an https receiver whatever the proxy's own scheme.
		plain := guard
		plain.AllowHTTP = true
		if err := plain.CheckURL(p.URL); err != nil {
			return "spec.proxy.url", err
		}
	}
	return "", nil
}
