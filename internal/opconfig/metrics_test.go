package opconfig

import (
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNATSConnectedMetric(t *testing.T) {
	var up atomic.Bool
	reg := prometheus.NewRegistry()
	reg.MustRegister(NATSConnectedMetric(up.Load))
	for _, want := range []bool{false, true, false} {
		up.Store(want)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		if len(mfs) != 1 || mfs[0].GetName() != "webhook_nats_connected" || len(mfs[0].GetMetric()) != 1 {
			t.Fatalf("gathered %v, want one series of webhook_nats_connected", mfs)
		}
		got := mfs[0].GetMetric()[0].GetGauge().GetValue()
		if (got == 1) != want || (got != 0 && got != 1) {
			t.Errorf("connected=%v: webhook_nats_connected %v", want, got)
		}
	}
}
