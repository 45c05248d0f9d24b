package deliver

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/webhook-operator/webhook-operator/dispatcher/endpoint"
	"github.com/webhook-operator/webhook-operator/dispatcher/health/state"
	"github.com/webhook-operator/webhook-operator/dispatcher/metrics"
	"github.com/webhook-operator/webhook-operator/internal/policy"
	"github.com/webhook-operator/webhook-operator/internal/streams"
)

// A new configuration that changes where the endpoint's pending count is read (its lane, or
// the consumers of its own it drains) marks its status dirty, so the status is written again
// though no delivery happened. Before, an upgraded endpoint whose drained consumers were
// deleted kept the pending count they had last shown (42 in make test-cluster's upgrade step)
// until the hourly refresh.
func TestAChangeOfLaneOrDrainingConsumersWritesTheStatusAgain(t *testing.T) {
	var dirtied []string
	f := &Factory{
		Settings: Settings{Streams: streams.DefaultConfig(), Names: streams.DefaultNames().For("shop")},
		Watchers: Watchers{Dirtied: func(ep string) { dirtied = append(dirtied, ep) }},
		Health:   noHealth{},
		Lease:    wholeLease{},
	}
	w := f.NewWorker("orders", metrics.New(prometheus.NewRegistry()).Endpoint("shop", "orders"))
	since := time.Now()
	own := []string{"WEBHOOKS_shop/ep_shop_orders", "WEBHOOKS_DELIVERIES_shop/ep_shop_orders"}
	retry := policy.Default()
	base := endpoint.Config{Generation: 1, Lane: streams.LaneOwn, Timeout: time.Second, Policy: &retry}
	steps := []struct {
		what  string
		with  func(*endpoint.Config)
		dirty bool
	}{
		{"first configuration", func(*endpoint.Config) {}, false},
		{"the same again, a later generation", func(c *endpoint.Config) { c.Generation = 2 }, false},
		{"onto the shared lane, draining its own consumers", func(c *endpoint.Config) {
			c.Lane, c.SharedSince, c.Draining = streams.LaneShared, since, own
		}, true},
		{"one of them drained and deleted", func(c *endpoint.Config) {
			c.Lane, c.SharedSince, c.Draining = streams.LaneShared, since, own[1:]
		}, true},
		{"the other too", func(c *endpoint.Config) { c.Lane, c.SharedSince = streams.LaneShared, since }, true},
		{"nothing of the lane changed", func(c *endpoint.Config) { c.Lane, c.SharedSince, c.Generation = streams.LaneShared, since, 3 }, false},
	}
	for _, s := range steps {
		c := base
		s.with(&c)
		w.Dirty.Store(false)
		dirtied = nil
		w.Configure(&c)
		if got := w.Dirty.Load(); got != s.dirty || s.dirty != slices.Equal(dirtied, []string{"orders"}) {
			t.Errorf("%s: dirty %v, told %v; want dirty %v", s.what, got, dirtied, s.dirty)
		}
	}
}

// noHealth is the health of endpoints that never delivered (Configure reads only that).
type noHealth struct{ Health }

func (noHealth) Snapshot(string) state.State { return state.State{} }

// wholeLease is a single replica's: it holds every endpoint.
type wholeLease struct{}

func (wholeLease) Holds(string) bool             { return true }
func (wholeLease) Share(_ string, limit int) int { return limit }
