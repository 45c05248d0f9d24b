package ingress_test

import (
	"testing"
	"time"

	"github.com/webhook-operator/webhook-operator/internal/ingress"
)

// A namespace's own rate (its WebhookQuota's share) replaces the replica's default there and
// follows a change; other namespaces keep the default.
func TestRateLimiterTakesANamespacesOwnRate(t *testing.T) {
	rates := map[string][2]float64{"limited": {1, 2}}
	l := &ingress.RateLimiter{Namespace: func(ns string) (float64, int, bool) {
		r, ok := rates[ns]
		return r[0], int(r[1]), ok
	}}
	now := time.Now()
	for i := range 2 {
		if ok, _ := l.Reserve("limited", 1, now); !ok {
			t.Fatalf("event %d of the burst refused", i+1)
		}
	}
	ok, wait := l.Reserve("limited", 1, now)
	if ok || wait <= 0 {
		t.Errorf("a publish over the namespace's rate: ok %v, retry after %s", ok, wait)
	}
	for range 100 {
		if ok, _ := l.Reserve("free", 1, now); !ok {
			t.Fatal("a namespace without a rate was limited")
		}
	}
	if r, b := l.Limits("limited"); r != 1 || b != 2 {
		t.Errorf("limits %v %d", r, b)
	}
	rates["limited"] = [2]float64{1000, 1000}
	l.Reserve("limited", 1, now) // the new rate is in force from here
	if ok, _ := l.Reserve("limited", 50, now.Add(100*time.Millisecond)); !ok {
		t.Error("a raised rate is not in force: 50 events 100ms later at 1000/s refused")
	}
}
