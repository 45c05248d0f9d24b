// Package report says what an endpoint's health is, to whom needs to know: the status writer
// (StatusWriter: status.health and the Disabled and CircuitOpen conditions, written by the
// holder of the endpoint's partition), the announcer of operational events (Announcer: the
// outboxes of the endpoints' states published to the events stream), and the Kubernetes
// Events of transitions (Events). The endpoints reported on are the consumer's interface
// (Endpoints), and so is the shared state they are read from.
package report

import (
	"sync/atomic"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
)

// Served is what the health stage needs of one endpoint a dispatcher serves.
type Served struct {
	Config  *endpoint.Config
	Metrics *metrics.Endpoint
	// Dirty is set when the endpoint's counts or pending changed (the worker marks the
	// endpoint then too, see StatusWriter.Mark); the writer clears it.
	Dirty *atomic.Bool
	// Wake tells the endpoint's worker to look at its state again.
	Wake func()
}

// Endpoints are the endpoints a dispatcher serves.
type Endpoints interface {
	// Names lists them, sorted.
	Names() []string
	// Served returns one, or false when it is not served (any more).
	Served(ep string) (Served, bool)
}
