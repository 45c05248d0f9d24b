package dispatcher

import (
	"sort"
	"sync"

	"github.com/webhook-operator/webhook-operator/dispatcher/deliver"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/report"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
	"github.com/webhook-operator/webhook-operator/internal/policy"
)

// workers are the endpoints a dispatcher serves, one worker each (report.Endpoints).
type workers struct {
	mu sync.Mutex
	m  map[string]*deliver.Worker
	// elsewhere are the namespace's endpoints another dispatcher serves (dedicated ones).
	elsewhere map[string]bool
	metrics   *metrics.Metrics
	namespace string
}

func newWorkers(m *metrics.Metrics, namespace string) *workers {
	return &workers{m: map[string]*deliver.Worker{}, metrics: m, namespace: namespace}
}

func (ws *workers) get(ep string) *deliver.Worker {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.m[ep]
}

func (ws *workers) has(ep string) bool { return ws.get(ep) != nil }

// servedElsewhere says another dispatcher serves endpoint ep.
func (ws *workers) servedElsewhere(ep string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.elsewhere[ep]
}

func (ws *workers) all() []*deliver.Worker {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	out := make([]*deliver.Worker, 0, len(ws.m))
	for _, w := range ws.m {
		out = append(out, w)
	}
	return out
}

// Names lists the endpoints served, sorted.
func (ws *workers) Names() []string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	out := make([]string, 0, len(ws.m))
	for n := range ws.m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Served returns what the health stage needs of one endpoint.
func (ws *workers) Served(ep string) (report.Served, bool) {
	w := ws.get(ep)
	if w == nil {
		return report.Served{}, false
	}
	return report.Served{Config: w.Config(), Metrics: w.Metrics, Dirty: &w.Dirty, Wake: w.Wake}, true
}

// policyOf is an endpoint's retry policy, the built-in default when it is not served.
func (ws *workers) policyOf(ep string) policy.Policy {
	if w := ws.get(ep); w != nil {
		if c := w.Config(); c != nil {
			return *c.Policy
		}
	}
	return policy.Default()
}
