package console

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/webhook-operator/webhook-operator/api/data/v1alpha1"
)

func delivery(state datav1alpha1.DeliveryState, at time.Time, latency time.Duration) datav1alpha1.WebhookDelivery {
	us := latency.Microseconds()
	return datav1alpha1.WebhookDelivery{Status: datav1alpha1.WebhookDeliveryStatus{State: state, Time: metav1.NewMicroTime(at), LatencyMicroseconds: &us}}
}

// The chart's slots: each read once, a few at once, bounded per slot (a slot holding more is
// marked capped), a delivery counted in the slot of its latest outcome (succeeded; retrying
// and dead-lettered as failures; queued and in flight not at all), a slot that cannot be
// read marked while the others are drawn, and percentiles within the histogram's 19%.
func TestTimelineSlots(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 7, 0, 0, time.UTC)
	tl := newTimeline(chartWindows[1], now) // 6h, 24 slots of 15 minutes
	if want := time.Date(2026, 12, 6, 6, 15, 0, 0, time.UTC); !tl.Start.Equal(want) || tl.Step != 15*time.Minute || len(tl.Slots) != 24 {
		t.Fatalf("the 6h window starts %s with %s slots (%d), want %s", tl.Start, tl.Step, len(tl.Slots), want)
	}
	all := []datav1alpha1.WebhookDelivery{
		delivery(datav1alpha1.StateSucceeded, now.Add(-2*time.Minute), 10*time.Millisecond),
		delivery(datav1alpha1.StateRetryScheduled, now.Add(-time.Minute), 100*time.Millisecond),
		delivery(datav1alpha1.StateQueued, now.Add(-time.Minute), 0),
		delivery(datav1alpha1.StateInFlight, now.Add(-time.Minute), 0),
		delivery(datav1alpha1.StateDeadLettered, time.Date(2026, 12, 6, 6, 20, 0, 0, time.UTC), time.Second),
		delivery(datav1alpha1.StateSucceeded, now.Add(-7*time.Hour), time.Millisecond), // before the window
	}
	for i := 0; i < perSlot+10; i++ { // more than a slot reads, at 09:00-09:15
		all = append(all, delivery(datav1alpha1.StateSucceeded, time.Date(2026, 12, 6, 9, 1, 0, i, time.UTC), time.Duration(i+1)*time.Millisecond))
	}
	var calls, inFlight, most atomic.Int32
	err := tl.fill(context.Background(), func(_ context.Context, from, until time.Time, limit int) ([]datav1alpha1.WebhookDelivery, bool, error) {
		calls.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		if from.Hour() == 7 && from.Minute() == 0 {
			return nil, false, errors.New("the data API is down")
		}
		var out []datav1alpha1.WebhookDelivery
		for _, d := range all {
			if at := d.Status.Time.Time; !at.Before(from) && at.Before(until) {
				if len(out) == limit {
					return out, true, nil
				}
				out = append(out, d)
			}
		}
		return out, false, nil
	})
	if err == nil || !strings.Contains(err.Error(), "down") {
		t.Errorf("fill returned %v, want the slot's error", err)
	}
	if calls.Load() != 24 || most.Load() > chartReads {
		t.Errorf("%d reads, %d at once; want 24, at most %d", calls.Load(), most.Load(), chartReads)
	}
	last, first, nine, seven := tl.Slots[23], tl.Slots[0], tl.Slots[11], tl.Slots[3]
	if last.Succeeded != 1 || last.Failed != 1 || last.samples != 2 || first.Failed != 1 || first.Succeeded != 0 {
		t.Errorf("the last slot %+v, the first %+v", last, first)
	}
	if nine.Succeeded != perSlot || !nine.Capped || !seven.Unread || tl.Slots[10].Capped {
		t.Errorf("the 09:00 slot: %d succeeded, capped %v; 07:00 unread %v", nine.Succeeded, nine.Capped, seven.Unread)
	}
	v := tl.view()
	if v.Succeeded != perSlot+1 || v.Failed != 2 || !v.Capped || len(v.Bars) != 24 || v.CountMax != "500" || v.P95Line == "" {
		t.Errorf("the view: %d succeeded, %d failed, capped %v, %d bars, max %s", v.Succeeded, v.Failed, v.Capped, len(v.Bars), v.CountMax)
	}
	if b := v.Bars[11]; math.Abs(b.OKH-(plotBottom-plotTop)) > 0.01 || !b.Capped || !strings.Contains(b.Title, "500 delivered, 0 failed or more") {
		t.Errorf("the tallest bar: %+v", b)
	}
	if b := v.Bars[23]; math.Abs(b.OKH-float64(plotBottom-plotTop)/500) > 0.01 || math.Abs(b.FailH-b.OKH) > 0.01 || math.Abs(b.FailY-(plotBottom-b.FailH)) > 0.01 {
		t.Errorf("the last bar: %+v", b)
	}
	// The newest 500 of 09:00-09:15 are 11..510 ms: p50 about 260 ms, p95 about 485 ms.
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 260 * time.Millisecond}, {0.95, 485 * time.Millisecond}} {
		if got := nine.percentile(c.p); math.Abs(float64(got-c.want)) > 0.19*float64(c.want) {
			t.Errorf("p%.0f = %s, want %s within 19%%", 100*c.p, got, c.want)
		}
	}
}
