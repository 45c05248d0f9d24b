package deliver

import (
	"net/http"
	"time"

	"github.com/webhook-operator/webhook-operator/dispatcher/attempt"
	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
)

// madeClient is a worker's HTTP client and the configuration it was made for.
type madeClient struct {
	c    *http.Client
	made *endpoint.Config
}

// fits says whether the client serves configuration c as one made for c would.
func (h *madeClient) fits(c *endpoint.Config) bool {
	return h.made == c || endpoint.SameTransport(h.made, c)
}

// httpClient is the client of the worker's current configuration (c, the attempt's, while it
// has none), made when first needed: an idle endpoint has no transport. A client made for an
// earlier configuration is replaced, its idle connections closed once in-flight requests end.
func (w *Worker) httpClient(c *endpoint.Config) *http.Client {
	for {
		cur := w.cfg.Load()
		if cur == nil {
			cur = c
		}
		h := w.client.Load()
		if h != nil && h.fits(cur) {
			return h.c
		}
		n := &madeClient{c: attempt.NewClient(attempt.NewTransport(w.f.Settings.Guard, cur.Proxy, cur.MaxInFlight, cur.TLS)), made: cur}
		if w.client.CompareAndSwap(h, n) {
			if h != nil {
				time.AfterFunc(cur.Timeout+time.Second, h.c.CloseIdleConnections)
			}
			return n.c
		}
	}
}
