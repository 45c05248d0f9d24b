package controllers

import (
	"testing"

	v1alpha1 "github.com/webhook-operator/webhook-operator/api/v1alpha1"
)

// A WebhookReplay writes deliveries within its namespace's publish rate: the quota's
// eventsPerSecond covers what tenants write, replays included.
func TestReplayRateIsWithinTheQuotasPublishRate(t *testing.T) {
	i32 := func(v int32) *int32 { return &v }
	replayAt := func(r *int32) *v1alpha1.WebhookReplay {
		return &v1alpha1.WebhookReplay{Spec: v1alpha1.WebhookReplaySpec{RatePerSecond: r}}
	}
	rated := &v1alpha1.WebhookQuota{Spec: v1alpha1.WebhookQuotaSpec{EventsPerSecond: i32(20)}}
	unrated := &v1alpha1.WebhookQuota{Spec: v1alpha1.WebhookQuotaSpec{MaxEndpoints: i32(5)}}
	for _, tc := range []struct {
		name   string
		replay *v1alpha1.WebhookReplay
		quota  *v1alpha1.WebhookQuota
		want   int
	}{
		{"no rate, no quota", replayAt(nil), nil, 0},
		{"its own rate", replayAt(i32(50)), nil, 50},
		{"a quota without a rate", replayAt(i32(50)), unrated, 50},
		{"no rate of its own: the quota's", replayAt(nil), rated, 20},
		{"above the quota's: the quota's", replayAt(i32(50)), rated, 20},
		{"below the quota's: its own", replayAt(i32(5)), rated, 5},
	} {
		if got := replayRate(tc.replay, tc.quota); got != tc.want {
			t.Errorf("%s: %d deliveries a second, want %d", tc.name, got, tc.want)
		}
	}
}
