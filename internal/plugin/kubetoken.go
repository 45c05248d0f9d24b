package plugin

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"k8s.io/client-go/rest"
)

// roundTripperFunc is an http.RoundTripper.
type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// KubeBearerToken returns the bearer token client-go would send to the API server for cfg's
// user: a static token, a token file, or what an exec or auth-provider plugin yields. It is
// empty when the user authenticates otherwise (a client certificate). Nothing is sent: the
// request stops at the innermost transport, after every authentication wrapper ran.
func KubeBearerToken(ctx context.Context, cfg *rest.Config) (string, error) {
	cfg = rest.CopyConfig(cfg)
	var header string
	cfg.Wrap(func(http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			header = r.Header.Get("Authorization")
			return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
		})
	})
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return "", fmt.Errorf("the kubeconfig's credentials: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/version", nil)
	if err != nil {
		return "", err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return "", fmt.Errorf("the kubeconfig's credentials: %w", err)
	}
	_ = resp.Body.Close()
	token, ok := strings.CutPrefix(header, "Bearer ")
	if !ok {
		return "", nil
	}
	return strings.TrimSpace(token), nil
}
