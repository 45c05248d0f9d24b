package plugin

import (
	"net/http"
	"testing"
)

// The ingress's client uses no proxy, whatever the environment says (a proxy sees the bearer
// token), unless --ingress-proxy-url names one. (The transport must have no proxy function at
// all: net/http reads HTTPS_PROXY once per process, so setting it here would prove nothing.)
func TestIngressClientUsesNoProxyFromTheEnvironment(t *testing.T) {
	c, err := (&publishOptions{}).httpClient()
	if err != nil {
		t.Fatal(err)
	}
	if c.Transport.(*http.Transport).Proxy != nil {
		t.Error("the ingress's client consults a proxy (http.ProxyFromEnvironment)")
	}
	if c.CheckRedirect == nil {
		t.Error("the ingress's client follows redirects")
	}
	req, _ := http.NewRequest(http.MethodPost, "https://ingress.example.org/v1/namespaces/a/events", nil)
	c, err = (&publishOptions{ingressProxy: "http://named.example.com:8080"}).httpClient()
	if err != nil {
		t.Fatal(err)
	}
	if u, err := c.Transport.(*http.Transport).Proxy(req); err != nil || u == nil || u.Host != "named.example.com:8080" {
		t.Errorf("--ingress-proxy-url: %v (%v)", u, err)
	}
}
