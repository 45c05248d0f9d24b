// Package route turns a namespace's events into deliveries: the route table (event type to
// endpoints), the router that reads the events streams and writes one delivery per matching
// endpoint, the backfill of an endpoint that appeared while events flowed, and the ingest
// checks (an event that cannot become a request is dead-lettered here as invalid_event, so it
// never counts against a receiver).
package route

import (
	"sync/atomic"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
	"github.com/webhook-operator/webhook-operator/internal/match"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// Endpoint is what the router needs of an endpoint it routes to.
type Endpoint struct {
	Config  *endpoint.Config
	Metrics *metrics.Endpoint
	// Dirty is set when a delivery or dead letter was written for it (its pending changed).
	Dirty *atomic.Bool
}

// Table maps an event's namespace and type to the endpoints that receive it. It is built on
// every configuration change and read without locks.
type Table struct {
	byNamespace map[string]*match.Index[string]
	// namespaces whose events streams the router reads: its own first, then its sources.
	namespaces []string
	endpoints  map[string]Endpoint
}

// Build makes the table of the endpoints of a dispatcher in ownNamespace; allowSources says
// whether the installation lets endpoints receive other namespaces' events.
func Build(endpoints map[string]Endpoint, ownNamespace string, allowSources bool) *Table {
	t := &Table{byNamespace: map[string]*match.Index[string]{}, endpoints: endpoints}
	add := func(ns, pattern, ep string) {
		ix := t.byNamespace[ns]
		if ix == nil {
			ix = match.NewIndex[string]()
			t.byNamespace[ns] = ix
		}
		ix.Add(pattern, ep)
	}
	for name, e := range endpoints {
		c := e.Config
		if c.Deleting {
			continue
		}
		for _, p := range c.EventTypes {
			add(ownNamespace, p, name)
			if allowSources {
				for _, src := range c.Sources {
					if src != ownNamespace {
						add(src, p, name)
					}
				}
			}
		}
	}
	others := make([]string, 0, len(t.byNamespace))
	for ns := range t.byNamespace {
		others = append(others, ns)
	}
	t.namespaces = streams.SourceNamespaces(ownNamespace, others)
	return t
}
